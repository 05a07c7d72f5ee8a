package caddymodule

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

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
	// AllowedSources are the client addresses (CIDR or IP, matched against
	// the connection's own peer, never a forwarded header) that may call
	// the endpoints that change the set (set-backends, add/remove_worker)
	// and read the topology (health, metrics, list_workers) without the
	// token. Default: loopback and the private ranges, where the HF
	// platform calls from.
	AllowedSources []string `json:"allowed_sources,omitempty"`
	// AllowedBackends, if set, are the only addresses (CIDR or IP) a
	// backend may have; a backend given by host name is then refused (its
	// address cannot be checked).
	AllowedBackends []string `json:"allowed_backends,omitempty"`

	allowed  []netip.Prefix
	backends []netip.Prefix
	name     string
	log      *zap.Logger
}

// privateSources is AllowedSources' default.
var privateSources = []string{"127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"}

// CaddyModule returns the Caddy module information.
func (CustomRouter) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.handlers.custom_router", func() caddy.Module { return new(CustomRouter) })
}

// Provision implements caddy.Provisioner.
func (h *CustomRouter) Provision(ctx caddy.Context) error {
	h.name = poolName(h.Pool)
	if err := validatePoolName(h.name); err != nil {
		return fmt.Errorf("custom_router: %v", err)
	}
	h.log = ctx.Logger()
	if h.Token != "" {
		// A token from an unset variable would silently turn
		// authentication off: refuse to load instead.
		if h.Token = caddy.NewReplacer().ReplaceKnown(h.Token, ""); strings.TrimSpace(h.Token) == "" {
			return fmt.Errorf("custom_router: token: resolves to an empty value (an unset environment variable?); refusing to serve the contract without authentication")
		}
	}
	sources := h.AllowedSources
	if len(sources) == 0 {
		sources = privateSources
	}
	h.allowed = h.allowed[:0]
	for _, src := range sources {
		p, err := parsePrefix(src)
		if err != nil {
			return fmt.Errorf("custom_router: allowed_sources: %q: %v", src, err)
		}
		h.allowed = append(h.allowed, p.Masked())
	}
	h.backends = h.backends[:0]
	for _, src := range h.AllowedBackends {
		p, err := parsePrefix(src)
		if err != nil {
			return fmt.Errorf("custom_router: allowed_backends: %q: %v", src, err)
		}
		h.backends = append(h.backends, p.Masked())
	}
	seed, err := lb.ParseBackends(h.Backends)
	if err != nil {
		return fmt.Errorf("custom_router: backends: %v", err)
	}
	for _, b := range seed {
		if err := h.allowedBackend(b); err != nil {
			return fmt.Errorf("custom_router: backends: %v", err)
		}
	}
	if err := usePool(ctx, h.name, h.log); err != nil {
		return fmt.Errorf("custom_router: %v", err)
	}
	if len(h.backends) > 0 {
		// allowed_backends is a setting like any other: once this config
		// starts, it applies to the set already live (posted under an
		// earlier config, or restored from disk), not only to the next
		// set-backends.
		if err := onConfigStart(ctx, h.dropDisallowed); err != nil {
			return fmt.Errorf("custom_router: allowed_backends: %v", err)
		}
	}
	if len(seed) > 0 {
		// The seed is a setting: it reaches the pool only if this config
		// starts (a refused config must not give a running one its set).
		name, log := h.name, h.log
		err := applyOnStart(ctx, stateKey{module: "custom_router", pool: name}, strings.Join(urls(seed), " "), func() {
			seedPool(name, seed, log)
		})
		if err != nil {
			return fmt.Errorf("custom_router: backends: %v", err)
		}
	}
	registerMetrics(ctx, h.log)
	return nil
}

// seedPool gives pool name the config's seed if it has no set yet. Under
// setsMu, as every change of a set: a set-backends landing between the
// check and the change would be overwritten, though a posted set wins.
func seedPool(name string, seed []lb.Backend, log *zap.Logger) {
	setsMu.Lock()
	defer setsMu.Unlock()
	if pool := lb.GetPool(name); !pool.Managed() {
		pool.Set(seed)
		log.Info("backend set seeded from config", zap.String("pool", name), zap.Strings("backends", urls(seed)))
	}
}

const hfPrefix = "/_custom_router/"

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *CustomRouter) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, hfPrefix):
		switch strings.TrimPrefix(path, hfPrefix) {
		case "set-backends":
			if h.mayChange(w, r) {
				serveSetBackends(w, r, h.name, h.allowedBackend, h.log)
			}
		case "health":
			if h.mayRead(w, r) {
				serveHealth(w, r, h.name)
			}
		case "metrics":
			if h.mayRead(w, r) && onlyRead(w, r) {
				serveMetrics(w, r)
			}
		default:
			writeJSONError(w, http.StatusNotFound, "not_found", "unknown custom router endpoint "+path)
		}
		return nil
	case h.SGLangAPI == nil || *h.SGLangAPI:
		switch path {
		case "/add_worker", "/remove_worker":
			if h.mayChange(w, r) {
				h.serveWorkerChange(w, r, path == "/add_worker")
			}
			return nil
		case "/list_workers":
			if h.mayRead(w, r) && onlyRead(w, r) {
				set, _ := lb.GetPool(h.name).Backends()
				writeJSON(w, http.StatusOK, map[string]any{"urls": urls(set)})
			}
			return nil
		}
	}
	keepClientBody(r)
	err := next.ServeHTTP(watchBody(w, r), r)
	if err != nil && caddyhttp.GetVar(r.Context(), refusedVar) != nil {
		// Sluice already answered (JSON + Retry-After) and counted it;
		// reverse_proxy's "no upstreams" error would only be log noise.
		return nil
	}
	return err
}

// allowedBackend checks b against AllowedBackends (all pass when unset).
func (h *CustomRouter) allowedBackend(b lb.Backend) error {
	if len(h.backends) == 0 {
		return nil
	}
	host, _, _ := net.SplitHostPort(b.Dial)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%q: with allowed_backends set, a backend must be an IP address", b.URL)
	}
	for _, p := range h.backends {
		if p.Contains(ip.Unmap()) {
			return nil
		}
	}
	return fmt.Errorf("%q is outside allowed_backends", b.URL)
}

// dropDisallowed removes from the pool's live set every backend that
// allowed_backends forbids, saying which and why.
func (h *CustomRouter) dropDisallowed() {
	setsMu.Lock()
	defer setsMu.Unlock()
	pool := lb.GetPool(h.name)
	set, _ := pool.Backends()
	kept := make([]lb.Backend, 0, len(set))
	var dropped []string
	for _, b := range set {
		if err := h.allowedBackend(b); err != nil {
			dropped = append(dropped, err.Error())
			continue
		}
		kept = append(kept, b)
	}
	if len(dropped) == 0 {
		return
	}
	h.log.Warn("backends outside allowed_backends removed from the live set", zap.String("pool", h.name),
		zap.Strings("removed", dropped), zap.Int("kept", len(kept)))
	applyBackendsLocked(h.name, kept, h.log)
}

// mayChange admits a call that changes the backend set: from an allowed
// source, and with the token when one is set.
func (h *CustomRouter) mayChange(w http.ResponseWriter, r *http.Request) bool {
	if !h.fromAllowedSource(r) {
		writeJSONError(w, http.StatusForbidden, "forbidden_source", "this endpoint answers only allowed_sources")
		return false
	}
	if h.Token != "" && !h.hasToken(r) {
		h.unauthorized(w)
		return false
	}
	return true
}

// mayRead admits a call that reveals the topology (backend addresses,
// tenants): from an allowed source, or with the token.
func (h *CustomRouter) mayRead(w http.ResponseWriter, r *http.Request) bool {
	if h.fromAllowedSource(r) || (h.Token != "" && h.hasToken(r)) {
		return true
	}
	if h.Token != "" {
		h.unauthorized(w)
	} else {
		writeJSONError(w, http.StatusForbidden, "forbidden_source", "this endpoint answers only allowed_sources")
	}
	return false
}

// fromAllowedSource checks the connection's peer address: a forwarded
// header can be forged, the peer cannot.
func (h *CustomRouter) fromAllowedSource(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range h.allowed {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func (h *CustomRouter) hasToken(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(h.Token)) == 1
}

func (h *CustomRouter) unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	writeJSONError(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
}

// serveWorkerChange adds or removes one worker, SGLang-router style.
func (h *CustomRouter) serveWorkerChange(w http.ResponseWriter, r *http.Request, add bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	b, err := lb.ParseBackend(r.URL.Query().Get("url"))
	if err == nil {
		err = refuseOwnAddress(b, r)
	}
	if err == nil {
		err = clientStayed(r)
	}
	if err == nil {
		err = h.allowedBackend(b)
	}
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_request", "url: "+err.Error())
		return
	}
	pool := lb.GetPool(h.name)
	// Read-modify-write under the pool's own ordering: concurrent worker
	// changes are rare (operators, autoscalers) and each is logged.
	setsMu.Lock()
	defer setsMu.Unlock()
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
	applyBackendsLocked(h.name, next, h.log)
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "urls": urls(next)})
}

// UnmarshalCaddyfile sets up the handler from:
//
//	custom_router [<pool>] {
//	    pool       <name>
//	    token      <bearer token>
//	    sglang_api on|off
//	    backends   <url>...   # initial set, when none was posted or persisted
//	    allowed_sources <cidr|ip>...  # default: loopback and private ranges
//	    allowed_backends <cidr|ip>... # default: any (but never link-local, multicast, Caddy itself)
//	}
func (h *CustomRouter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "custom_router", &h.Pool, h, nil)
}
