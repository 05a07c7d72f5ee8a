package caddymodule

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// Backend sets survive a Sluice restart: every change is written to
// <caddy data dir>/sluice/pools/<pool>.json (atomically: temp file +
// rename), and the first module that names a pool after start-up restores
// it, unless a set was already given in this process. The HF platform
// re-posts the set whenever replicas change, so a stale file is corrected
// by the next set-backends; until then Sluice serves the last known set
// instead of failing every request.

var poolNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func validatePoolName(name string) error {
	if !poolNameRE.MatchString(name) {
		return fmt.Errorf("pool name %q: use 1-64 letters, digits, '.', '_' or '-'", name)
	}
	return nil
}

func poolName(name string) string {
	if name == "" {
		return lb.DefaultPool
	}
	return name
}

// poolsDir is a variable so tests can point it at a temp dir.
var poolsDir = func() string { return filepath.Join(caddy.AppDataDir(), "sluice", "pools") }

type persistedPool struct {
	Backends []string `json:"backends"`
}

var (
	restoreMu sync.Mutex
	restored  = map[string]bool{}
	inUse     = map[string]bool{} // pools a config that started names
)

// usePool arranges for the config being provisioned to use pool name when
// it starts: its persisted set is restored then (once per process, unless
// it has one), and the pool is listed from then on. Not at Provision: a
// config Caddy refuses later must leave no pool behind, listed or holding
// a set no running config asked for.
func usePool(ctx caddy.Context, name string, log *zap.Logger) error {
	// Keyed by the pool: the running configs' keys tell which pools they
	// use (listedPools), so a pool a reload dropped is no longer listed.
	return applyOnStart(ctx, stateKey{pool: name}, "", func() {
		restorePool(name, log)
		restoreMu.Lock()
		inUse[name] = true
		restoreMu.Unlock()
	})
}

// listedPools are the pools /sluice/pools names, sorted: those a config
// that started uses, and those given a set (through the API, or restored
// for one). A pool a refused config provisioned exists (its modules held
// it) but is neither.
func listedPools() []string {
	ranks, configured := runningKeys() // before restoreMu: Start takes appsMu, then restoreMu
	restoreMu.Lock()
	defer restoreMu.Unlock()
	used := func(name string) bool {
		if !configured {
			return inUse[name] // modules provisioned without a config
		}
		_, ok := ranks[stateKey{pool: name}]
		return ok
	}
	var names []string
	for _, name := range lb.PoolNames() {
		if p, ok := lb.LookupPool(name); used(name) || (ok && p.Managed()) {
			names = append(names, name)
		}
	}
	return names
}

// poolWillHaveSet reports whether pool name has a backend set, or will
// have one once the config being started restores it: the start-time
// checks run before any setting of the config applies, restores included.
func poolWillHaveSet(name string) bool {
	if p, ok := lb.LookupPool(name); ok && p.Managed() {
		return true
	}
	restoreMu.Lock()
	done := restored[name]
	restoreMu.Unlock()
	if done {
		return false // restored before: it had no valid file, or was set since
	}
	bs, _, err := readPersisted(name)
	return err == nil && len(bs) > 0
}

// restorePool loads the persisted set of pool name once per process, if
// the pool has no set yet. A missing file is normal; a corrupt one is
// logged and ignored (the next set-backends rewrites it).
func restorePool(name string, log *zap.Logger) {
	restoreMu.Lock()
	defer restoreMu.Unlock()
	if restored[name] {
		return
	}
	restored[name] = true
	// Under setsMu, as every change of a set: a set-backends landing
	// between the check and the restore would be replaced by the older
	// persisted set (restoreMu, then setsMu: never the other way round).
	setsMu.Lock()
	defer setsMu.Unlock()
	p := lb.GetPool(name)
	if p.Managed() {
		return
	}
	bs, path, err := readPersisted(name)
	if err != nil {
		log.Warn("ignoring persisted backend set", zap.String("pool", name), zap.String("path", path), zap.Error(err))
		return
	}
	if bs == nil {
		return
	}
	p.Set(bs)
	log.Info("restored backend set", zap.String("pool", name), zap.Int("backends", len(bs)), zap.String("path", path))
}

// readPersisted reads pool name's persisted set and the file's path: nil
// and no error without a file.
func readPersisted(name string) ([]lb.Backend, string, error) {
	path := filepath.Join(poolsDir(), name+".json")
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, path, nil
	}
	if err != nil {
		return nil, path, fmt.Errorf("cannot read it: %w", err)
	}
	var pp persistedPool
	if err := json.Unmarshal(data, &pp); err != nil {
		return nil, path, fmt.Errorf("corrupt: %w", err)
	}
	bs, err := lb.ParseBackends(pp.Backends)
	if err != nil {
		return nil, path, fmt.Errorf("invalid: %w", err)
	}
	return bs, path, nil
}

// persistPool writes the set; failure is logged, not fatal: the set is live
// in memory either way.
func persistPool(name string, bs []lb.Backend, log *zap.Logger) {
	urls := make([]string, len(bs))
	for i, b := range bs {
		urls[i] = b.URL
	}
	data, _ := json.Marshal(persistedPool{Backends: urls})
	dir := poolsDir()
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		var f *os.File
		f, err = os.CreateTemp(dir, name+".*.tmp")
		if err == nil {
			_, err = f.Write(data)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(f.Name(), filepath.Join(dir, name+".json"))
			}
			if err != nil {
				os.Remove(f.Name())
			}
		}
	}
	if err != nil {
		log.Warn("cannot persist backend set; it is live but will not survive a restart",
			zap.String("pool", name), zap.String("dir", dir), zap.Error(err))
	}
}
