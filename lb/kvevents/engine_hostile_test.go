package kvevents

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// answering is an engine whose /tokenize answers tokens for any prompt.
func answering(t *testing.T, tokens []uint32, asked *atomic.Int32) string {
	t.Helper()
	ids := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(tokens)), ","), "[]")
	return hostile(t, func(w http.ResponseWriter, r *http.Request) {
		if asked != nil {
			asked.Add(1)
		}
		fmt.Fprintf(w, `{"tokens":[%s]}`, ids)
	})
}

// One replica's answer serves every replica's requests (the cache is the
// pool's). A wrong one (a replica on another tokenizer during a rollout,
// or one answering for another prompt) stayed for good while the prompt
// was in use: the least recently used go first, and a hot prompt never
// is. An answer older than MaxAge is asked again, of the next replica,
// and the old one serves until the new one comes (the pick never waits);
// a failed refresh keeps it.
func TestEngineTokenizerWrongAnswerDoesNotStayForGood(t *testing.T) {
	noLeaksAfter(t)
	wrong := []uint32{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}
	right := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	bad := answering(t, wrong, nil)
	var goodAsked atomic.Int32
	good := answering(t, right, &goodAsked)
	dead := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	e := NewEngineTokenizer(EngineConfig{MaxAge: time.Minute, Backoff: 10 * time.Second})
	defer e.Close()
	var skew atomic.Int64
	e.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	later := func(d time.Duration) { skew.Add(int64(d)) }

	p := Prompt{Model: "m", Text: "a short prompt", Replicas: []string{bad}}
	if got := warm(t, e, p, true); !slices.Equal(got, wrong) {
		t.Fatalf("warm: %v", got)
	}
	// The bad replica leaves the pool (or is fixed); the prompt stays hot.
	// Past MaxAge, a use asks again, and is served the old answer.
	p.Replicas = []string{dead}
	later(2 * time.Minute)
	if got, _, ok := e.TokenizePrompt(p); !ok || !slices.Equal(got, wrong) {
		t.Fatalf("the cached answer not served while it is asked again: %v %v", got, ok)
	}
	waitFor(t, "the answer asked again", func() bool { return e.Stats().Failures[TokUnreachable] == 1 })
	// That failed: the old answer still serves, not asked again at once.
	if got, _, ok := e.TokenizePrompt(p); !ok || !slices.Equal(got, wrong) || e.Stats().Requests != 2 {
		t.Fatalf("after a failed refresh: %v %v, %+v", got, ok, e.Stats())
	}
	p.Replicas = []string{good}
	later(time.Minute) // past the backoff
	waitFor(t, "the good replica's answer", func() bool {
		got, _, _ := e.TokenizePrompt(p)
		return slices.Equal(got, right)
	})
	// Fresh again: not asked on every use.
	n := goodAsked.Load()
	for i := 0; i < 10; i++ {
		e.TokenizePrompt(p)
	}
	if goodAsked.Load() != n {
		t.Fatalf("a fresh answer asked again: %d times", goodAsked.Load()-n)
	}
}

// A null among the ids decoded as token 0: a wrong id kept as the
// engine's.
func TestEngineTokenizerRefusesNullIDs(t *testing.T) {
	noLeaksAfter(t)
	addr := hostile(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[1,null,3]}`)) })
	e := NewEngineTokenizer(EngineConfig{})
	p := Prompt{Model: "m", Text: "short prompt", Replicas: []string{addr}}
	e.TokenizePrompt(p)
	waitFor(t, "the answer", func() bool { s := e.Stats(); return s.Stored+s.Failures[TokBadAnswer] == 1 })
	e.Close()
	if s := e.Stats(); s.Failures[TokBadAnswer] != 1 {
		t.Fatalf("ids with a null accepted: %+v", s)
	}
}

// The cache's byte bound counts what its answers hold: an answer's slice
// as decoded had room past its ids (up to twice), uncounted.
func TestEngineTokenizerCountsTheBytesItHolds(t *testing.T) {
	noLeaksAfter(t)
	for _, n := range []int{5, 1000, 100000} {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(i)
		}
		addr := answering(t, ids, nil)
		e := NewEngineTokenizer(EngineConfig{})
		got := warm(t, e, Prompt{Model: "m", Text: "prompt", Replicas: []string{addr}}, true)
		s := e.Stats()
		e.Close()
		if held := int64(4*cap(got) + entryOverhead); s.Bytes < held {
			t.Errorf("%d ids: %d bytes counted, %d held", n, s.Bytes, held)
		}
	}
}

// reqtext keeps a chat request's first reqtext.MaxMessages messages: a
// prompt with that many is not known to be whole, and its tokens are not
// the whole prompt's (a prefix's, used without the margin).
func TestEngineTokenizerCappedMessagesAreNotWhole(t *testing.T) {
	e := NewEngineTokenizer(EngineConfig{MaxCuts: 2 * reqtext.MaxMessages})
	defer e.Close()
	msgs := make([]json.RawMessage, reqtext.MaxMessages)
	for i := range msgs {
		msgs[i] = json.RawMessage(`{"role":"user","content":"x"}`)
	}
	cs := e.cuts(Prompt{Model: "m", Messages: msgs})
	if len(cs) != len(msgs) || cs[len(cs)-1].whole {
		t.Fatalf("%d cuts, the last whole: %v", len(cs), cs[len(cs)-1].whole)
	}
	cs = e.cuts(Prompt{Model: "m", Messages: msgs[:10]})
	if !cs[len(cs)-1].whole {
		t.Fatal("a short conversation's last cut is not whole")
	}
}
