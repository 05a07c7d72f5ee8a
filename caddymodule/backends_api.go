package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/internal/version"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/loadaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/qll"
	"github.com/sluice-router/sluice/lb/tracker"
)

// The backend-set and health operations, shared by the custom_router
// handler (on the listener port, as the HF platform calls it) and the
// admin API module.

// maxAPIBody bounds set-backends bodies: thousands of URLs fit.
const maxAPIBody = 1 << 20

type setBackendsRequest struct {
	Backends *[]string `json:"backends"`
}

// readSetBackends decodes and validates a set-backends body; the error
// message is what the client gets with 400.
// allowed (if not nil) further restricts each backend.
func readSetBackends(w http.ResponseWriter, r *http.Request, allowed func(lb.Backend) error) ([]lb.Backend, int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAPIBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxAPIBody)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading body: %v", err)
	}
	var req setBackendsRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("body must be JSON {\"backends\": [\"http://host:port\", ...]}: %v", err)
	}
	if dec.More() {
		return nil, http.StatusBadRequest, errors.New("trailing data after the JSON object")
	}
	if req.Backends == nil {
		return nil, http.StatusBadRequest, errors.New(`missing "backends" (use [] for no backends)`)
	}
	bs, err := lb.ParseBackends(*req.Backends)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	for i, b := range bs {
		err := refuseOwnAddress(b, r)
		if err == nil && allowed != nil {
			err = allowed(b)
		}
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("backends[%d]: %w", i, err)
		}
	}
	return bs, http.StatusOK, nil
}

// applyBackends makes bs the pool's set, persists it and logs the change.
//
// Every change of a set goes through setsMu, held across the change and
// its file write: two changes (a set-backends racing an add_worker) must
// not leave the file with the older set, nor an add_worker's
// read-modify-write lose a set-backends.
func applyBackends(name string, bs []lb.Backend, log *zap.Logger) (added, removed []string) {
	setsMu.Lock()
	defer setsMu.Unlock()
	return applyBackendsLocked(name, bs, log)
}

var setsMu sync.Mutex

func applyBackendsLocked(name string, bs []lb.Backend, log *zap.Logger) (added, removed []string) {
	added, removed = lb.GetPool(name).Set(bs)
	persistPool(name, bs, log)
	log.Info("backend set replaced", zap.String("pool", name), zap.Int("backends", len(bs)),
		zap.Strings("added", added), zap.Strings("removed", removed))
	return added, removed
}

func serveSetBackends(w http.ResponseWriter, r *http.Request, name string, allowed func(lb.Backend) error, log *zap.Logger) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	bs, status, err := readSetBackends(w, r, allowed)
	if err != nil {
		log.Warn("set-backends rejected; previous set kept", zap.String("pool", name), zap.Error(err))
		writeJSONError(w, status, "invalid_request", err.Error())
		return
	}
	added, removed := applyBackends(name, bs, log)
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "pool": name, "backends": urls(bs),
		"added": nonNil(added), "removed": nonNil(removed)})
}

// healthReport is the JSON body of GET /_custom_router/health.
type healthReport struct {
	OK   bool   `json:"ok"`
	Pool string `json:"pool"`
	// Version is Sluice's release version (internal/version).
	Version    string          `json:"version"`
	Managed    bool            `json:"backends_set"`
	QueueDepth int             `json:"queue_depth"`
	Backends   []backendHealth `json:"backends"`
	// Settings maps each Sluice module serving the pool to the settings
	// its shared state runs with now (what the last loaded config gave).
	Settings map[string]any `json:"settings,omitempty"`
}

// sluiceModules are the modules whose shared state a pool may have.
var sluiceModules = []string{"queued_least_latency", "cache_aware", "load_aware", "global_redis_least", "flow_control"}

type backendHealth struct {
	Addr        string  `json:"addr"`
	URL         string  `json:"url,omitempty"`
	EWMALatency float64 `json:"ewma_latency"`
	Tried       bool    `json:"tried"`
	InFlight    int     `json:"in_flight"`
	// Parallelism is what queued_least_latency takes the replica to serve
	// at once (configured, or learned with parallelism auto).
	Parallelism int    `json:"parallelism,omitempty"`
	Down        bool   `json:"down"`
	Draining    bool   `json:"draining,omitempty"`
	Dispatched  uint64 `json:"dispatched"`
	Failures    uint64 `json:"failures"`
	// The replica's own metrics, when a load_aware policy scrapes them.
	Metrics *replicaMetrics `json:"metrics,omitempty"`
}

type replicaMetrics struct {
	Freshness    string   `json:"freshness"`
	Waiting      *float64 `json:"waiting,omitempty"`
	Running      *float64 `json:"running,omitempty"`
	KVCacheUsage *float64 `json:"kv_cache_usage,omitempty"`
	AgeSeconds   *float64 `json:"age_seconds,omitempty"`
	Error        string   `json:"error,omitempty"`
}

func health(name string) healthReport {
	set, managed := lb.GetPool(name).Backends()
	rep := healthReport{OK: true, Pool: name, Version: version.Version, Managed: managed, Backends: []backendHealth{}, Settings: map[string]any{}}
	for _, m := range sluiceModules {
		if st := liveState(m, name); st != nil {
			rep.Settings[m] = st.Settings()
		}
	}
	stats := map[string]backendHealth{}
	var draining []backendHealth
	if s, ok := pickersOf[*qll.State]("queued_least_latency")[name]; ok {
		snap := s.Snapshot()
		rep.QueueDepth = snap.QueueDepth
		for _, r := range snap.Replicas {
			bh := backendHealth{Addr: r.Addr, EWMALatency: r.EWMASeconds, Tried: r.Tried, InFlight: r.InFlight,
				Parallelism: r.Parallelism, Down: r.Down, Dispatched: r.Dispatched, Failures: r.Failures, Draining: !r.Present}
			if r.Present {
				stats[r.Addr] = bh
			} else {
				draining = append(draining, bh)
			}
		}
	} else if tr := trackerFor(name); tr != nil {
		for _, r := range tr.Snapshot() {
			bh := backendHealth{Addr: r.Addr, InFlight: r.InFlight, Down: r.Down, Failures: r.Failures, Draining: !r.Present}
			if r.Present {
				stats[r.Addr] = bh
			} else {
				draining = append(draining, bh)
			}
		}
	} else if st, ok := liveState("global_redis_least", name).(*policyState); ok {
		for addr, n := range st.picker.InFlight() {
			stats[addr] = backendHealth{Addr: addr, InFlight: n}
		}
	}
	for _, b := range set {
		bh, ok := stats[b.Dial]
		if !ok {
			bh = backendHealth{Addr: b.Dial}
		}
		bh.URL = b.URL
		rep.Backends = append(rep.Backends, bh)
	}
	rep.Backends = append(rep.Backends, draining...)
	if sc := scraperFor(name); sc != nil {
		for i := range rep.Backends {
			smp, fr := sc.Get(rep.Backends[i].Addr)
			m := &replicaMetrics{Freshness: fr.String()}
			if smp.Have.Waiting {
				m.Waiting = &smp.Waiting
			}
			if smp.Have.Running {
				m.Running = &smp.Running
			}
			if smp.Have.KVCache {
				m.KVCacheUsage = &smp.KVCacheUsage
			}
			if !smp.At.IsZero() {
				age := time.Since(smp.At).Seconds()
				m.AgeSeconds = &age
			}
			if smp.Err != nil {
				m.Error = smp.Err.Error()
			}
			rep.Backends[i].Metrics = m
		}
	}
	return rep
}

// trackerFor returns the in-flight tracker of a pool served by cache_aware
// or load_aware, or nil.
func trackerFor(name string) *tracker.Tracker {
	if pk, ok := pickersOf[*cacheaware.Picker]("cache_aware")[name]; ok {
		return pk.Tracker()
	}
	if pk, ok := pickersOf[*loadaware.Picker]("load_aware")[name]; ok {
		return pk.Tracker()
	}
	return nil
}

// scraperFor returns the replica-metrics scraper of a pool served by
// load_aware, or nil.
func scraperFor(name string) *modelmetrics.Scraper {
	if pk, ok := pickersOf[*loadaware.Picker]("load_aware")[name]; ok {
		return pk.Scraper()
	}
	return nil
}

func serveHealth(w http.ResponseWriter, r *http.Request, name string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	writeJSON(w, http.StatusOK, health(name))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func urls(bs []lb.Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.URL
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
