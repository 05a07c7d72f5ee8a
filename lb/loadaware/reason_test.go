package loadaware

import (
	"context"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// The first pick is the scorers' ranking; a retry takes the next replica
// of that ranking (max_num_endpoints keeps it) and says so.
func TestPickSaysScoreThenFallback(t *testing.T) {
	p := NewPicker(PickerConfig{Policy: Config{MaxNumEndpoints: 2}})
	p.SetReplicas([]string{"a:1", "b:1"})
	req := &lb.Request{}
	first, err := p.Pick(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if req.Reason != lb.ReasonScore {
		t.Fatalf("first pick: reason %q, want %q", req.Reason, lb.ReasonScore)
	}
	first.Release(lb.Outcome{Kind: lb.Failure})
	req.Attempt++
	second, err := p.Pick(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	second.Release(lb.Outcome{Kind: lb.Cancelled})
	if req.Reason != lb.ReasonFallback || second.Replica() == first.Replica() {
		t.Fatalf("retry: reason %q on %s (first on %s), want %q on the other replica",
			req.Reason, second.Replica(), first.Replica(), lb.ReasonFallback)
	}
}
