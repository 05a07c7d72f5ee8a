// Package lbtest is the conformance suite every load-balancing policy's
// lb.Picker runs (as the Gateway API Inference Extension runs one against
// every flow-control plugin): exactly-once release under retries,
// cancellation, replica removal and reconfiguration, Unavailable
// respected, state and leases kept across a reload, a new setting applied.
package lbtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Subject is the policy under test.
type Subject struct {
	// New returns a fresh picker with no replicas; register its cleanup
	// with t.Cleanup.
	New func(t *testing.T) lb.Picker
	// Reconfigure applies a changed setting to p in place, as a config
	// reload does; Applied reports whether p now runs with it. Both nil:
	// the setting check is skipped.
	Reconfigure func(t *testing.T, p lb.Picker)
	Applied     func(p lb.Picker) bool
}

// guard bounds every Pick: a broken picker fails the test, never hangs it.
const guard = 5 * time.Second

var replicas = []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}

// Run runs the suite.
func Run(t *testing.T, s Subject) {
	t.Run("EmptyPoolRefusesAtOnce", func(t *testing.T) {
		p := s.New(t)
		if _, err := pick(p, &lb.Request{}); !errors.Is(err, lb.ErrNoBackends) {
			t.Fatalf("empty pool: %v, want ErrNoBackends", err)
		}
	})
	t.Run("PicksPresentReplicasAndReleasesExactlyOnce", func(t *testing.T) {
		p := s.New(t)
		p.SetReplicas(replicas)
		var leases []lb.Lease
		for i := 0; i < 6; i++ {
			l, err := pick(p, &lb.Request{})
			if err != nil {
				t.Fatalf("pick %d: %v", i, err)
			}
			if !slices.Contains(replicas, l.Replica()) {
				t.Fatalf("picked %q, not a replica", l.Replica())
			}
			leases = append(leases, l)
		}
		if n := total(p); n != 6 {
			t.Fatalf("in flight %d after 6 picks, want 6", n)
		}
		for _, l := range leases {
			if !l.Release(success()) {
				t.Fatal("first Release returned false")
			}
			if l.Release(success()) {
				t.Fatal("second Release returned true")
			}
		}
		zero(t, p)
	})
	t.Run("RetryReleasesThePreviousAttempt", func(t *testing.T) {
		p := s.New(t)
		p.SetReplicas(replicas)
		req := &lb.Request{}
		first, err := pick(p, req)
		if err != nil {
			t.Fatal(err)
		}
		first.Release(lb.Outcome{Kind: lb.Failure})
		req.Attempt++
		second, err := pick(p, req)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		second.Release(success())
		zero(t, p)
	})
	t.Run("CancelledContextLeaksNothing", func(t *testing.T) {
		p := s.New(t)
		p.SetReplicas(replicas)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if l, err := p.Pick(ctx, &lb.Request{}); err == nil {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
		zero(t, p)
	})
	t.Run("RemovedReplicaIsNeverPickedAndStillReleases", func(t *testing.T) {
		p := s.New(t)
		p.SetReplicas(replicas)
		var held []lb.Lease
		for i := 0; i < 6; i++ {
			l, err := pick(p, &lb.Request{})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		p.SetReplicas(replicas[1:])
		for i := 0; i < 6; i++ {
			l, err := pick(p, &lb.Request{})
			if err != nil {
				t.Fatal(err)
			}
			if l.Replica() == replicas[0] {
				t.Fatalf("picked the removed replica %s", replicas[0])
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Release(success())
		}
		zero(t, p)
	})
	t.Run("UnavailableReplicasAreNeverPicked", func(t *testing.T) {
		p := s.New(t)
		p.SetReplicas(replicas)
		var held []lb.Lease
		for i := 0; i < 6; i++ {
			l, err := pick(p, &lb.Request{Unavailable: replicas[:2]})
			if err != nil {
				t.Fatal(err)
			}
			if l.Replica() != replicas[2] {
				t.Fatalf("picked %s, which the proxy marked unavailable", l.Replica())
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Release(success())
		}
		if _, err := pick(p, &lb.Request{Unavailable: replicas}); !errors.Is(err, lb.ErrAllDown) {
			t.Fatalf("every replica unavailable: %v, want ErrAllDown", err)
		}
		if l, err := pick(p, &lb.Request{}); err != nil {
			t.Fatalf("available again: %v", err)
		} else {
			l.Release(success())
		}
		zero(t, p)
	})
	t.Run("ReloadKeepsLeasesAndAppliesTheSetting", func(t *testing.T) {
		if s.Reconfigure == nil {
			t.Skip("the subject has no setting to change")
		}
		p := s.New(t)
		p.SetReplicas(replicas)
		l, err := pick(p, &lb.Request{})
		if err != nil {
			t.Fatal(err)
		}
		s.Reconfigure(t, p)
		if !s.Applied(p) {
			t.Fatal("the new setting is not in force")
		}
		if n := total(p); n != 1 {
			t.Fatalf("in flight %d across the reload, want 1", n)
		}
		l.Release(success())
		zero(t, p)
	})
	t.Run("ChurnEndsAtZero", func(t *testing.T) {
		p := s.New(t)
		p.SetReplicas(replicas)
		stop := make(chan struct{})
		var churn sync.WaitGroup
		churn.Add(1)
		go func() {
			defer churn.Done()
			sets := [][]string{replicas, replicas[1:], replicas[:2], {replicas[2]}}
			for i := 0; ; i++ {
				select {
				case <-stop:
					p.SetReplicas(replicas)
					return
				default:
				}
				p.SetReplicas(sets[i%len(sets)])
				time.Sleep(time.Millisecond)
			}
		}()
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100; i++ {
					req := &lb.Request{}
					l, err := pick(p, req)
					if err != nil {
						continue // refusals are allowed under churn; leaks are not
					}
					l.Release(randomOutcome())
					l.Release(randomOutcome()) // a double release must not count
				}
			}()
		}
		wg.Wait()
		close(stop)
		churn.Wait()
		zero(t, p)
	})
}

func pick(p lb.Picker, req *lb.Request) (lb.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	return p.Pick(ctx, req)
}

func success() lb.Outcome {
	return lb.Outcome{Kind: lb.Success, Latency: 10 * time.Millisecond, Status: 200}
}

func randomOutcome() lb.Outcome {
	switch rand.IntN(3) {
	case 0:
		return success()
	case 1:
		return lb.Outcome{Kind: lb.Cancelled}
	default:
		return lb.Outcome{Kind: lb.Failure, Status: 503}
	}
}

func total(p lb.Picker) int {
	n := 0
	for _, c := range p.InFlight() {
		n += c
	}
	return n
}

func zero(t *testing.T, p lb.Picker) {
	t.Helper()
	if m := p.InFlight(); total(p) != 0 {
		t.Fatalf("leases not released: %s", fmt.Sprint(m))
	}
}
