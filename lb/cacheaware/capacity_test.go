package cacheaware

import (
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// A miss goes to the replica whose tree is the smallest in proportion to
// its engine's KV capacity (load breaks ties) once every usable replica's
// capacity is known; while any is unknown, among the least loaded to the
// smallest tree.
func TestMissFillsCachesInProportionToCapacity(t *testing.T) {
	miss := strings.Repeat("z", 50)
	for _, c := range []struct {
		name     string
		capacity map[string]int // absent: unknown
		load     map[string]int
		cUp      bool // c (the largest tree, capacity unknown) usable
		want     string
	}{
		{"no capacity known: the smallest tree", nil, nil, false, "a"},
		{"b's cache is three times a's: b has more room per block", map[string]int{"a": 100, "b": 300}, nil, false, "b"},
		{"equal caches: the smallest tree", map[string]int{"a": 200, "b": 200}, nil, false, "a"},
		{"b's capacity unknown: the smallest tree", map[string]int{"a": 100}, nil, false, "a"},
		{"a zero capacity is unknown", map[string]int{"a": 100, "b": 0}, nil, false, "a"},
		{"sizes known: room comes before load", map[string]int{"a": 100, "b": 300}, map[string]int{"b": 1}, false, "b"},
		{"sizes unknown: load comes first", nil, map[string]int{"a": 1}, false, "b"},
		{"equal room: the less loaded", map[string]int{"a": 100, "b": 200}, map[string]int{"a": 1}, false, "b"},
		{"a usable replica of unknown capacity: the smallest tree", map[string]int{"a": 100, "b": 300}, nil, true, "a"},
		// Room never overrides the imbalance guard: b has the room but
		// 33 more in flight than a (the default absolute threshold is 32).
		{"imbalanced: the least loaded, whatever the room", map[string]int{"a": 100, "b": 300}, map[string]int{"b": 33}, false, "a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRouter(t, Config{}, "a", "b", "c")
			r.Insert("m", strings.Repeat("x", 100), "a")
			r.Insert("m", strings.Repeat("y", 200), "b")
			r.Insert("m", strings.Repeat("w", 400), "c")
			load := func(addr string) (int, bool) {
				return c.load[addr], addr != "c" || c.cUp
			}
			var cf CapacityFunc
			if c.capacity != nil {
				cf = func(addr string) (int, bool) { n, ok := c.capacity[addr]; return n, ok }
			}
			d := r.PickExact("m", miss, load, nil, nil, cf)
			if d.Addr != c.want || (d.Reason != Miss && d.Reason != Imbalance) {
				t.Fatalf("got %+v, want %s (miss)", d, c.want)
			}
		})
	}
}

// The picker consults the capacity source it was given, and tells it the
// replica set (a scraper needs the URLs).
func TestPickerCapacitySource(t *testing.T) {
	pk := NewPicker(Config{}, tracker.Config{})
	src := &fakeCapacity{tokens: map[string]int{"a": 100, "b": 300}}
	pk.SetCapacity(src)
	pk.SetBackends([]lb.Backend{{URL: "http://a", Dial: "a"}, {URL: "https://b", Dial: "b"}})
	if len(src.set) != 2 || src.set[1].URL != "https://b" {
		t.Fatalf("capacity source got %+v", src.set)
	}
	pk.Router().Insert("m", strings.Repeat("x", 100), "a")
	pk.Router().Insert("m", strings.Repeat("y", 200), "b")
	l, err := pk.Pick(t.Context(), &lb.Request{Model: "m", Text: strings.Repeat("z", 50), Parsed: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(lb.Outcome{})
	if got := l.Replica(); got != "b" {
		t.Fatalf("picked %s, want b (the room per block of capacity)", got)
	}
	// SetCapacity after the set: the source gets it at once.
	late := &fakeCapacity{}
	pk.SetCapacity(late)
	if len(late.set) != 2 {
		t.Fatalf("late source got %+v", late.set)
	}
}

type fakeCapacity struct {
	tokens map[string]int
	set    []lb.Backend
}

func (f *fakeCapacity) Tokens(addr string) (int, bool) { n, ok := f.tokens[addr]; return n, ok }
func (f *fakeCapacity) SetBackends(set []lb.Backend)   { f.set = set }
