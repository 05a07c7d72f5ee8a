package kvevents

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// A replica reached over TLS is asked over TLS: its base URL comes from
// the caller (the pool's backend set). Asked at http://addr, a TLS
// replica answered 400 to every tokenize request, and the exact index
// never had the engine's ids for its prompts.
func TestEngineTokenizerAsksTLSReplicasOverTLS(t *testing.T) {
	noLeaksAfter(t)
	var overTLS, plain atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			plain.Add(1)
		} else {
			overTLS.Add(1)
		}
		w.Write([]byte(`{"tokens":[1,2,3]}`))
	}))
	t.Cleanup(srv.Close)
	dial := strings.TrimPrefix(srv.URL, "https://")
	var asked atomic.Pointer[string]
	e := NewEngineTokenizer(EngineConfig{Transport: srv.Client().Transport, BaseURL: func(addr string) string {
		asked.Store(&addr)
		return "https://" + addr
	}})
	defer e.Close()
	p := Prompt{Model: "m", Text: "short prompt", Replicas: []string{dial}}
	e.TokenizePrompt(p)
	waitFor(t, "an answer", func() bool { s := e.Stats(); return s.Stored+uint64(len(s.Failures)) > 0 })
	if s := e.Stats(); s.Stored != 1 || len(s.Failures) != 0 {
		t.Fatalf("the TLS replica at %s: stats %+v (asked over TLS %d, plain %d times)", dial, s, overTLS.Load(), plain.Load())
	}
	if a := asked.Load(); a == nil || *a != dial {
		t.Fatalf("BaseURL asked for %v, want the dial address %s", a, dial)
	}
	if tokens, _, ok := e.TokenizePrompt(p); !ok || !slices.Equal(tokens, []uint32{1, 2, 3}) {
		t.Fatalf("tokens %v %v, want the replica's [1 2 3]", tokens, ok)
	}
}
