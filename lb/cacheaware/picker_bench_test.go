package cacheaware

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// BenchmarkPickerPick4KB: one request through the Picker (pick, acquire,
// insert, release) for a 4 KB prompt whose system prompt is in the tree.
func BenchmarkPickerPick4KB(b *testing.B) {
	benchPickerPick(b, func(*Picker) {})
}

func benchPickerPick(b *testing.B, setup func(*Picker)) {
	rng := rand.New(rand.NewPCG(7, 7))
	p := NewPicker(Config{}, tracker.Config{})
	p.SetReplicas(benchAddrs())
	sys := systemPrompts(rng)
	fill(p.Router(), rng, sys, 100_000)
	setup(p)
	texts := make([]string, 64)
	for i := range texts {
		texts[i] = sys[i] + randText(rng, 4096-len(sys[i]))
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		req := &lb.Request{Model: "model", Text: texts[i%len(texts)], Parsed: true}
		l, err := p.Pick(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(lb.Outcome{})
	}
}
