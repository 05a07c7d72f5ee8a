package sim

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fakeLine drives a prefillLine on a fake clock: sleep advances the clock,
// starting and ending the scripted prefills on the way, and returns early
// when its channel is closed by a prefill's end.
type fakeLine struct {
	t      *testing.T
	pl     *prefillLine
	base   time.Time
	cur    time.Duration
	events []fakePrefill // in time order
}

type fakePrefill struct {
	at    time.Duration
	start bool // start a prefill; false: end the running one
}

func newFakeLine(t *testing.T, events ...fakePrefill) *fakeLine {
	f := &fakeLine{t: t, pl: newPrefillLine(), base: time.Unix(1000, 0), events: events}
	f.pl.now = func() time.Time { return f.base.Add(f.cur) }
	return f
}

// prefill scripts a prefill running from start to end (offsets from 0).
func prefill(start, end time.Duration) []fakePrefill {
	return []fakePrefill{{at: start, start: true}, {at: end}}
}

func (f *fakeLine) advance(to time.Duration, ch <-chan struct{}) bool {
	for len(f.events) > 0 && f.events[0].at <= to {
		ev := f.events[0]
		f.events = f.events[1:]
		f.cur = ev.at
		if ev.start {
			if err := f.pl.acquire(context.Background(), nil); err != nil {
				f.t.Fatal(err)
			}
		} else {
			f.pl.release()
		}
		if ch != nil {
			select {
			case <-ch:
				return true
			default:
			}
		}
	}
	f.cur = to
	return false
}

func (f *fakeLine) sleep(d time.Duration, ch <-chan struct{}) error {
	if d >= forever {
		if !f.advance(1<<61, ch) {
			f.t.Fatal("decode waits for a prefill that never ends")
		}
		return nil
	}
	f.advance(f.cur+d, ch)
	return nil
}

// TestPrefillBlocksDecodeArithmetic checks, on a fake clock, that a decode
// wait is stretched by exactly the prefill time overlapping it.
func TestPrefillBlocksDecodeArithmetic(t *testing.T) {
	ms := time.Millisecond
	cat := func(ps ...[]fakePrefill) (out []fakePrefill) {
		for _, p := range ps {
			out = append(out, p...)
		}
		return out
	}
	cases := []struct {
		name      string
		events    []fakePrefill
		d         time.Duration
		wantEnd   time.Duration
		wantStall time.Duration
	}{
		{"no prefill", nil, 50 * ms, 50 * ms, 0},
		{"long prefill arrives mid-decode", prefill(30*ms, 130*ms), 50 * ms, 150 * ms, 100 * ms},
		{"prefill running when the decode starts", prefill(0, 100*ms), 20 * ms, 120 * ms, 100 * ms},
		{"prefills back to back", cat(prefill(10*ms, 60*ms), prefill(60*ms, 110*ms), prefill(300*ms, 310*ms)), 100 * ms, 200 * ms, 100 * ms},
		{"prefill after the decode", prefill(60*ms, 90*ms), 50 * ms, 50 * ms, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeLine(t, c.events...)
			f.advance(0, nil) // events at time 0
			var dc decodeClock
			if err := f.pl.decodeWait(f.sleep, &dc, c.d, 1); err != nil {
				t.Fatal(err)
			}
			if f.cur != c.wantEnd || dc.stall != c.wantStall || f.pl.stats().stall != c.wantStall {
				t.Errorf("decode of %v ended at %v with stall %v (line %v), want %v and %v",
					c.d, f.cur, dc.stall, f.pl.stats().stall, c.wantEnd, c.wantStall)
			}
		})
	}

	t.Run("prefill while a chunk is sent", func(t *testing.T) {
		// Chunk 1 decodes 0..10ms; a prefill runs 11..14ms while the
		// chunk is being sent (until 15ms); chunk 2 then decodes for its
		// 10ms plus the 3ms of prefill.
		f := newFakeLine(t, prefill(11*ms, 14*ms)...)
		var dc decodeClock
		if err := f.pl.decodeWait(f.sleep, &dc, 10*ms, 1); err != nil || f.cur != 10*ms {
			t.Fatalf("chunk 1 ended at %v (%v)", f.cur, err)
		}
		f.advance(15*ms, nil)
		if err := f.pl.decodeWait(f.sleep, &dc, 10*ms, 1); err != nil || f.cur != 28*ms || dc.stall != 3*ms {
			t.Errorf("chunk 2 ended at %v with stall %v (%v), want 28ms and 3ms", f.cur, dc.stall, err)
		}
	})

	t.Run("first token is not paused", func(t *testing.T) {
		// The first token comes with the request's own prefill: a chunk of
		// no decode steps does not wait for another request's prefill.
		f := newFakeLine(t, prefill(0, 100*ms)...)
		f.advance(0, nil)
		var dc decodeClock
		if err := f.pl.decodeWait(f.sleep, &dc, 0, 0); err != nil || f.cur != 0 {
			t.Errorf("first chunk ended at %v (%v), want 0", f.cur, err)
		}
		if err := f.pl.decodeWait(f.sleep, &dc, 5*ms, 1); err != nil || f.cur != 105*ms || dc.stall != 100*ms {
			t.Errorf("second chunk ended at %v with stall %v (%v), want 105ms and 100ms", f.cur, dc.stall, err)
		}
	})

	t.Run("cancelled while paused", func(t *testing.T) {
		f := newFakeLine(t, prefill(0, 100*ms)...)
		f.advance(0, nil)
		var dc decodeClock
		gone := func(time.Duration, <-chan struct{}) error { return context.Canceled }
		if err := f.pl.decodeWait(gone, &dc, 5*ms, 1); err != context.Canceled {
			t.Errorf("decodeWait = %v, want context.Canceled", err)
		}
	})
}

// readEvent reads one SSE event ("data: ...") from a stream.
func readEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "data: "))
		}
	}
}

// tokensPrompt is a completion body whose prompt counts n tokens.
func tokensPrompt(n, maxTokens int, stream bool) string {
	return fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"stream":%v}`, strings.Repeat("abcd", n), maxTokens, stream)
}

func TestPrefillBlocksDecodeDelaysRunningDecode(t *testing.T) {
	const (
		prefillPerToken = 100 * time.Microsecond
		longPrompt      = 1000 // tokens: a 100ms prefill
	)
	h := startSim(t, Config{
		Concurrency:         4,
		Latency:             Latency{Kind: LatencyPerToken, Prefill: prefillPerToken, Decode: 2 * time.Millisecond},
		PrefillBlocksDecode: true,
	})
	rp := h.srv.Replica()

	// A short request streams 250 tokens (about 500ms of decode).
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL()+"/v1/completions", strings.NewReader(tokensPrompt(1, 250, true)))
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	readEvent(t, br) // its first token: it is decoding now

	// A heavy request arrives while it decodes.
	long := recv(t, h.goDo(context.Background(), "/v1/completions", tokensPrompt(longPrompt, 1, false)))
	if long.status != http.StatusOK {
		t.Fatalf("long request: %d %s", long.status, long.body)
	}
	events := 1
	for readEvent(t, br) != "[DONE]" {
		events++
	}
	if events != 250 {
		t.Errorf("short request streamed %d events, want 250", events)
	}

	st := rp.Stats()
	// The short request's decode was paused for the whole long prefill
	// (its decode outlasts the moment the long request arrived).
	if want := longPrompt * prefillPerToken; st.DecodeStall < want {
		t.Errorf("DecodeStall = %v, want at least the long prefill %v", st.DecodeStall, want)
	}
	if st.MaxPrefilling != 1 || st.Prefills != 2 || st.Prefilling != 0 || st.PrefillWaiting != 0 {
		t.Errorf("prefill stats %+v", st)
	}
	m := rp.MetricsText()
	if !strings.Contains(m, "sim_decode_stall_seconds_total{") || !strings.Contains(m, `sim_prefilling{replica="sim"} 0`) {
		t.Errorf("metrics lack the prefill line:\n%s", m)
	}
}

func TestPrefillBlocksDecodeOnePrefillAtATime(t *testing.T) {
	h := startSim(t, Config{
		Concurrency:         8,
		Latency:             Latency{Kind: LatencyPerToken, Prefill: 10 * time.Microsecond, Decode: 100 * time.Microsecond},
		PrefillBlocksDecode: true,
	})
	rp := h.srv.Replica()
	var pending []<-chan simResult
	for i := range 8 {
		pending = append(pending, h.goDo(context.Background(), "/v1/completions", tokensPrompt(2000, 4, i%2 == 0)))
	}
	for _, ch := range pending {
		if r := recv(t, ch); r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	if st := rp.Stats(); st.MaxPrefilling != 1 || st.Prefills != 8 || st.Served != 8 {
		t.Errorf("stats %+v, want MaxPrefilling 1 and 8 prefills", st)
	}
}

func TestPrefillBlocksDecodeCancellation(t *testing.T) {
	h := startSim(t, Config{
		Concurrency:         4,
		Latency:             Latency{Kind: LatencyPerToken, Prefill: 10 * time.Millisecond, Decode: time.Microsecond},
		PrefillBlocksDecode: true,
	})
	rp := h.srv.Replica()

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	a := h.goDo(ctxA, "/v1/completions", tokensPrompt(100000, 1, false)) // a 1000s prefill
	waitFor(t, "A prefilling", func() bool { return rp.Stats().Prefilling == 1 })
	b := h.goDo(context.Background(), "/v1/completions", tokensPrompt(1, 2, false))
	waitFor(t, "B waiting to prefill", func() bool { return rp.Stats().PrefillWaiting == 1 })
	ctxC, cancelC := context.WithCancel(context.Background())
	defer cancelC()
	c := h.goDo(ctxC, "/v1/completions", tokensPrompt(1, 2, false))
	waitFor(t, "C waiting to prefill", func() bool { return rp.Stats().PrefillWaiting == 2 })
	if st := rp.Stats(); st.Running != 3 || st.Waiting != 0 {
		t.Errorf("running/waiting %d/%d, want 3/0 (waiting to prefill is running)", st.Running, st.Waiting)
	}
	if m := rp.MetricsText(); !strings.Contains(m, `sim_prefill_waiting{replica="sim"} 2`+"\n") {
		t.Errorf("metrics:\n%s", m)
	}

	cancelC() // a waiter leaves the prefill line
	recv(t, c)
	waitFor(t, "C gone", func() bool { return rp.Stats().PrefillWaiting == 1 })
	cancelA() // the running prefill ends at once: B's turn
	recv(t, a)
	if r := recv(t, b); r.status != http.StatusOK {
		t.Fatalf("B: %d %s", r.status, r.body)
	}
	waitFor(t, "requests accounted", func() bool { st := rp.Stats(); return st.Cancelled == 2 && st.Running == 0 })
	if st := rp.Stats(); st.Served != 1 || st.Prefills != 2 || st.MaxPrefilling != 1 || st.Prefilling != 0 || st.PrefillWaiting != 0 {
		t.Errorf("stats %+v", st)
	}
}

// kvState reports whether Stats shows these running, waiting and KV tokens.
func kvState(rp *Replica, running, waiting, tokens int) func() bool {
	return func() bool {
		st := rp.Stats()
		return st.Running == running && st.Waiting == waiting && st.KVTokens == tokens
	}
}

// kvWant checks the KV counters of Stats and the usage metrics.
func kvWant(t *testing.T, rp *Replica, running, waiting, tokens int) {
	t.Helper()
	st := rp.Stats()
	if st.Running != running || st.Waiting != waiting || st.KVTokens != tokens {
		t.Errorf("running/waiting/KV tokens = %d/%d/%d, want %d/%d/%d", st.Running, st.Waiting, st.KVTokens, running, waiting, tokens)
	}
	usage := min(float64(tokens)/float64(st.KVCapacityTokens), 1)
	m := rp.MetricsText()
	for _, want := range []string{
		fmt.Sprintf(`vllm:kv_cache_usage_perc{model_name="sim-model"} %v`, usage),
		fmt.Sprintf(`vllm:gpu_cache_usage_perc{model_name="sim-model"} %v`, usage),
		fmt.Sprintf(`vllm:num_requests_waiting{model_name="sim-model"} %d`, waiting),
		fmt.Sprintf(`sim_kv_tokens{replica="sim"} %d`, tokens),
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestKVCapacityAdmission(t *testing.T) {
	// Every request stalls, holding its slot and prompt tokens, until the
	// stalls are cleared: the counts are exact.
	h := startSim(t, Config{
		Concurrency:      8,
		KVCapacityTokens: 100,
		Latency:          Latency{Kind: LatencyPerToken},
		Faults:           Faults{StallRate: 1, Stall: time.Hour},
	})
	rp := h.srv.Replica()
	start := func(tokens int) (<-chan simResult, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		return h.goDo(ctx, "/v1/completions", tokensPrompt(tokens, 2, false)), cancel
	}

	a, cancelA := start(60)
	waitFor(t, "A running", func() bool { return rp.Stats().Running == 1 })
	kvWant(t, rp, 1, 0, 60)
	b, cancelB := start(50) // 60 + 50 > 100: waits
	waitFor(t, "B waiting", func() bool { return rp.Stats().Waiting == 1 })
	c, _ := start(10) // would fit, but FIFO: waits behind B
	waitFor(t, "C waiting", func() bool { return rp.Stats().Waiting == 2 })
	kvWant(t, rp, 1, 2, 60)

	cancelB() // the head leaves: C fits now
	recv(t, b)
	waitFor(t, "C running", kvState(rp, 2, 0, 70))
	kvWant(t, rp, 2, 0, 70)

	d, _ := start(50) // 70 + 50 > 100: waits
	waitFor(t, "D waiting", func() bool { return rp.Stats().Waiting == 1 })
	cancelA() // A ends: D fits next to C
	recv(t, a)
	waitFor(t, "D running", kvState(rp, 2, 0, 60))
	kvWant(t, rp, 2, 0, 60)

	if err := rp.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if sc, sd := seqOf(t, recv(t, c)), seqOf(t, recv(t, d)); sc != 2 || sd != 3 {
		t.Errorf("C got slot #%d and D #%d, want 2 and 3", sc, sd)
	}
	waitFor(t, "all done", func() bool { return rp.Stats().Running == 0 })
	kvWant(t, rp, 0, 0, 0) // generated tokens are given back too
	if st := rp.Stats(); st.Served != 2 || st.Cancelled != 2 || st.MaxRunning != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestKVCapacityOversizedPromptRunsAlone(t *testing.T) {
	h := startSim(t, Config{
		Concurrency:      8,
		KVCapacityTokens: 100,
		Faults:           Faults{StallRate: 1, Stall: time.Hour},
	})
	rp := h.srv.Replica()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	small := h.goDo(ctx, "/v1/completions", tokensPrompt(10, 1, false))
	waitFor(t, "small running", func() bool { return rp.Stats().Running == 1 })
	big := h.goDo(context.Background(), "/v1/completions", tokensPrompt(200, 1, false))
	waitFor(t, "big waiting", func() bool { return rp.Stats().Waiting == 1 })
	kvWant(t, rp, 1, 1, 10)

	cancel() // nothing else runs: the oversized prompt starts, alone
	recv(t, small)
	waitFor(t, "big running", kvState(rp, 1, 0, 200))
	kvWant(t, rp, 1, 0, 200) // usage clamped to 1
	after := h.goDo(context.Background(), "/v1/completions", tokensPrompt(1, 1, false))
	waitFor(t, "next waiting", func() bool { return rp.Stats().Waiting == 1 })

	if err := rp.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, big); r.status != http.StatusOK {
		t.Fatalf("big: %d %s", r.status, r.body)
	}
	if r := recv(t, after); r.status != http.StatusOK {
		t.Fatalf("after: %d %s", r.status, r.body)
	}
	waitFor(t, "all done", func() bool { return rp.Stats().Running == 0 })
	kvWant(t, rp, 0, 0, 0)
}

func TestKVCapacityCountsGeneratedTokens(t *testing.T) {
	rp, err := New(Config{KVCapacityTokens: 1000, Latency: Latency{Kind: LatencyPerToken}})
	if err != nil {
		t.Fatal(err)
	}
	g := newGeneration(t, rp, tokensPrompt(40, 7, false))
	held := g.req.PromptTokens
	if _, err := rp.q.acquireTokens(context.Background(), rp.done, held); err != nil {
		t.Fatal(err)
	}
	g.kvHeld = &held
	sl := sleeper{ctx: context.Background(), done: rp.done}
	defer sl.stop()
	var seen []int
	err = g.run(&sl, 2, func(from, to int) error {
		st := rp.Stats()
		seen = append(seen, st.KVTokens)
		if st.KVTokens != 40+to || held != 40+to {
			t.Errorf("after tokens %d..%d: KV tokens %d (held %d), want %d", from, to, st.KVTokens, held, 40+to)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 4 || rp.Stats().KVUsage() != 0.047 {
		t.Errorf("KV tokens per chunk %v, usage %v", seen, rp.Stats().KVUsage())
	}
	rp.q.releaseTokens(held)
	if st := rp.Stats(); st.KVTokens != 0 || st.Running != 0 {
		t.Errorf("after release: %+v", st)
	}
}

func TestContentionOptionsOffByDefault(t *testing.T) {
	h := startSim(t, Config{Concurrency: 2, Latency: Latency{Kind: LatencyPerToken, Prefill: time.Microsecond, Decode: time.Microsecond}})
	rp := h.srv.Replica()
	if rp.pl != nil || rp.q.kvCap != 0 {
		t.Fatal("options on by default")
	}
	for range 3 {
		if r := h.do(context.Background(), http.MethodPost, "/v1/completions", tokensPrompt(100, 3, true)); r.status != http.StatusOK {
			t.Fatalf("status %d", r.status)
		}
	}
	st := rp.Stats()
	if st.KVTokens != 0 || st.KVCapacityTokens != 0 || st.Prefills != 0 || st.MaxPrefilling != 0 || st.DecodeStall != 0 {
		t.Errorf("contention stats without the options: %+v", st)
	}
	m := rp.MetricsText()
	for _, absent := range []string{"sim_kv_tokens", "sim_prefilling", "sim_decode_stall"} {
		if strings.Contains(m, absent) {
			t.Errorf("metrics have %s without the options", absent)
		}
	}
	if !strings.Contains(m, `vllm:kv_cache_usage_perc{model_name="sim-model"} 0`+"\n") {
		t.Errorf("kv usage metric changed:\n%s", m)
	}
}

func TestContentionBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{PrefillBlocksDecode: true}, "PrefillBlocksDecode"},
		{Config{PrefillBlocksDecode: true, Latency: Latency{Kind: LatencyLognormal, Duration: time.Second}}, "PrefillBlocksDecode"},
		{Config{KVCapacityTokens: -1}, "KVCapacityTokens"},
		{Config{KVCapacityTokens: MaxKVCapacityTokens + 1}, "KVCapacityTokens"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	if _, err := New(Config{KVCapacityTokens: 1, PrefillBlocksDecode: true, Latency: Latency{Kind: LatencyPerToken}}); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
}
