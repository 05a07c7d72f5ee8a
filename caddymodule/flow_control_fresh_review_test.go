package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
)

// A queued request whose body is declared over max_body_bytes leaves it
// unread while it waits: reading the bound of it cannot let net/http
// notice its client leave (that takes the whole body), it only held the
// bound in memory for nothing.
func TestFlowControlQueuedBodyDeclaredOverTheBoundStaysUnread(t *testing.T) {
	h := &FlowControl{Pool: "fc-fresh-over", MaxConcurrency: 1, Replicas: 1, bodyOptions: bodyOptions{MaxBodyBytes: 1 << 10}}
	provisionFlowControl(t, h)
	ctl := h.state.ctl()
	held, err := ctl.Enqueue(context.Background(), flow.Request{}) // the pool's one slot
	if err != nil {
		t.Fatal(err)
	}
	size := 64 << 10
	body := &countingBody{r: strings.NewReader(strings.Repeat("x", size))}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Body, r.ContentLength = body, int64(size)
	readBefore := make(chan int, 1)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		readBefore <- body.n
		return nil
	})
	go func() { _ = h.ServeHTTP(httptest.NewRecorder(), r, next) }()
	waitFor(t, "the request queued", func() bool { return ctl.Snapshot().Queued == 1 })
	held.Release()
	if n := <-readBefore; n != 0 {
		t.Fatalf("read %d bytes of a queued body declared %d, over max_body_bytes %d", n, size, 1<<10)
	}
}
