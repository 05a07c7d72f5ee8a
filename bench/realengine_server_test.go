package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// python3 is the interpreter server.py runs under; without one the test
// is skipped, and failed under CI=true (Debian ships it; CI must have it).
func python3(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is missing: server.py's tests need it")
		}
		t.Skip("no python3")
	}
	return p
}

// server.py is what a session lent a GPU runs, with minutes of device time
// and no way to fix it there: its own tests (the parts that need no torch,
// and its HTTP side over the fake backend) run with every test run.
func TestServerPyOwnTests(t *testing.T) {
	py := python3(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := filepath.Abs("realengine")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-s", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest discover -s %s: %v\n%s", dir, err, out)
	}
}

// TestQuickTransformersPath runs real-engine -engine transformers -quick
// as a GPU session does, with server.py's fake backend (a timer instead of
// a model) in place of transformers: the harness starts the replicas once
// for the whole scenario, waits for their health, counts each replica's
// answers from its vllm:request_success_total, reads its gauges while the
// load runs, and stops them at the end. It asserts only what is not
// timing.
func TestQuickTransformersPath(t *testing.T) {
	res := quickRealEngine(t, "caddy_round_robin,cache_aware", EngineOptions{Engine: "transformers", Python: python3(t),
		Replicas: 2, Arrivals: 2 * time.Second, Rates: []float64{4}, ServerArgs: []string{"--backend", "fake", "--fake-step-ms", "5"}})
	if len(res.Systems) != 2 {
		t.Fatalf("%d systems ran, want round robin and cache_aware", len(res.Systems))
	}
	for _, s := range res.Systems {
		if s.OK == 0 || s.Lost != 0 || s.OK != s.Requests {
			t.Errorf("%s: %d requests, %d ok, %d lost, errors %v", s.System, s.Requests, s.OK, s.Lost, s.Errors)
		}
		sum := 0
		for _, n := range s.PerReplica {
			sum += n
		}
		if len(s.PerReplica) != 2 || sum != s.OK {
			t.Errorf("%s: the replicas counted %v, %d answered", s.System, s.PerReplica, s.OK)
		}
		if s.Extra["out_tok_s"] <= 0 || s.Extra["ttft_p50_s"] <= 0 || s.Extra["itl_p50_s"] <= 0 {
			t.Errorf("%s: no streamed tokens counted: %v", s.System, s.Extra)
		}
		if _, ok := s.Extra["batch"]; !ok {
			t.Errorf("%s: the replicas' running and waiting gauges were not read: %v", s.System, s.Notes)
		}
	}
}
