package flow

import (
	"cmp"
	"slices"

	"github.com/sluice-router/sluice/flow/policies"
)

// Snapshot is a consistent view of a controller, for health output and
// metrics.
type Snapshot struct {
	Queued     int
	Bytes      int64
	InFlight   InFlight
	Saturation float64
	Saturated  bool
	Closed     bool
	Counters   Counters
	Bands      []BandSnapshot // highest priority first
}

// BandSnapshot is one priority band; Flows lists its backlogged flows,
// sorted by id.
type BandSnapshot struct {
	Priority int
	Name     string
	Queued   int
	Bytes    int64
	// MaxRequests is the band's queue limit now (a default one follows
	// the pool's capacity).
	MaxRequests int64
	Flows       []FlowSnapshot
}

// FlowSnapshot is one flow's queue, broken down by model for the metrics'
// model_name and target_model_name labels.
type FlowSnapshot struct {
	ID     string
	Queued int
	Bytes  int64
	Models []ModelSnapshot
}

// ModelSnapshot counts a flow's queued requests for one model pair.
type ModelSnapshot struct {
	Model, TargetModel string
	Queued             int
	Bytes              int64
}

// Snapshot walks every queued request, so it costs O(queued): fine at
// scrape time, not for the request path.
func (c *Controller) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	sat := c.askLocked().Load
	s := Snapshot{
		Queued: c.queued, Bytes: c.bytes, InFlight: c.inFlight,
		Saturation: sat, Saturated: saturated(sat), Closed: c.closed, Counters: c.counters,
	}
	for _, b := range c.bands {
		bs := BandSnapshot{Priority: b.cfg.Priority, Name: b.cfg.Name, Queued: b.queued, Bytes: b.bytes,
			MaxRequests: c.bandLimitLocked(b)}
		for id, q := range b.flows {
			bs.Flows = append(bs.Flows, flowSnapshot(id, q))
		}
		slices.SortFunc(bs.Flows, func(x, y FlowSnapshot) int { return cmp.Compare(x.ID, y.ID) })
		s.Bands = append(s.Bands, bs)
	}
	return s
}

func flowSnapshot(id string, q *policies.Queue) FlowSnapshot {
	f := FlowSnapshot{ID: id}
	byModel := map[[2]string]int{}
	q.Each(func(it *policies.Item) {
		r := &it.Value.(*waiter).req
		f.Queued++
		f.Bytes += r.Bytes
		k := [2]string{r.Model, r.TargetModel}
		i, ok := byModel[k]
		if !ok {
			i = len(f.Models)
			byModel[k] = i
			f.Models = append(f.Models, ModelSnapshot{Model: r.Model, TargetModel: r.TargetModel})
		}
		f.Models[i].Queued++
		f.Models[i].Bytes += r.Bytes
	})
	slices.SortFunc(f.Models, func(x, y ModelSnapshot) int {
		return cmp.Or(cmp.Compare(x.Model, y.Model), cmp.Compare(x.TargetModel, y.TargetModel))
	})
	return f
}
