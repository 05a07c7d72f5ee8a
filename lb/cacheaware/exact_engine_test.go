package cacheaware

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/kvevents"
)

// The pick never waits for the engine tokenizer: while the engine's
// /tokenize has not answered, the tree decides (and the request is
// routed); once it has, the exact index does. The engine here is a test
// server holding its answer until told (the real engine is the subject
// of lb/kvevents' and the integration tests).
func TestPickerDoesNotWaitForTheEngineTokenizer(t *testing.T) {
	answer := make(chan struct{})
	var asked, answered atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		asked.Add(1)
		select {
		case <-answer:
		case <-r.Context().Done():
			return
		}
		ids, _ := kvevents.SimTokenizer{}.Tokenize("m", req.Prompt)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids)})
		answered.Add(1)
	})
	srv, srv2 := httptest.NewServer(handler), httptest.NewServer(handler)
	defer srv.Close()
	defer srv2.Close()
	engine := strings.TrimPrefix(srv.URL, "http://")
	other := strings.TrimPrefix(srv2.URL, "http://")

	ix := kvevents.NewIndex(kvevents.Config{})
	tok := kvevents.NewEngineTokenizer(kvevents.EngineConfig{})
	defer tok.Close()
	p := newPicker(t, other, engine)
	p.SetExact(&kvevents.Prefixes{Index: ix, Tokenizer: tok, SpeculateFor: -1})
	simTok := func(s string) []uint32 { v, _ := kvevents.SimTokenizer{}.Tokenize("m", s); return v }

	// The engine holds the prompt; the tree knows nothing of it.
	held := words("held", 64)
	publish(t, ix, engine, 1, simTok(held))
	publish(t, ix, other, 1, simTok(words("other", 16)))

	req := &lb.Request{Model: "m", Text: held, Parsed: true, Tokens: 10}
	l, d := pickDecided(t, p, req)
	l.Release(ok)
	if d.Exact || answered.Load() != 0 {
		t.Fatalf("the cold pick: %+v (answers %d)", d, answered.Load())
	}
	waitUntil(t, func() bool { return asked.Load() >= 1 })
	close(answer)
	waitUntil(t, func() bool { return tok.Stats().Stored >= 1 })
	// The next look finds the prompt's first cut and asks for the whole
	// prompt (seen before).
	pickFor(t, p, &lb.Request{Model: "m", Text: held, Parsed: true, Tokens: 10}).Release(ok)
	waitUntil(t, func() bool { return tok.Stats().Stored >= 2 })

	// Warm: the exact index decides, for the replica that holds it.
	for i := 0; i < 4; i++ {
		l := pickFor(t, p, &lb.Request{Model: "m", Text: held, Parsed: true, Tokens: 10})
		if l.Replica() != engine {
			t.Fatalf("warm pick %d went to %s", i, l.Replica())
		}
		l.Release(ok)
	}
	if s := p.Router().Stats(); s.ExactHits < 4 {
		t.Fatalf("exact hits: %+v", s)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("gave up waiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
