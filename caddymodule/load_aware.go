package caddymodule

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/loadaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

func init() {
	caddy.RegisterModule(LoadAware{})
	registerCollectors(scraperCollector)
}

var _ policyModule = (*LoadAware)(nil)

// scraperCollector exports the replica metrics every live load_aware
// state scrapes.
var scraperCollector = modelmetrics.NewCollector(func() map[string]*modelmetrics.Scraper {
	return mapped(pickersOf[*loadaware.Picker]("load_aware"), (*loadaware.Picker).Scraper)
})

// LoadAware is Heimdall's load-aware routing as a selection policy:
// weighted scorers rate each replica (higher = lighter), the max-score
// picker takes the best and keeps the runners-up for retries.
type LoadAware struct {
	Pool string `json:"pool,omitempty"`
	// Scorers maps scorer name → weight (queue, load_aware,
	// active_request, session_affinity, no_hit_lru, kv_cache, and Sluice's
	// active_tokens). Empty: the preset's scorers.
	Scorers map[string]float64 `json:"scorers,omitempty"`
	// Preset picks the scorers when none are listed: "" (default:
	// active_request + active_tokens) or "heimdall" (the seed's five at 1).
	Preset string `json:"preset,omitempty"`
	// load_aware scorer threshold (default 128 waiting requests).
	Threshold float64 `json:"threshold,omitempty" sluice:"min=1"`
	// active_request: requests older than this stop counting (default 2m).
	RequestTimeout caddy.Duration `json:"request_timeout,omitempty"`
	// no_hit_lru: replicas tracked (default 1024), and the shared prefix
	// length that makes a request hot (default 64 characters).
	LRUSize        int `json:"lru_size,omitempty" sluice:"min=1"`
	HotPrefixChars int `json:"hot_prefix_chars,omitempty" sluice:"min=1"`
	// Picker: endpoints returned, the extras being the retry order (default 1).
	MaxNumEndpoints int `json:"max_num_endpoints,omitempty" sluice:"min=1"`
	// Adaptive mode: time-to-first-byte SLO (0: off) and the weight shift
	// per completed request (default 0.05).
	SLO          caddy.Duration `json:"slo,omitempty"`
	AdaptiveStep float64        `json:"adaptive_step,omitempty"`
	// Replica metrics scraping (queue, load_aware, kv_cache scorers).
	MetricsInterval  caddy.Duration `json:"metrics_interval,omitempty"`
	MetricsStaleness caddy.Duration `json:"metrics_staleness,omitempty"`
	MetricsPath      string         `json:"metrics_path,omitempty"`
	// Session header carrying the affinity token (default X-Session-Token).
	SessionHeader string `json:"session_header,omitempty"`
	// SessionKey keys the session tokens (HMAC of the replica's address):
	// set the same secret on every instance ({env.X} works) so tokens are
	// unguessable and shared; empty: a fixed key (opaque, not secret).
	SessionKey string `json:"session_key,omitempty"`
	bodyOptions
	passiveHealth
	attemptOptions
	selector
}

// CaddyModule returns the Caddy module information.
func (LoadAware) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.reverse_proxy.selection_policies.load_aware", func() caddy.Module { return new(LoadAware) })
}

func (p *LoadAware) pickerConfig() loadaware.PickerConfig {
	var w map[string]float64
	if len(p.Scorers) > 0 {
		w = p.Scorers
	}
	return loadaware.PickerConfig{
		Policy: loadaware.Config{
			Weights: w, Preset: p.Preset, Threshold: p.Threshold, RequestTimeout: time.Duration(p.RequestTimeout),
			LRUSize: p.LRUSize, MaxNumEndpoints: p.MaxNumEndpoints, HotPrefixChars: p.HotPrefixChars,
			SLO: time.Duration(p.SLO), AdaptiveStep: p.AdaptiveStep,
		},
		Metrics:    modelmetrics.Config{Interval: time.Duration(p.MetricsInterval), Staleness: time.Duration(p.MetricsStaleness), Path: p.MetricsPath},
		Tracker:    p.passiveHealth.trackerConfig(),
		SessionKey: caddy.NewReplacer().ReplaceKnown(p.SessionKey, ""),
	}
}

// Validate implements caddy.Validator.
func (p *LoadAware) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("load_aware: %v", err)
	}
	if err := p.pickerConfig().Validate(); err != nil {
		return fmt.Errorf("load_aware: %v", err)
	}
	if err := checkMetricsTiming("load_aware", p.MetricsInterval, p.MetricsStaleness); err != nil {
		return err
	}
	if err := checkSessionHeader(p.SessionHeader); err != nil {
		return fmt.Errorf("load_aware: session_header: %v", err)
	}
	if p.SessionKey != "" && p.pickerConfig().SessionKey == "" {
		return fmt.Errorf("load_aware: session_key: resolves to an empty value (an unset environment variable?)")
	}
	return validateBodyAndHealth("load_aware", p.bodyOptions, p.passiveHealth)
}

// Provision implements caddy.Provisioner.
func (p *LoadAware) Provision(ctx caddy.Context) error {
	if err := p.Validate(); err != nil {
		return err
	}
	name := poolName(p.Pool)
	cfg := p.pickerConfig()
	fingerprint := fmt.Sprintf("%+v", cfg) // without the TLS config: a pointer, new in each load
	cfg.Metrics.TLS = upstreamTLS(enclosingProxy(ctx))
	header := orDefault(p.SessionHeader, "X-Session-Token")
	log := ctx.Logger()
	return p.provision(ctx, selectorSpec{
		attempt: p.attemptOptions,
		module:  "load_aware", pool: name, measure: measureAuto,
		maxBody: p.bodyLimit(), session: header,
		// Only no_hit_lru routes on the prompt's text; the default
		// scorers weigh it.
		readsText:   func() bool { return p.state.picker.(*loadaware.Picker).ReadsText() },
		fingerprint: fingerprint,
		// The client gets the replica's session token back, where a
		// scorer will read it.
		afterPick: func(w http.ResponseWriter, l lb.Lease) {
			if pk := p.state.picker.(*loadaware.Picker); pk.HandsOutSessions() {
				w.Header().Set(header, pk.SessionToken(l.Replica()))
			}
		},
		build: func(key stateKey) (*policyState, error) {
			pk := loadaware.NewPicker(cfg)
			sl := newStateLog(log)
			pk.Explain = func(e loadaware.Explanation) { logScores(sl.get(), name, e) }
			pk.Explaining = func() bool { return sl.get().Core().Enabled(zap.DebugLevel) }
			settings := func() any {
				c := pk.Config()
				if c.SessionKey != "" {
					c.SessionKey = "(set)" // never shown
				}
				return c
			}
			health := func() stateHealth {
				h := trackerHealth(pk.Tracker())
				h.Metrics = pk.Scraper()
				return h
			}
			return newPolicyState(key, pk, policyParts{settings: settings, health: health, run: pk.Run, extra: sl}), nil
		},
		apply: func(st *policyState) {
			st.extra.(*stateLog).set(log)
			if err := st.picker.(*loadaware.Picker).Configure(cfg); err != nil {
				log.Error("cannot apply load_aware settings", zap.String("pool", name), zap.Error(err))
			}
		},
	})
}

// checkSessionHeader refuses a session_header HTTP cannot carry: Go's
// server drops a response header whose name is no token (RFC 9110), and
// drops or misreads one that frames the message, so affinity would
// silently never work.
func checkSessionHeader(name string) error {
	if name == "" {
		return nil // the default
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("%q is not an HTTP header name", name)
		}
	}
	switch http.CanonicalHeaderKey(name) {
	case "Content-Length", "Transfer-Encoding", "Connection", "Host", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade":
		return fmt.Errorf("%s is a header HTTP itself uses", name)
	}
	return nil
}

// logScores writes every scorer's score per replica at debug level.
func logScores(log *zap.Logger, pool string, e loadaware.Explanation) {
	if c := log.Check(zap.DebugLevel, "load_aware scores"); c != nil {
		c.Write(zap.String("pool", pool), zap.String("scores", e.String()))
	}
}

// UnmarshalCaddyfile sets up the policy from:
//
//	lb_policy load_aware {
//	    pool              <name>
//	    preset            heimdall            # the seed's five scorers at 1, unless scorers are listed
//	    scorer            <name> [<weight>]   # repeatable; none: the preset (default active_request + active_tokens)
//	    threshold         <waiting requests>
//	    request_timeout   <duration|seconds>
//	    lru_size          <n>
//	    hot_prefix_chars  <n>
//	    max_num_endpoints <n>
//	    slo               <duration|seconds>  # adaptive mode
//	    adaptive_step     <0..1>
//	    metrics_interval  <duration|seconds>
//	    metrics_staleness <duration|seconds>
//	    metrics_path      <path>
//	    session_header    <header>
//	    session_key       <secret>          # HMAC key of the session tokens
//	    max_body_bytes    <bytes>
//	    max_fails         <n>
//	    fail_duration     <duration|seconds>
//	}
func (p *LoadAware) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "load_aware", nil, p, func(opt string, vals []string) (bool, error) {
		if opt != "scorer" {
			return false, nil
		}
		if len(vals) < 1 || len(vals) > 2 {
			return true, fmt.Errorf("takes a name and an optional weight")
		}
		weight := 1.0
		if len(vals) == 2 {
			w, err := strconv.ParseFloat(vals[1], 64)
			if err != nil || math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
				return true, fmt.Errorf("%s: bad weight %q", vals[0], vals[1])
			}
			weight = w
		}
		if p.Scorers == nil {
			p.Scorers = map[string]float64{}
		}
		p.Scorers[vals[0]] = weight
		return true, nil
	})
}
