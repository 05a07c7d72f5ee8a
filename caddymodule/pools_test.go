package caddymodule

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

func usePoolsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	old := poolsDir
	poolsDir = func() string { return dir }
	t.Cleanup(func() { poolsDir = old })
	return dir
}

// freshPoolName is a pool name no earlier run of the test in this process
// used (pools are process-wide: under -count 2 the first run's set would
// still be there).
func freshPoolName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, freshPools.Add(1))
}

var freshPools atomic.Int64

func TestBackendSetSurvivesARestart(t *testing.T) {
	usePoolsDir(t)
	bs, err := lb.ParseBackends([]string{"http://10.0.0.1:80", "https://replica-2:8443"})
	if err != nil {
		t.Fatal(err)
	}
	name := freshPoolName("persist-a")
	persistPool(name, bs, zap.NewNop())
	// "After the restart": the pool has no set in this process yet.
	if lb.GetPool(name).Managed() {
		t.Fatal("precondition: pool should be unmanaged")
	}
	restorePool(name, zap.NewNop())
	got, managed := lb.GetPool(name).Backends()
	if !managed || len(got) != 2 || got[0].URL != "http://10.0.0.1:80" || got[1].URL != "https://replica-2:8443" {
		t.Fatalf("restored %v (managed %v)", got, managed)
	}
}

func TestRestoreNeverOverridesALiveSetAndIgnoresCorruptFiles(t *testing.T) {
	dir := usePoolsDir(t)
	live, _ := lb.ParseBackends([]string{"http://live:1"})
	lb.GetPool("persist-b").Set(live)
	stale, _ := lb.ParseBackends([]string{"http://stale:1"})
	persistPool("persist-b", stale, zap.NewNop())
	restorePool("persist-b", zap.NewNop())
	if got, _ := lb.GetPool("persist-b").Backends(); got[0].Dial != "live:1" {
		t.Fatalf("restore replaced a live set: %v", got)
	}

	if err := os.WriteFile(filepath.Join(dir, "persist-c.json"), []byte(`{"backends": ["not a url"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	restorePool("persist-c", zap.NewNop())
	if lb.GetPool("persist-c").Managed() {
		t.Fatal("an invalid persisted set was applied")
	}
}

func TestPersistLeavesNoTempFiles(t *testing.T) {
	dir := usePoolsDir(t)
	bs, _ := lb.ParseBackends([]string{"http://a:1"})
	for i := 0; i < 3; i++ {
		persistPool("persist-d", bs, zap.NewNop())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "persist-d.json" {
		t.Fatalf("dir holds %v, want only persist-d.json", entries)
	}
}

// A restore is a change of a set like any other: under setsMu. It checked
// that the pool had no set, then set the persisted one, outside the lock:
// a set-backends landing in between was replaced in memory by the older
// persisted set, while the file kept the newer one.
func TestARestoreNeverLandsInsideASetChange(t *testing.T) {
	usePoolsDir(t)
	name := freshPoolName("restore-race")
	saved, _ := lb.ParseBackends([]string{"http://10.0.0.9:80"})
	persistPool(name, saved, zap.NewNop())
	posted, _ := lb.ParseBackends([]string{"http://10.0.0.1:80"})
	restoredInside := ranWhileSetsMuHeld(func() { restorePool(name, zap.NewNop()) },
		func() { applyBackendsLocked(name, posted, zap.NewNop()) })
	if restoredInside {
		t.Error("the restore changed the set while a set-backends held setsMu")
	}
	if got, _ := lb.GetPool(name).Backends(); len(got) != 1 || got[0].Dial != "10.0.0.1:80" {
		t.Errorf("set %v after a restore raced a set-backends; want the posted [10.0.0.1:80]", got)
	}
}

// ranWhileSetsMuHeld runs change in a goroutine while setsMu is held (by
// a set change, held, run before the lock is let go) and reports whether
// change finished meanwhile: it changed a set without the lock. It can
// miss that on an unlucky schedule (10,000 yields), never report it
// wrongly.
func ranWhileSetsMuHeld(change, held func()) bool {
	setsMu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		change()
	}()
	inside := false
	for i := 0; i < 10000 && !inside; i++ {
		select {
		case <-done:
			inside = true
		default:
			runtime.Gosched()
		}
	}
	held()
	setsMu.Unlock()
	<-done
	return inside
}
