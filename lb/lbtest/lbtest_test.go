package lbtest

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// leastPicker is the smallest picker that conforms: least in flight among
// the present replicas not unavailable, no queue, no health. The suite runs
// against it to show that what it asks is no more than the contract.
type leastPicker struct {
	mu       sync.Mutex
	present  []string
	inFlight map[string]int
	turn     int
	setting  int
	bug      string // a deliberate fault (see TestSuiteCatchesFaults)
}

type leastLease struct {
	p        *leastPicker
	addr     string
	released atomic.Bool
}

func (p *leastPicker) SetReplicas(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bug == "keeps-removed" {
		for _, a := range addrs {
			if !slices.Contains(p.present, a) {
				p.present = append(p.present, a)
			}
		}
		return
	}
	p.present = slices.Clone(addrs)
}

func (p *leastPicker) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.present) == 0 {
		return nil, lb.ErrNoBackends
	}
	best := ""
	p.turn++
	for i := range p.present {
		a := p.present[(p.turn+i)%len(p.present)]
		if req.IsUnavailable(a) && p.bug != "ignores-unavailable" {
			continue
		}
		if slices.Contains(req.Avoid, a) && p.bug != "ignores-avoid" {
			continue
		}
		if best == "" || p.inFlight[a] < p.inFlight[best] {
			best = a
		}
	}
	if best == "" {
		return nil, lb.ErrAllDown
	}
	p.inFlight[best]++
	if p.bug != "says-no-reason" {
		req.Reason = lb.ReasonLeastLoad
	}
	return &leastLease{p: p, addr: best}, nil
}

func (p *leastPicker) InFlight() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for a, n := range p.inFlight {
		if n > 0 {
			out[a] = n
		}
	}
	return out
}

func (l *leastLease) Replica() string { return l.addr }

func (l *leastLease) Release(o lb.Outcome) bool {
	if !l.released.CompareAndSwap(false, true) {
		return l.p.bug == "releases-twice"
	}
	if l.p.bug == "leaks-cancelled" && o.Kind == lb.Cancelled {
		return true
	}
	l.p.mu.Lock()
	l.p.inFlight[l.addr]--
	l.p.mu.Unlock()
	return true
}

func TestReferencePickerConforms(t *testing.T) {
	Run(t, Subject{
		New: func(t *testing.T) lb.Picker {
			return &leastPicker{inFlight: map[string]int{}, bug: os.Getenv("LBTEST_FAULT")}
		},
		Reconfigure: func(t *testing.T, p lb.Picker) {
			lp := p.(*leastPicker)
			lp.mu.Lock()
			lp.setting = 7
			lp.mu.Unlock()
		},
		Applied: func(p lb.Picker) bool {
			lp := p.(*leastPicker)
			lp.mu.Lock()
			defer lp.mu.Unlock()
			return lp.setting == 7
		},
	})
}

// The suite fails a picker with any one of these faults: each run of the
// reference picker with a fault injected must fail.
func TestSuiteCatchesFaults(t *testing.T) {
	if os.Getenv("LBTEST_FAULT") != "" {
		t.Skip("inside a fault run")
	}
	for _, fault := range []string{"keeps-removed", "ignores-unavailable", "ignores-avoid", "releases-twice", "leaks-cancelled", "says-no-reason"} {
		t.Run(fault, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestReferencePickerConforms$", "-test.count=1")
			cmd.Env = append(os.Environ(), "LBTEST_FAULT="+fault)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a picker that %s:\n%s", fault, out)
			}
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatal(err)
			}
		})
	}
}
