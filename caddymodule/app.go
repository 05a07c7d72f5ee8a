package caddymodule

import (
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// App is the "sluice" Caddy app. Users never configure it: every Sluice
// module asks its config for it while provisioning, which makes Caddy
// start it together with the config's other apps. It exists for its
// Start: Caddy starts the apps of a config only once every module of it
// provisioned, so Start is the moment the config is known to load, and
// the only moment Sluice applies new settings to state that outlives the
// reload (see docs/architecture.md, "Reload lifecycle").
//
// Across a reload Caddy provisions the new config, starts its apps, then
// stops the old config's apps and cleans its modules up. If another app of
// the new config fails to start, Caddy stops the apps it had started (ours
// included) and keeps the old config: Stop then re-applies the settings of
// the config still running.
type App struct {
	mu      *sync.Mutex
	pending []pendingSettings
	// pools: the upstream source each pool got first in this config
	// (pool_upstreams.go), checked as each Sluice policy provisions.
	pools map[string]poolClaim
	log   *zap.Logger
}

// pendingSettings is one module instance's settings for one shared state,
// applied when the config starts.
type pendingSettings struct {
	key         stateKey
	fingerprint string
	apply       func()
	// check, if set, runs at Start before any setting of the config
	// applies, once every app is provisioned (so it can read the whole
	// config, e.g. the upstreams of a later reverse_proxy); an error
	// refuses the config and leaves the running one untouched.
	check func() error
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "sluice", New: func() caddy.Module { return &App{mu: new(sync.Mutex)} }}
}

// Provision implements caddy.Provisioner.
func (a *App) Provision(ctx caddy.Context) error {
	a.log = ctx.Logger()
	return nil
}

// The apps of configs that started and have not stopped, oldest first, and
// the one whose settings are in force.
var (
	appsMu  sync.Mutex
	running []*App
	applied *App
)

// Start implements caddy.App: the config loaded; its settings apply.
func (a *App) Start() error {
	if err := a.checkAll(); err != nil {
		return err
	}
	appsMu.Lock()
	defer appsMu.Unlock()
	running = append(running, a)
	applied = a
	a.applyAll()
	return nil
}

// Stop implements caddy.App. After a normal reload the stopping config is
// the old one and nothing changes. If it is the config whose settings are
// in force while an older one still runs, Caddy aborted the new config's
// start: the older config's settings apply again.
func (a *App) Stop() error {
	appsMu.Lock()
	defer appsMu.Unlock()
	for i, r := range running {
		if r == a {
			running = append(running[:i], running[i+1:]...)
			break
		}
	}
	if applied == a {
		applied = nil
		if n := len(running); n > 0 {
			applied = running[n-1]
			applied.applyAll()
		}
	}
	return nil
}

func (a *App) checkAll() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pending {
		if p.check != nil {
			if err := p.check(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *App) applyAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pending {
		p.apply()
	}
}

// register queues settings for when the config starts. Two instances of
// one config that set the same shared state differently are a config
// error: one of them would silently lose.
func (a *App) register(p pendingSettings) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, q := range a.pending {
		if q.key == p.key && q.fingerprint != p.fingerprint {
			return fmt.Errorf("pool %q is configured twice in this config with different %s settings; give one of them another pool", p.key.pool, p.key.module)
		}
	}
	a.pending = append(a.pending, p)
	return nil
}

// applyOnStart arranges for apply to run when the config being
// provisioned starts (and again if a newer config's start is aborted). A
// context made without a config (a module provisioned on its own, as unit
// tests do) has no apps: the settings apply at once.
func applyOnStart(ctx caddy.Context, key stateKey, fingerprint string, apply func()) error {
	return applyOnStartChecked(ctx, key, fingerprint, nil, apply)
}

// onConfigStart is applyOnStart for a setting of one module instance,
// not of a pool's shared state: no key, nothing to conflict with.
func onConfigStart(ctx caddy.Context, apply func()) error {
	return applyOnStart(ctx, stateKey{}, "", apply)
}

// applyOnStartChecked is applyOnStart with a check that runs first, when
// the whole config is provisioned; its error refuses the config. Without a
// config there is nothing to check against: the settings apply at once.
func applyOnStartChecked(ctx caddy.Context, key stateKey, fingerprint string, check func() error, apply func()) error {
	app, ok := configApp(ctx)
	if !ok {
		apply()
		return nil
	}
	return app.register(pendingSettings{key: key, fingerprint: fingerprint, apply: apply, check: check})
}

func configApp(ctx caddy.Context) (app *App, ok bool) {
	defer func() {
		if recover() != nil { // caddy.Context without a config
			app, ok = nil, false
		}
	}()
	v, err := ctx.App("sluice")
	if err != nil {
		return nil, false
	}
	app, ok = v.(*App)
	return app, ok
}
