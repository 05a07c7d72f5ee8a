package cacheaware

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/kvevents"
)

type exactView map[string]struct {
	rate  float64
	fresh bool
}

func (v exactView) fn() ExactFunc {
	return func(a string) (float64, bool) { e := v[a]; return e.rate, e.fresh }
}

func TestPickWithExact(t *testing.T) {
	text := "a long shared prompt"
	even := loads(map[string]int{})
	for _, c := range []struct {
		name   string
		view   exactView
		load   LoadFunc
		want   string
		reason Reason
		exact  bool
	}{
		{"the engine says b, the tree a", exactView{"a": {0, true}, "b": {0.8, true}}, even, "b", CacheHit, true},
		{"a fresh and empty: no engine holds it, so the tree's holder (its home), not the least loaded",
			exactView{"a": {0, true}, "b": {0, true}}, loads(map[string]int{"a": 3}), "a", CacheHit, false},
		{"a's engine holds a short leading run: a, not the least loaded", exactView{"a": {0.2, true}, "b": {0, true}},
			loads(map[string]int{"a": 3}), "a", CacheHit, false},
		{"a stale: the tree scores it, and beats b's exact 0.6", exactView{"a": {0.9, false}, "b": {0.6, true}}, even, "a", CacheHit, false},
		{"the tree's 1.0 and exact 1.0 tie: exact wins", exactView{"b": {1, true}}, even, "b", CacheHit, true},
		{"exact ties go to the less loaded", exactView{"a": {0.7, true}, "b": {0.7, true}},
			loads(map[string]int{"a": 2}), "b", CacheHit, true},
		{"exact at the threshold is no exact hit: the tree's holder", exactView{"a": {0, true}, "b": {0.5, true}},
			loads(map[string]int{"a": 1}), "a", CacheHit, false},
		{"imbalance comes first", exactView{"a": {0, true}, "b": {1, true}},
			loads(map[string]int{"b": 100}), "a", Imbalance, false},
		{"no fresh replica: the tree alone", exactView{}, even, "a", CacheHit, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRouter(t, Config{}, "a", "b")
			r.Insert("m", text, "a")
			d := r.PickWith("m", text, c.load, c.view.fn())
			if d.Addr != c.want || d.Reason != c.reason || d.Exact != c.exact {
				t.Fatalf("got %+v, want %s (%s, exact %v)", d, c.want, c.reason, c.exact)
			}
			if s := r.Stats(); (s.ExactHits == 1) != c.exact {
				t.Fatalf("exact hits: %+v", s)
			}
		})
	}
}

// When no engine holds a leading run above the threshold, the tree's
// holders decide (the prefix's home), the one whose engine holds most
// first; with no tree match either, it is a miss (least load).
func TestPickWithExactAffinity(t *testing.T) {
	text := "a long shared prompt"
	r := newRouter(t, Config{}, "a", "b", "c")
	r.Insert("m", text, "a")
	r.Insert("m", text, "b")
	view := exactView{"a": {0.1, true}, "b": {0.3, true}, "c": {0.4, true}}
	d := r.PickWith("m", text, loads(map[string]int{"b": 2}), view.fn())
	if d.Addr != "b" || d.Reason != CacheHit || d.Exact || !d.Affinity {
		t.Fatalf("holders a and b: got %+v, want b by affinity", d)
	}
	view = exactView{"a": {0.2, true}, "b": {0.2, true}, "c": {0.4, true}}
	d = r.PickWith("m", text, loads(map[string]int{"a": 1, "b": 2}), view.fn())
	if d.Addr != "a" || !d.Affinity {
		t.Fatalf("equal holders: got %+v, want the less loaded a", d)
	}
	d = r.PickWith("m", "something else entirely", loads(map[string]int{"a": 1, "b": 1}), view.fn())
	if d.Addr != "c" || d.Reason != Miss || d.Affinity {
		t.Fatalf("no tree match: got %+v, want a miss to c", d)
	}
	if s := r.Stats(); s.AffinityHits != 2 || s.ExactHits != 0 || s.Hits != 2 || s.Misses != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

// publish feeds the index one BlockStored for tokens as 16-token blocks on
// replica addr (positional vLLM layout), as the listener would.
func publish(t *testing.T, ix *kvevents.Index, addr string, seq uint64, tokens []uint32) {
	t.Helper()
	n := len(tokens) / 16
	hashes, toks := make([]any, n), make([]any, n*16)
	for i := range hashes {
		hashes[i] = uint64(seq*1000) + uint64(i)
	}
	for i := range toks {
		toks[i] = tokens[i]
	}
	payload, err := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", hashes, nil, toks, 16, nil, "GPU"}}})
	if err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	m, err := kvevents.DecodeMessage([][]byte{[]byte("kv@" + addr + "@m"), s[:], payload}, kvevents.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ix.Apply(addr, m, time.Now())
}

func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return strings.Join(w, " ")
}

// With a real index: the picker follows what the engines hold, and a burst
// of a new prefix stays together before the engines' events arrive.
func TestPickerOnEngineEvents(t *testing.T) {
	ix := kvevents.NewIndex(kvevents.Config{})
	p := newPicker(t, "a:1", "b:1")
	p.SetExact(&kvevents.Prefixes{Index: ix, Tokenizer: kvevents.SimTokenizer{}})
	tok := func(s string) []uint32 { v, _ := kvevents.SimTokenizer{}.Tokenize("m", s); return v }

	held := words("held", 64)
	publish(t, ix, "b:1", 1, tok(held))
	publish(t, ix, "a:1", 1, tok(words("other", 16)))

	l := pickFor(t, p, prompt(held))
	if d := l.Replica(); d != "b:1" {
		t.Fatalf("held prompt went to %s", d)
	}
	l.Release(ok)

	burst := words("burst", 64)
	first := pickFor(t, p, prompt(burst))
	second := pickFor(t, p, &lb.Request{Model: "m", Text: burst, Parsed: true, Tokens: 10})
	if first.Replica() != second.Replica() {
		t.Fatalf("a burst of one prefix scattered: %s then %s", first.Replica(), second.Replica())
	}
	first.Release(ok)
	second.Release(ok)
	if s := p.Router().Stats(); s.ExactHits != 2 {
		t.Fatalf("exact hits: %+v", s)
	}
	// Without an exact view the picker is as before.
	p.SetExact(nil)
	if _, err := p.Pick(context.Background(), prompt(held)); err != nil {
		t.Fatal(err)
	}
}

// A prefix whose blocks its home engine evicted (all but the first) goes
// home again, not to the least-loaded replica: no engine holds enough of
// it to route on, and re-caching it where it was keeps it in one cache
// instead of copying it into another's.
func TestPickerSendsAnEvictedPrefixHome(t *testing.T) {
	ix := kvevents.NewIndex(kvevents.Config{})
	p := newPicker(t, "a:1", "b:1")
	p.SetExact(&kvevents.Prefixes{Index: ix, Tokenizer: kvevents.SimTokenizer{}, SpeculateFor: -1})
	tok := func(s string) []uint32 { v, _ := kvevents.SimTokenizer{}.Tokenize("m", s); return v }
	publish(t, ix, "a:1", 1, tok(words("warm", 16)))
	publish(t, ix, "b:1", 1, tok(words("warm", 16)))

	doc := words("doc", 128) // 8 blocks
	first := pickFor(t, p, prompt(doc))
	home := first.Replica()
	// The engine held it, then evicted all but its first block.
	publish(t, ix, home, 2, tok(doc)[:16])
	// home is busier than the other (within the balance thresholds).
	for i := 0; i < 3; i++ {
		defer p.Tracker().AcquireCost(home, 10).Release(ok)
	}
	first.Release(ok)
	l := pickFor(t, p, prompt(doc+" next"))
	defer l.Release(ok)
	if d := l.Replica(); d != home {
		t.Fatalf("the evicted prefix left its home %s for %s (%+v)", home, d, l)
	}
}

// Two instances act as one before the engines' events arrive: b's engine
// holds 80% of a prompt (a shared head), and instance 1 just sent the whole
// prompt to a, whose engine is computing it. Instance 1 sends the next
// copy to a (its own speculative entry says a holds it all); instance 2,
// told of that decision through the shared tree (PeerRouted), does the
// same instead of sending it to b's partial copy.
func TestPeerRoutedCountsAsSpeculation(t *testing.T) {
	tok := func(s string) []uint32 { v, _ := kvevents.SimTokenizer{}.Tokenize("m", s); return v }
	head, doc := words("head", 128), words("head", 128)+" "+words("tail", 32) // 80% shared
	var inst []*Picker
	for range 2 {
		ix := kvevents.NewIndex(kvevents.Config{})
		p := newPicker(t, "a:1", "b:1")
		p.SetExact(&kvevents.Prefixes{Index: ix, Tokenizer: kvevents.SimTokenizer{}})
		publish(t, ix, "a:1", 1, tok(words("warm", 16)))
		publish(t, ix, "b:1", 1, tok(head))
		inst = append(inst, p)
	}
	// Instance 1 routes the prompt as b's engine's partial copy would not
	// have it: b is busy (within the balance thresholds), a is chosen.
	inst[0].Router().Insert("m", doc, "a:1")
	rates, _, routed := (*inst[0].exact.Load()).Lookup(prompt(doc), []string{"a:1", "b:1"})
	if rates[1] <= 0.5 {
		t.Fatalf("b's share %v: the test needs it above the threshold", rates)
	}
	routed("a:1")
	inst[1].PeerRouted("m", doc, "a:1", "", false)
	for i, p := range inst {
		l := pickFor(t, p, prompt(doc))
		if l.Replica() != "a:1" {
			t.Fatalf("instance %d sent the prompt to %s, not where it was just routed", i+1, l.Replica())
		}
		l.Release(ok)
	}
}

// BenchmarkPickerPick4KBExact is BenchmarkPickerPick4KB with kv_events's
// exact view (the sim's tokenizer, an index where every replica published
// recently): the cost the exact view adds to a pick.
func BenchmarkPickerPick4KBExact(b *testing.B) {
	ix := kvevents.NewIndex(kvevents.Config{})
	benchPickerPick(b, func(p *Picker) {
		for i, addr := range p.Router().Addrs() {
			publishBench(b, ix, addr, uint64(i+1))
		}
		p.SetExact(&kvevents.Prefixes{Index: ix, Tokenizer: kvevents.SimTokenizer{}, FreshFor: time.Hour})
	})
}

func publishBench(b *testing.B, ix *kvevents.Index, addr string, seq uint64) {
	toks, _ := kvevents.SimTokenizer{}.Tokenize("m", words(addr, 64))
	hashes, ids := make([]any, 4), make([]any, 64)
	for i := range hashes {
		hashes[i] = seq*100 + uint64(i)
	}
	for i := range ids {
		ids[i] = toks[i]
	}
	payload, _ := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", hashes, nil, ids, 16}}})
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], 1)
	m, err := kvevents.DecodeMessage([][]byte{[]byte("kv@" + addr + "@m"), s[:], payload}, kvevents.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	ix.Apply(addr, m, time.Now())
}

// A prompt no engine holds enough of goes home unless its home is under
// cache pressure (its engine keeps storing again what it evicted) by more
// than MovePressure over the least pressured replica, and that one has
// room (pressure at most RoomPressure): then there.
func TestPickExactMovesOffAPressuredHome(t *testing.T) {
	text := "a long shared prompt"
	view := exactView{"a": {0.2, true}, "b": {0, true}, "c": {0, true}}
	for _, c := range []struct {
		name     string
		pressure map[string]float64
		want     string
		moved    bool
	}{
		{"no pressure known: home", nil, "a", false},
		{"home thrashes, c has room: c", map[string]float64{"a": 0.7, "b": 0.5, "c": 0.02}, "c", true},
		{"within MovePressure: home", map[string]float64{"a": 0.3, "b": 0.2, "c": 0.1}, "a", false},
		{"every cache thrashes: home", map[string]float64{"a": 0.7, "b": 0.5, "c": 0.3}, "a", false},
		{"equally low: the less loaded", map[string]float64{"a": 0.6, "b": 0, "c": 0}, "c", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRouter(t, Config{}, "a", "b", "c")
			r.Insert("m", text, "a")
			var pf PressureFunc
			if c.pressure != nil {
				pf = func(addr string) float64 { return c.pressure[addr] }
			}
			d := r.PickExact("m", text, loads(map[string]int{"b": 1}), view.fn(), pf, nil)
			if d.Addr != c.want || d.Moved != c.moved || d.Affinity == c.moved || d.Reason != CacheHit {
				t.Fatalf("got %+v, want %s (moved %v)", d, c.want, c.moved)
			}
			if s := r.Stats(); (s.Moves == 1) != c.moved || (s.AffinityHits == 1) == c.moved {
				t.Fatalf("stats: %+v", s)
			}
		})
	}
	// An engine that holds enough decides, whatever its pressure.
	r := newRouter(t, Config{}, "a", "b")
	r.Insert("m", text, "b")
	d := r.PickExact("m", text, nil, exactView{"a": {0.9, true}, "b": {0, true}}.fn(),
		func(addr string) float64 { return map[string]float64{"a": 1}[addr] }, nil)
	if d.Addr != "a" || !d.Exact || d.Moved {
		t.Fatalf("exact hit: %+v", d)
	}
}

// events feeds the index one batch of events on replica addr, with the
// replica's next sequence number (seqs holds them).
func events(t *testing.T, ix *kvevents.Index, seqs map[string]uint64, addr string, evs ...[]any) {
	t.Helper()
	batch := make([]any, len(evs))
	for i, e := range evs {
		batch[i] = e
	}
	payload, err := msgpack.Marshal([]any{1.0, batch})
	if err != nil {
		t.Fatal(err)
	}
	seqs[addr]++
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seqs[addr])
	m, err := kvevents.DecodeMessage([][]byte{[]byte("kv@" + addr + "@m"), s[:], payload}, kvevents.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ix.Apply(addr, m, time.Now())
}

// stored is a BlockStored of tokens as 16-token blocks hashed base, base+1...
func stored(base uint64, parent any, tokens []uint32) []any {
	n := len(tokens) / 16
	hs, toks := make([]any, n), make([]any, n*16)
	for i := range hs {
		hs[i] = base + uint64(i)
	}
	for i := range toks {
		toks[i] = tokens[i]
	}
	return []any{"BlockStored", hs, parent, toks, 16, nil, "GPU"}
}

func removed(hashes ...uint64) []any {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return []any{"BlockRemoved", hs, "GPU"}
}

// With the real index: a replica whose engine keeps evicting and storing
// again the same blocks is under pressure, and a prefix its home lost
// moves to the replica with room; without that pressure it goes home.
func TestPickerMovesAnEvictedPrefixOffAThrashingHome(t *testing.T) {
	for _, thrash := range []bool{false, true} {
		t.Run(fmt.Sprint("thrash=", thrash), func(t *testing.T) {
			ix := kvevents.NewIndex(kvevents.Config{})
			p := newPicker(t, "a:1", "b:1")
			p.SetExact(&kvevents.Prefixes{Index: ix, Tokenizer: kvevents.SimTokenizer{}, SpeculateFor: -1})
			tok := func(s string) []uint32 { v, _ := kvevents.SimTokenizer{}.Tokenize("m", s); return v }
			doc := words("doc", 128) // 8 blocks
			first := pickFor(t, p, prompt(doc))
			home, other := first.Replica(), "a:1"
			if home == other {
				other = "b:1"
			}
			first.Release(ok)
			seqs := map[string]uint64{}
			events(t, ix, seqs, other, stored(500, nil, tok(words("cold", 64))))
			// home stored doc, then evicted all but its first block; if it
			// thrashes, it stored them again and evicted them again.
			dt := tok(doc)
			events(t, ix, seqs, home, stored(100, nil, dt))
			rest := []uint64{101, 102, 103, 104, 105, 106, 107}
			events(t, ix, seqs, home, removed(rest...))
			if thrash {
				events(t, ix, seqs, home, stored(101, uint64(100), dt[16:]))
				events(t, ix, seqs, home, removed(rest...))
			}
			l := pickFor(t, p, prompt(doc+" next"))
			defer l.Release(ok)
			d := l.Replica()
			if want := map[bool]string{false: home, true: other}[thrash]; d != want {
				t.Fatalf("went to %s, want %s (home %s): %+v", d, want, home, p.Router().Stats())
			}
		})
	}
}
