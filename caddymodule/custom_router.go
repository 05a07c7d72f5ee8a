package caddymodule

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

func init() {
	caddy.RegisterModule(CustomRouter{})
	httpcaddyfile.RegisterHandlerDirective("custom_router", parseCustomRouterCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("custom_router", httpcaddyfile.Before, "reverse_proxy")
}

// CustomRouter serves the Hugging Face custom-router contract on the
// listener port, in front of reverse_proxy:
//
//	POST /_custom_router/set-backends  {"backends": ["http://host:port", ...]}
//	GET  /_custom_router/health        JSON snapshot (queue depth, per-backend EWMA, in-flight)
//	GET  /_custom_router/metrics       Prometheus text
//
// and, unless sglang_api is off, SGLang-router-style worker management:
//
//	POST /add_worker?url=http://host:port
//	POST /remove_worker?url=http://host:port
//	GET  /list_workers
//
// Every other request passes to the next handler. When Token is set the
// calls that change the set require "Authorization: Bearer <token>".
type CustomRouter struct {
	Pool  string `json:"pool,omitempty"`
	Token string `json:"token,omitempty"`
	// SGLangAPI enables the worker endpoints (default true).
	SGLangAPI *bool `json:"sglang_api,omitempty"`
	// Backends seeds the pool at start-up when it has no set yet (none
	// posted in this process, none persisted): the quick start needs no
	// set-backends call. A posted set always wins.
	Backends []string `json:"backends,omitempty"`

	name string
	log  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (CustomRouter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.custom_router",
		New: func() caddy.Module { return new(CustomRouter) },
	}
}

// Provision implements caddy.Provisioner.
func (h *CustomRouter) Provision(ctx caddy.Context) error {
	h.name = poolName(h.Pool)
	if err := validatePoolName(h.name); err != nil {
		return fmt.Errorf("custom_router: %v", err)
	}
	h.log = ctx.Logger()
	repl := caddy.NewReplacer()
	h.Token = repl.ReplaceKnown(h.Token, "")
	seed, err := lb.ParseBackends(h.Backends)
	if err != nil {
		return fmt.Errorf("custom_router: backends: %v", err)
	}
	restorePool(h.name, h.log)
	if pool := lb.GetPool(h.name); len(h.Backends) > 0 && !pool.Managed() {
		pool.Set(seed)
		h.log.Info("backend set seeded from config", zap.String("pool", h.name), zap.Strings("backends", urls(seed)))
	}
	registerMetrics(ctx, h.log)
	return nil
}

const hfPrefix = "/_custom_router/"

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *CustomRouter) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, hfPrefix):
		switch strings.TrimPrefix(path, hfPrefix) {
		case "set-backends":
			if h.authorized(w, r) {
				serveSetBackends(w, r, h.name, h.log)
			}
		case "health":
			serveHealth(w, r, h.name)
		case "metrics":
			serveMetrics(w, r)
		default:
			writeJSONError(w, http.StatusNotFound, "not_found", "unknown custom router endpoint "+path)
		}
		return nil
	case h.SGLangAPI == nil || *h.SGLangAPI:
		switch path {
		case "/add_worker", "/remove_worker":
			if h.authorized(w, r) {
				h.serveWorkerChange(w, r, path == "/add_worker")
			}
			return nil
		case "/list_workers":
			set, _ := lb.GetPool(h.name).Backends()
			writeJSON(w, http.StatusOK, map[string]any{"urls": urls(set)})
			return nil
		}
	}
	err := next.ServeHTTP(w, r)
	if err != nil && caddyhttp.GetVar(r.Context(), refusedVar) != nil {
		// Sluice already answered (JSON + Retry-After) and counted it;
		// reverse_proxy's "no upstreams" error would only be log noise.
		return nil
	}
	return err
}

func (h *CustomRouter) authorized(w http.ResponseWriter, r *http.Request) bool {
	if h.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(got), []byte(h.Token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	writeJSONError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
	return false
}

// serveWorkerChange adds or removes one worker, SGLang-router style.
func (h *CustomRouter) serveWorkerChange(w http.ResponseWriter, r *http.Request, add bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	b, err := lb.ParseBackend(r.URL.Query().Get("url"))
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_request", "url: "+err.Error())
		return
	}
	pool := lb.GetPool(h.name)
	// Read-modify-write under the pool's own ordering: concurrent worker
	// changes are rare (operators, autoscalers) and each is logged.
	workersMu.Lock()
	defer workersMu.Unlock()
	set, _ := pool.Backends()
	next := make([]lb.Backend, 0, len(set)+1)
	found := false
	for _, x := range set {
		if x.Dial == b.Dial {
			found = true
			if !add {
				continue
			}
		}
		next = append(next, x)
	}
	if add && !found {
		next = append(next, b)
	}
	if !add && !found {
		writeJSONError(w, http.StatusNotFound, "not_found", "worker "+b.URL+" is not in the pool")
		return
	}
	applyBackends(h.name, next, h.log)
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "urls": urls(next)})
}

var workersMu sync.Mutex

// parseCustomRouterCaddyfile sets up the handler from:
//
//	custom_router {
//	    pool       <name>
//	    token      <bearer token>
//	    sglang_api on|off
//	    backends   <url>...   # initial set, when none was posted or persisted
//	}
func parseCustomRouterCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	cr := new(CustomRouter)
	err := cr.UnmarshalCaddyfile(h.Dispenser)
	return cr, err
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler.
func (h *CustomRouter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		h.Pool = d.Val()
		if d.NextArg() {
			return d.Errf("custom_router: takes at most one argument, the pool name; got extra %q", d.Val())
		}
	}
	for d.NextBlock(0) {
		opt := d.Val()
		if opt == "backends" {
			urls := d.RemainingArgs()
			if len(urls) == 0 {
				return d.Errf("custom_router: backends needs at least one URL")
			}
			h.Backends = append(h.Backends, urls...)
			continue
		}
		if !d.NextArg() {
			return d.Errf("custom_router: %s needs a value", opt)
		}
		val := d.Val()
		if d.NextArg() {
			return d.Errf("custom_router: %s takes one value", opt)
		}
		switch opt {
		case "pool":
			h.Pool = val
		case "token":
			h.Token = val
		case "sglang_api":
			on, err := parseOnOff(val)
			if err != nil {
				return d.Errf("custom_router: sglang_api: %v", err)
			}
			h.SGLangAPI = &on
		default:
			return d.Errf("custom_router: unknown option %q", opt)
		}
	}
	return nil
}

func parseOnOff(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "on", "true", "yes":
		return true, nil
	case "off", "false", "no":
		return false, nil
	}
	return false, fmt.Errorf("want on or off, got %q", s)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*CustomRouter)(nil)
	_ caddyhttp.MiddlewareHandler = (*CustomRouter)(nil)
	_ caddyfile.Unmarshaler       = (*CustomRouter)(nil)
)
