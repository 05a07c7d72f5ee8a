package sim

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// A stalled request is a replica that hangs after accepting it: with
// stream headers sent at once (the default) its stream has started, on the
// engine as on the slot queue (the engine stalled before sending them).
func TestReviewS33StalledStreamHasItsHeaders(t *testing.T) {
	engine := engineConfig(time.Millisecond, 0)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"slot queue", Config{}}, {"engine", engine}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Faults = Faults{StallRate: 1, Stall: time.Hour}
			h := startSim(t, cfg)
			rp := h.srv.Replica()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The wait only guards against a hang: the headers come at once or never.
			resp := streamHeaders(t, h, ctx, enginePrompt('a', 8, 3, true), 15*time.Second)
			if resp == nil {
				t.Fatalf("no stream headers while the request stalls (stalls %d)", rp.Stats().Stalls)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			// The slot queue sends the headers before its stall begins (and
			// is counted): wait for the count rather than race it.
			deadline := time.Now().Add(10 * time.Second) // bounds a stall that never comes; no timing asserted
			for rp.Stats().Stalls != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("stalls %d, want 1", rp.Stats().Stalls)
				}
				time.Sleep(time.Millisecond)
			}
			if err := rp.SetFaults(Faults{}); err != nil { // ends the stall
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Fatalf("stream after the stall: %q, %v", body, err)
			}
		})
	}
}
