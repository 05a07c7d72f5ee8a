package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// kv_events with no tokenizer setting: the default asks the engines' own
// /tokenize (vLLM's endpoint, which the real llm-d-inference-sim serves,
// here without --force-dummy-tokenizer). The first look at a prompt is a
// miss (routed by the tree, the tokenization runs in the background);
// once the cache is warm the request goes where the engine holds the
// prompt. Ports: Caddy 9530, engines 9531-9532, ZMQ 5610.
func TestKVEventsEngineTokenizer(t *testing.T) {
	if os.Getenv("SLUICE_LLMD_SIM") == "" {
		t.Skip("SLUICE_LLMD_SIM is not set: export SLUICE_LLMD_SIM=\"$(bash scripts/llmd-sim.sh)\" to run the real-engine tests")
	}
	startCaddy(t, globals+`
:9530 {
	custom_router kvtok
	reverse_proxy {
		dynamic custom_router kvtok
		lb_policy cache_aware {
			pool kvtok
			kv_events tcp://127.0.0.1:5610
		}
	}
}
`)
	url := "http://127.0.0.1:9530"
	engines := []string{"127.0.0.1:9531", "127.0.0.1:9532"}
	for i := range engines {
		startLLMDSimWith(t, 9531+i, "tcp://127.0.0.1:5610")
	}
	setBackends(t, url, "http://"+engines[0], "http://"+engines[1])

	// Cold: served at once, by the tree; the tokenizer counts a miss.
	a := words("alpha", 80) // 5 blocks of 16 tokens; each engine holds 8
	completeCached(t, url, a)
	var x, y string
	eventually(t, "A's blocks in the index", func() bool {
		h := getKVHealth(t, url)
		for i, e := range engines {
			if h.Replicas[e].Blocks == 5 {
				x, y = e, engines[1-i]
				return true
			}
		}
		return false
	})
	if tk := getTokenizeHealth(t, url); tk.Tokenizer != "engine" || tk.Tokenize.Misses < 1 {
		t.Fatalf("tokenizer after the first request: %+v", tk)
	}
	eventually(t, "the engine's tokens for A in the cache", func() bool { return getTokenizeHealth(t, url).Tokenize.Stored >= 1 })

	// Behind Sluice's back: X evicts A and Y gets it. The tree still says X.
	completeCached(t, "http://"+x, words("cee", 80))
	completeCached(t, "http://"+x, words("dee", 80))
	completeCached(t, "http://"+y, a)
	eventually(t, "the index to see X without A and Y with it", func() bool {
		h := getKVHealth(t, url)
		return h.Replicas[y].Blocks == 5 && h.Replicas[x].Blocks == 8 &&
			h.Replicas[x].Mode == "exact" && h.Replicas[y].Mode == "exact"
	})
	outlastSpeculation()
	if got := completeCached(t, url, a); got != 80 {
		t.Fatalf("A through Sluice found %d cached tokens, want 80 (the engine that holds it)", got)
	}
	tk := getTokenizeHealth(t, url)
	if tk.Tokenize.Hits+tk.Tokenize.PrefixHits < 1 || len(tk.Tokenize.Failures) != 0 {
		t.Fatalf("tokenizer: %+v", tk)
	}
	m := metricsText(t, url)
	for _, want := range []string{`sluice_cache_aware_exact_hits_total{pool="kvtok"} 1`,
		`sluice_kv_events_tokenize_requests_total{pool="kvtok"}`, `sluice_kv_events_tokenize_lookups_total{pool="kvtok",result="miss"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "sluice_kv_events_tokenize"))
		}
	}

	// Chat: the engine applies its template; Sluice sends it the messages.
	// Never a routing error, cold or warm.
	chat := func() {
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": words("sys", 40)}, {"role": "user", "content": "hello"}}})
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("chat: status %d", resp.StatusCode)
		}
	}
	hits := tk.Tokenize.Hits
	eventually(t, "the chat's ids from the engine", func() bool {
		chat()
		return getTokenizeHealth(t, url).Tokenize.Hits > hits
	})
	drained(t, url)
}

type tokenizeHealth struct {
	Tokenizer string `json:"tokenizer"`
	Tokenize  struct {
		Hits       uint64            `json:"hits"`
		PrefixHits uint64            `json:"prefix_hits"`
		Misses     uint64            `json:"misses"`
		Requests   uint64            `json:"requests"`
		Stored     uint64            `json:"stored"`
		Failures   map[string]uint64 `json:"failures"`
	} `json:"tokenize"`
}

func getTokenizeHealth(t *testing.T, url string) tokenizeHealth {
	t.Helper()
	resp, err := client.Get(url + "/_custom_router/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Settings map[string]map[string]json.RawMessage `json:"settings"`
	}
	if err := decodeJSON(resp, &h); err != nil {
		t.Fatal(err)
	}
	var out tokenizeHealth
	if raw := h.Settings["cache_aware"]["kv_events"]; raw != nil {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
