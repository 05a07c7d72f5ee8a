package caddymodule

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb"
)

// Every parser of outside input is fuzzed: a hostile input gets an error,
// never a panic, and what is accepted is well-formed. CI runs each target
// briefly (scripts/test.sh); the corpora under testdata/fuzz are seeds.

func FuzzSetBackendsBody(f *testing.F) {
	for _, s := range []string{`{"backends":["http://127.0.0.1:8001"]}`, `{"backends":[]}`, `{}`, `not json`,
		`{"backends":["http://[::1]:1","https://a.b:443/"]}`, `{"backends":["http://169.254.169.254:80"]}`, `{"backends":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/_custom_router/set-backends", bytes.NewReader(body))
		bs, status, err := readSetBackends(w, r, nil)
		switch {
		case err == nil && status != http.StatusOK:
			t.Fatalf("no error but status %d", status)
		case err != nil && status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge:
			t.Fatalf("error %v with status %d", err, status)
		}
		for _, b := range bs {
			again, err := lb.ParseBackend(b.URL)
			if err != nil || again != b {
				t.Fatalf("accepted %+v does not parse back: %+v %v", b, again, err)
			}
		}
	})
}

func FuzzTrustedFlowHeaders(f *testing.F) {
	f.Add("tenant-a", "premium", "250")
	f.Add("t\xff", "", "1e308")
	f.Add(strings.Repeat("x", 200), "batch", "NaN")
	f.Add("", "unknown", "-5")
	objectives := flow.Objectives{"premium": 10, "batch": -10}
	f.Fuzz(func(t *testing.T, id, objective, slo string) {
		h := http.Header{}
		h.Set(headerFairnessID, id)
		h.Set(headerObjective, objective)
		h.Set(headerSLOTTFT, slo)
		req, err := trustedFlowHeaders(h, objectives)
		if err != nil {
			return
		}
		if !utf8.ValidString(req.FlowID) || len(req.FlowID) > flow.MaxLabelBytes {
			t.Fatalf("accepted fairness id %q", req.FlowID)
		}
		if req.SLOTTFT < 0 || req.SLOTTFT > maxSLOTTFT {
			t.Fatalf("SLO %v out of range from %q", req.SLOTTFT, slo)
		}
	})
}

// FuzzCaddyfileOptions feeds every Sluice directive and policy arbitrary
// option lines: an error names the module, nothing panics, and whatever
// parses also survives Validate without panicking.
func FuzzCaddyfileOptions(f *testing.F) {
	for _, s := range []string{"pool p\nparallelism 8", "scorer active_tokens 2", "band 5 {\nfairness round_robin\n}",
		"redis 127.0.0.1:1 127.0.0.1:2\ntls on", "cache_threshold 0", "latency_threshold 1e300", "objective premium 99",
		"max_body_bytes -1", "trusted_sources 10.0.0.0/8 ::1", "backends http://127.0.0.1:1", "first_byte_timeout -1"} {
		f.Add(s)
	}
	modules := map[string]func() configurable{
		"queued_least_latency": func() configurable { return new(QueuedLeastLatency) },
		"cache_aware":          func() configurable { return new(CacheAware) },
		"load_aware":           func() configurable { return new(LoadAware) },
		"global_redis_least":   func() configurable { return new(GlobalRedisLeast) },
		"flow_control":         func() configurable { return new(FlowControl) },
		"custom_router":        func() configurable { return &customRouterConfig{new(CustomRouter)} },
	}
	f.Fuzz(func(t *testing.T, block string) {
		if strings.ContainsAny(block, "{}") && strings.Count(block, "{") != strings.Count(block, "}") {
			return // unbalanced blocks are the tokenizer's business
		}
		for name, newModule := range modules {
			m := newModule()
			tokens, err := caddyfile.Tokenize([]byte(name+" {\n"+block+"\n}"), "Caddyfile")
			if err != nil {
				return // not a Caddyfile at all: the tokenizer refuses it
			}
			if err := m.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
				if !strings.Contains(err.Error(), name) {
					t.Fatalf("%s: error does not name the module: %v", name, err)
				}
				continue
			}
			_ = m.Validate()
		}
	})
}

type configurable interface {
	caddyfile.Unmarshaler
	Validate() error
}

// customRouterConfig gives custom_router (which validates in Provision)
// the fuzz target's shape.
type customRouterConfig struct{ *CustomRouter }

func (c *customRouterConfig) Validate() error {
	_, err := lb.ParseBackends(c.Backends)
	return err
}

// The first-byte limit is derived from what each replica did; no sample
// may make it zero, negative or unbounded.
func FuzzFirstByteLimit(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(int64(1), int64(-1))
	f.Add(int64(1<<62), int64(0))
	f.Fuzz(func(t *testing.T, sample, configured int64) {
		var s firstByteStats
		for _, streamed := range []bool{false, true} {
			if sample > 0 {
				s.of("r").observe(time.Duration(sample), streamed, time.Now())
			}
			got, auto := s.of("r").limit(time.Duration(configured), streamed)
			switch {
			case configured < 0 && got != 0, configured > 0 && got != time.Duration(configured), configured != 0 && auto:
				t.Fatalf("configured %d: limit %v (automatic %v)", configured, got, auto)
			case configured == 0 && (got < firstByteMin || got > firstByteMax || !auto):
				t.Fatalf("sample %d: auto limit %v (automatic %v) out of [%v, %v]", sample, got, auto, firstByteMin, firstByteMax)
			}
		}
	})
}
