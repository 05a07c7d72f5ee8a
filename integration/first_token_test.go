package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// vLLM, SGLang and TGI send a stream's status and headers as soon as the
// request is accepted (the simulator does too, by default), so the
// transport's first response byte comes before the engine queues or
// prefills it. Behind a Sluice handler (custom_router here), what
// queued_least_latency learns of a stream is its first body byte: the
// first token, which carries the engine's queue and prefill. It learned
// the headers' time (a millisecond), and saw no load on such engines.
func TestAStreamsFirstTokenIsWhatQLLLearnsBehindASluiceHandler(t *testing.T) {
	startCaddy(t, globals+`
:9930 {
	bind 127.0.0.1
	custom_router ftok {
		backends http://127.0.0.1:9931
	}
	reverse_proxy {
		dynamic custom_router ftok
		lb_policy queued_least_latency {
			pool ftok
			state_log_interval -1
		}
	}
}
:9931 {
	bind 127.0.0.1
	inference_sim {
		name sim-9931
		concurrency 1
		latency per_token 20ms 1ms
	}
}
`)
	url := "http://127.0.0.1:9930"
	prompt := strings.Repeat("word ", 10) // about 10 tokens: 200 ms before the first token
	for range 3 {
		body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":2,"prompt":%q}`, prompt)
		resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("stream: %d %s", resp.StatusCode, b)
		}
	}
	resp, err := client.Get(url + "/_custom_router/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Backends []struct {
			Addr   string  `json:"addr"`
			Stream float64 `json:"ewma_first_byte_stream"`
		} `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if len(h.Backends) != 1 {
		t.Fatalf("health backends: %+v", h.Backends)
	}
	if got := h.Backends[0].Stream; got < 0.1 {
		t.Fatalf("the stream EWMA is %.4fs after three streams whose first token came ~200 ms after their headers: it learned the headers, not the first token", got)
	}
}
