package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sync"
	"time"
)

// Record is one request as the load generator saw it.
type Record struct {
	System  string
	Rep     int // repetition of the system (1-based)
	Seq     int
	Proxy   int           // index of the proxy instance it was sent to
	Start   time.Duration // since the start of the system's run
	Latency time.Duration // to the last byte of the body
	TTFB    time.Duration // to the first byte of the response
	Status  int           // 0: no answer (lost)
	Replica string        // X-Sim-Replica
	Class   string        // the workload's class of the request (tenant…), if any
	Err     string
	// LostOn is how a lost request's last try went (zero otherwise):
	// what Err also says, for code to read.
	LostOn lostConn

	// TTFT is the time to the first streamed token (the first SSE data
	// chunk carrying text) and Tokens the number of such chunks, for
	// workloads with sse set; 0 otherwise.
	TTFT   time.Duration
	Tokens int
	// LastToken is the time to the last such chunk (since the request's
	// start): when its output ended, whether or not the stream did.
	LastToken time.Duration
}

// Lost reports whether the request got no HTTP answer at all.
func (r Record) Lost() bool { return r.Status == 0 }

// lostConn is how a lost request's last try went.
type lostConn struct {
	KeptAlive bool // on a kept-alive (reused) connection
	Written   bool // the request was written whole
	EOF       bool // the connection ended with no answer (io.EOF)
}

// workload describes an open-loop run: arrivals at the given offsets (a
// Poisson process or a script), built by build, plus timed actions (e.g. a
// scale-up) fired on the same clock.
type workload struct {
	arrivals []time.Duration
	build    func(n int) (req *http.Request, proxy int)
	// class, if set, names arrival n's class (e.g. its tenant).
	class   func(n int) string
	actions []action
	// monitor, if set, runs from the start until every request has ended.
	monitor func(ctx context.Context)
	// sse reads each 200 answer as an OpenAI completion stream
	// (server-sent events), recording Record.TTFT and Record.Tokens.
	sse bool
	// ordered sends the arrivals one after another: each waits until the
	// previous request was written (at most orderWait), so arrivals due at
	// the same instant reach the proxy in script order, as from one client
	// event loop (seed 003's asyncio generator). Without it they race.
	ordered bool
}

// orderWait bounds how long an ordered arrival waits for the previous
// request to be written, so one stuck connection cannot hold the script.
const orderWait = 50 * time.Millisecond

type action struct {
	at time.Duration
	do func(ctx context.Context) error
}

// poisson returns arrival offsets of a Poisson process at rate/s over d.
func poisson(rate float64, d time.Duration, seed uint64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	var out []time.Duration
	t := time.Duration(0)
	for {
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if t >= d {
			return out
		}
		out = append(out, t)
	}
}

// poissonGiven returns n arrival times over [0, d): a Poisson process
// conditioned on its count, whose times are n uniform draws, sorted. A
// run compared with a measured one gets the same number of requests,
// where an unconditioned draw at the same rate may send 18% more.
func poissonGiven(n int, d time.Duration, seed uint64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(rng.Float64() * float64(d))
	}
	slices.Sort(out)
	return out
}

// classArrival is one arrival of a workload that mixes classes (tenants,
// priorities).
type classArrival struct {
	at    time.Duration
	class string
}

// mergeArrivals interleaves each class's arrival times (times[i] for
// classes[i]) in time order.
func mergeArrivals(classes []string, times ...[]time.Duration) []classArrival {
	var out []classArrival
	for i, ts := range times {
		for _, t := range ts {
			out = append(out, classArrival{t, classes[i]})
		}
	}
	slices.SortStableFunc(out, func(a, b classArrival) int { return cmp.Compare(a.at, b.at) })
	return out
}

func arrivalTimes(list []classArrival) []time.Duration {
	out := make([]time.Duration, len(list))
	for i, a := range list {
		out[i] = a.at
	}
	return out
}

// drive sends every arrival on its own goroutine at its time (open loop:
// arrivals never wait for answers), runs the actions, and returns every
// request's record once all have ended. Each request is bounded by
// reqTimeout; a request without an HTTP answer is recorded as lost.
func drive(ctx context.Context, system string, w workload, reqTimeout time.Duration) ([]Record, []error) {
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 30 * time.Second}
	client := &http.Client{Transport: tr, Timeout: reqTimeout}
	defer tr.CloseIdleConnections()

	recs := make([]Record, len(w.arrivals))
	var (
		wg      sync.WaitGroup
		errMu   sync.Mutex
		actErrs []error
	)
	start := time.Now()
	if w.monitor != nil {
		mctx, stop := context.WithCancel(ctx)
		mdone := make(chan struct{})
		go func() { defer close(mdone); w.monitor(mctx) }()
		defer func() { stop(); <-mdone }()
	}
	for _, a := range w.actions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepUntil(ctx, start.Add(a.at)) {
				return
			}
			if err := a.do(ctx); err != nil {
				errMu.Lock()
				actErrs = append(actErrs, err)
				errMu.Unlock()
			}
		}()
	}
	for n, at := range w.arrivals {
		if !sleepUntil(ctx, start.Add(at)) {
			// Cancelled: the rest are never sent (and recorded as lost).
			for m := n; m < len(w.arrivals); m++ {
				recs[m] = Record{System: system, Seq: m, Start: w.arrivals[m], Err: "not sent: run cancelled"}
				if w.class != nil {
					recs[m].Class = w.class(m)
				}
			}
			break
		}
		req, proxy := w.build(n)
		var wrote chan struct{}
		if w.ordered {
			wrote = make(chan struct{})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx := ctx
			if d, ok := req.Context().Deadline(); ok {
				// The workload's own deadline (a client that gives up).
				var cancel context.CancelFunc
				rctx, cancel = context.WithDeadline(ctx, d)
				defer cancel()
			}
			recs[n] = send(client, req.WithContext(rctx), system, n, proxy, start, wrote, w.sse)
			if w.class != nil {
				recs[n].Class = w.class(n)
			}
		}()
		if wrote != nil {
			t := time.NewTimer(orderWait)
			select {
			case <-wrote:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
	}
	wg.Wait()
	return recs, actErrs
}

// send sends one request and records it. If wrote is not nil it is closed
// once the request has been written (or has failed).
func send(client *http.Client, req *http.Request, system string, n, proxy int, runStart time.Time, wrote chan struct{}, sse bool) Record {
	r := Record{System: system, Seq: n, Proxy: proxy}
	var first time.Time
	written := func() {}
	if wrote != nil {
		written = sync.OnceFunc(func() { close(wrote) })
	}
	// How the last try's connection went, for a request lost: whether it
	// was a kept-alive one and how long idle (a server closing idle
	// connections races a request sent on one), and whether the request
	// was written.
	var conn struct {
		sync.Mutex
		info  httptrace.GotConnInfo
		wrote error
		tried int
	}
	conn.wrote = errors.New("not written")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			conn.Lock()
			conn.info, conn.wrote = info, errors.New("not written")
			conn.tried++
			conn.Unlock()
		},
		GotFirstResponseByte: func() { first = time.Now() },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			conn.Lock()
			conn.wrote = info.Err
			conn.Unlock()
			written()
		},
	}))
	t0 := time.Now()
	r.Start = t0.Sub(runStart)
	resp, err := client.Do(req)
	written()
	if err != nil {
		r.Err = err.Error()
		conn.Lock()
		r.LostOn = lostConn{KeptAlive: conn.tried > 0 && conn.info.Reused, Written: conn.tried > 0 && conn.wrote == nil,
			EOF: errors.Is(err, io.EOF)}
		if conn.tried > 0 {
			how := "new connection"
			if conn.info.Reused {
				how = fmt.Sprintf("kept-alive connection (idle %v)", conn.info.IdleTime.Round(time.Millisecond))
			}
			wrote := "request written"
			if conn.wrote != nil {
				wrote = "request not written: " + conn.wrote.Error()
			}
			r.Err += fmt.Sprintf(" [try %d on a %s, %s]", conn.tried, how, wrote)
		}
		conn.Unlock()
		r.Latency = time.Since(t0)
		return r
	}
	if sse && resp.StatusCode == http.StatusOK {
		err = readSSE(resp.Body, t0, &r)
	} else {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	resp.Body.Close()
	r.Latency = time.Since(t0)
	if !first.IsZero() {
		r.TTFB = first.Sub(t0)
	}
	r.Status = resp.StatusCode
	r.Replica = resp.Header.Get("X-Sim-Replica")
	if err != nil {
		// Headers came but the body was cut: answered, but not complete.
		r.Err = "body: " + err.Error()
	}
	return r
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// readSSE reads an OpenAI completion stream to its end: every "data:"
// event whose first choice carries text (or a chat delta's content) counts
// one output token chunk; the first one sets r.TTFT (since t0).
func readSSE(body io.Reader, t0 time.Time, r *Record) error {
	br := bufio.NewReaderSize(body, 16<<10)
	for {
		line, err := br.ReadSlice('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if len(data) > 0 && data[0] == '{' && chunkHasText(data) {
				r.LastToken = time.Since(t0)
				if r.Tokens == 0 {
					r.TTFT = r.LastToken
				}
				r.Tokens++
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			// A line longer than the buffer: not a token chunk; skip it.
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// chunkHasText reports whether one streamed completion (or chat) chunk
// carries output text in its first choice.
func chunkHasText(data []byte) bool {
	var c struct {
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil || len(c.Choices) == 0 {
		return false
	}
	return c.Choices[0].Text != "" || c.Choices[0].Delta.Content != ""
}
