package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// AdminAPI mounts the backend-set and health operations on Caddy's admin
// endpoint (localhost:2019 by default), which is private by design:
//
//	POST /sluice/pools/<pool>/set-backends   {"backends": [...]}
//	GET  /sluice/pools/<pool>/health
//	GET  /sluice/pools                       the pool names
//	GET  /sluice/metrics                     Prometheus text
type AdminAPI struct {
	log *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("admin.api.custom_router", func() caddy.Module { return new(AdminAPI) })
}

// Provision implements caddy.Provisioner.
func (a *AdminAPI) Provision(ctx caddy.Context) error {
	a.log = ctx.Logger()
	return nil
}

// Routes implements caddy.AdminRouter.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/sluice/pools", Handler: caddy.AdminHandlerFunc(a.listPools)},
		{Pattern: "/sluice/pools/", Handler: caddy.AdminHandlerFunc(a.pool)},
		{Pattern: "/sluice/metrics", Handler: caddy.AdminHandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if onlyRead(w, r) {
				serveMetrics(w, r)
			}
			return nil
		})},
	}
}

func (a *AdminAPI) listPools(w http.ResponseWriter, r *http.Request) error {
	if onlyRead(w, r) {
		writeJSON(w, http.StatusOK, map[string]any{"pools": listedPools()})
	}
	return nil
}

// onlyRead reports whether r reads (GET or HEAD); otherwise it answers
// 405 naming the methods allowed: a change sent to a read-only path (a
// backend set POSTed to /sluice/pools) must not be told it succeeded.
func onlyRead(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
	return false
}

func (a *AdminAPI) pool(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, "/sluice/pools/")
	name, op, _ := strings.Cut(rest, "/")
	if err := validatePoolName(name); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return nil
	}
	switch op {
	case "set-backends":
		serveSetBackendsTo(w, r, name, nil, func() { restorePool(name, a.log) }, a.log)
	case "health":
		serveHealth(w, r, name)
	default:
		writeJSONError(w, http.StatusNotFound, "not_found", "use /sluice/pools/<pool>/set-backends or /health")
	}
	return nil
}
