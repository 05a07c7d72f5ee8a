package cacheaware

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkInsertWideRoot: one insert of a one-character prompt into a full
// tree whose root has 100k children, one per distinct first character (a
// hostile client's prompts), so every insert also evicts one of them: the
// cost of adding and removing a child of a wide node under the write lock.
func BenchmarkInsertWideRoot(b *testing.B) {
	const width = 100_000
	runes := distinctRunes(2 * width)
	rand.New(rand.NewPCG(3, 3)).Shuffle(len(runes), func(i, j int) { runes[i], runes[j] = runes[j], runes[i] })
	r := New(Config{MaxTreeSize: width})
	r.SetReplicas([]string{"a"})
	for _, c := range runes[:width] {
		r.Insert("m", string(c), "a")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		// The least recently inserted rune is evicted; runes come back
		// round only long after they left.
		r.Insert("m", string(runes[(width+i)%len(runes)]), "a")
	}
	b.StopTimer()
	if s := r.Stats(); s.Nodes != width {
		b.Fatalf("tree holds %d nodes, want %d", s.Nodes, width)
	}
}
