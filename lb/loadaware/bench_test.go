package loadaware

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// BenchmarkPickRelease4 is the whole per-request cost of the picker on a
// tiny request over 4 replicas (what the proxy overhead scenario sends):
// scoring, the lease, and its release.
//
//	go test -run '^$' -bench PickRelease4 -benchmem ./lb/loadaware/
func BenchmarkPickRelease4(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  Config
	}{
		{"default", Config{}},
		{"heimdall", Config{Preset: PresetHeimdall}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pk := NewPicker(PickerConfig{Policy: bc.cfg})
			addrs := make([]string, 4)
			for i := range addrs {
				addrs[i] = fmt.Sprintf("127.0.0.1:%d", 9000+i)
			}
			pk.SetReplicas(addrs)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := lb.Request{Model: "m", Text: "x", Parsed: true, Tokens: 2}
				l, err := pk.Pick(ctx, &req)
				if err != nil {
					b.Fatal(err)
				}
				l.Release(lb.Outcome{Kind: lb.Success})
			}
		})
	}
}

// Session tokens are cached per replica; the cache must follow the key and
// the set, and an address outside the set still gets its (computed) token.
func TestSessionTokensFollowKeyAndSet(t *testing.T) {
	pk := NewPicker(PickerConfig{SessionKey: "a"})
	pk.SetReplicas([]string{"10.0.0.1:80", "10.0.0.2:80"})
	t1, t2 := pk.SessionToken("10.0.0.1:80"), pk.SessionToken("10.0.0.2:80")
	if t1 == t2 || t1 != pk.computeToken("10.0.0.1:80") {
		t.Fatalf("tokens %q %q", t1, t2)
	}
	if got := pk.sessionAddr(t2); got != "10.0.0.2:80" {
		t.Fatalf("token of 10.0.0.2 resolves to %q", got)
	}
	if err := pk.Configure(PickerConfig{SessionKey: "b"}); err != nil {
		t.Fatal(err)
	}
	if nt := pk.SessionToken("10.0.0.1:80"); nt == t1 || nt != pk.computeToken("10.0.0.1:80") {
		t.Fatalf("after a key change the cached token stayed: %q", nt)
	}
	if pk.sessionAddr(t1) != "" {
		t.Fatal("a token of the old key still resolves")
	}
	pk.SetReplicas([]string{"10.0.0.3:80"})
	if pk.SessionToken("10.0.0.1:80") != pk.computeToken("10.0.0.1:80") {
		t.Fatal("a replica no longer in the set gets a different token")
	}
}

// Explain gets a ranking only while Explaining says it is wanted, and then
// with every enabled scorer's scores.
func TestExplainOnlyWhenWanted(t *testing.T) {
	pk := NewPicker(PickerConfig{})
	pk.SetReplicas([]string{"10.0.0.1:80", "10.0.0.2:80"})
	var got []Explanation
	want := false
	pk.Explain = func(e Explanation) { got = append(got, e) }
	pk.Explaining = func() bool { return want }
	pick := func() {
		l, err := pk.Pick(context.Background(), &lb.Request{})
		if err != nil {
			t.Fatal(err)
		}
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	pick()
	if len(got) != 0 {
		t.Fatalf("explained %d picks while not wanted", len(got))
	}
	want = true
	pick()
	if len(got) != 1 || len(got[0].Rank.Scores[ActiveRequest]) != 2 || len(got[0].Rank.Scores[ActiveTokens]) != 2 {
		t.Fatalf("explanations %+v, want one with both default scorers' scores", got)
	}
}
