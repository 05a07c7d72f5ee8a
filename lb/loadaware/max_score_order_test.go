package loadaware

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// maxScoreOrderReference is the order maxScoreOrder must give: k times,
// the best candidate not taken yet (a higher total, then the smaller
// LastPick). Candidates here have no two equal (total, LastPick) pairs,
// so no tie is broken at random and the order is one.
func maxScoreOrderReference(total []float64, cs []Candidate, k int) []int {
	idx := make([]int, len(total))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case total[a] != total[b]:
			if total[a] > total[b] {
				return -1
			}
			return 1
		case cs[a].LastPick != cs[b].LastPick:
			if cs[a].LastPick < cs[b].LastPick {
				return -1
			}
			return 1
		}
		return 0
	})
	return idx[:min(k, len(idx))]
}

// The fallback order (max_num_endpoints above 1) is the max-score order
// whatever k and the pool's size, from k = 1 to the whole pool.
func TestMaxScoreOrderIsTheRankingForEveryK(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 5, 17, 64, 300} {
		total := make([]float64, n)
		cs := make([]Candidate, n)
		for i := range total {
			total[i] = float64(r.IntN(8)) // equal totals, told apart by LastPick
			cs[i].LastPick = uint64(r.IntN(n)*n + i)
		}
		for _, k := range []int{1, 2, 3, n / 2, n, n + 3} {
			if k < 1 {
				continue
			}
			got := maxScoreOrder(total, cs, k, nil)
			if want := maxScoreOrderReference(total, cs, k); !slices.Equal(got, want) {
				t.Fatalf("n %d, k %d: order %v, want %v", n, k, got, want)
			}
		}
	}
}

// BenchmarkMaxScoreOrder is the fallback order's cost as max_num_endpoints
// grows with the pool (the pick ranks every candidate once per place).
func BenchmarkMaxScoreOrder(b *testing.B) {
	for _, n := range []int{4, 64, 256, 1024} {
		r := rand.New(rand.NewPCG(3, 4))
		total := make([]float64, n)
		cs := make([]Candidate, n)
		for i := range total {
			total[i] = r.Float64()
			cs[i].LastPick = uint64(i)
		}
		order := make([]int, 0, n)
		b.Run(fmt.Sprintf("k=n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				order = maxScoreOrder(total, cs, n, order)
			}
		})
	}
}
