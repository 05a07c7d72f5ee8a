package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// cache_aware with kv_events in front of two real llm-d-inference-sim
// engines (SLUICE_LLMD_SIM, built by scripts/llmd-sim.sh) that publish
// their KV-cache events to Sluice. Ports: Caddy 9165, engines 9166-9167,
// ZMQ 5565.

func startLLMDSim(t *testing.T, port int, zmq string) {
	t.Helper()
	startLLMDSimWith(t, port, zmq, "--force-dummy-tokenizer")
}

// startLLMDSimWith runs the engine with extra flags.
func startLLMDSimWith(t *testing.T, port int, zmq string, extra ...string) {
	t.Helper()
	bin := os.Getenv("SLUICE_LLMD_SIM")
	if bin == "" {
		t.Skip("SLUICE_LLMD_SIM is not set: export SLUICE_LLMD_SIM=\"$(bash scripts/llmd-sim.sh)\" to run the real-engine tests")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("SLUICE_LLMD_SIM=%s: %v", bin, err)
	}
	cmd := exec.Command(bin, append([]string{"--model", "m", "--port", fmt.Sprint(port), "--mode", "echo",
		"--enable-kvcache", "--kv-cache-size", "8", "--block-size", "16", "--event-batch-size", "1",
		"--zmq-endpoint", zmq}, extra...)...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("POD_IP=127.0.0.1:%d", port))
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("engine %d:\n%s", port, logs.String())
		}
	})
	eventually(t, fmt.Sprintf("engine %d to answer", port), func() bool {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// completeCached sends a completion and returns the prompt tokens the
// engine that served it found in its cache (its usage report).
func completeCached(t *testing.T, url, prompt string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
	resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := decodeJSON(resp, &out); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return out.Usage.Details.Cached
}

// kvHealth is the kv_events part of the pool's health report.
type kvHealth struct {
	Replicas map[string]struct {
		Mode   string `json:"mode"`
		Blocks int    `json:"blocks"`
	} `json:"replicas"`
	Totals map[string]uint64 `json:"totals"`
}

func getKVHealth(t *testing.T, url string) kvHealth {
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
	var kv kvHealth
	if raw := h.Settings["cache_aware"]["kv_events"]; raw != nil {
		if err := json.Unmarshal(raw, &kv); err != nil {
			t.Fatal(err)
		}
	}
	return kv
}

func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return strings.Join(w, " ")
}

func kvEventsConfig(fresh string) string {
	return globals + `
:9165 {
	custom_router kv
	reverse_proxy {
		dynamic custom_router kv
		lb_policy cache_aware {
			pool kv
			kv_events tcp://127.0.0.1:5565
			kv_events_tokenizer llmd_sim
			kv_events_fresh ` + fresh + `
		}
	}
}
`
}

// The tree remembers where Sluice sent a prompt; the engine may have
// evicted it since, and another engine may hold it. With kv_events the
// request goes where the prompt really is, and stays so across a reload.
func TestKVEventsRouteWhereTheEngineHoldsThePrompt(t *testing.T) {
	if os.Getenv("SLUICE_LLMD_SIM") == "" {
		t.Skip("SLUICE_LLMD_SIM is not set: export SLUICE_LLMD_SIM=\"$(bash scripts/llmd-sim.sh)\" to run the real-engine tests")
	}
	startCaddy(t, kvEventsConfig("30s"))
	url := "http://127.0.0.1:9165"
	engines := []string{"127.0.0.1:9166", "127.0.0.1:9167"}
	for i := range engines {
		startLLMDSim(t, 9166+i, "tcp://127.0.0.1:5565")
	}
	setBackends(t, url, "http://"+engines[0], "http://"+engines[1])

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
	// Behind Sluice's back: X evicts A (two other prompts fill its cache)
	// and Y gets A. The tree still says X.
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

	m := metricsText(t, url)
	for _, want := range []string{`sluice_kv_events_blocks{pool="kv",replica="` + y + `"} 5`,
		`sluice_cache_aware_exact_hits_total{pool="kv"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "sluice_"))
		}
	}

	// A reload that rebuilds the policy state keeps the listener and the
	// index (same address): still routed on the engines' caches.
	reload(t, kvEventsConfig("40s"))
	setBackends(t, url, "http://"+engines[0], "http://"+engines[1])
	completeCached(t, "http://"+y, words("eee", 80)) // Y: A's oldest blocks go
	completeCached(t, "http://"+y, words("fff", 80))
	completeCached(t, "http://"+x, a) // and X has it again
	eventually(t, "the index to follow", func() bool {
		h := getKVHealth(t, url)
		return h.Replicas[x].Blocks == 8 && h.Replicas[y].Blocks == 8 && h.Totals["batches"] > 0
	})
	outlastSpeculation()
	if got := completeCached(t, url, a); got != 80 {
		t.Fatalf("after the reload: A found %d cached tokens, want 80", got)
	}
	drained(t, url)

	// The last config using the address goes: the socket is closed.
	reload(t, globals+"\n:9165 {\n\trespond \"ok\"\n}\n")
	eventually(t, "the kv_events port to be free", func() bool {
		l, err := net.Listen("tcp", "127.0.0.1:5565")
		if err != nil {
			return false
		}
		l.Close()
		return true
	})
}

// outlastSpeculation waits until what Sluice routed itself no longer
// counts as held (kvevents.Prefixes' default SpeculateFor, 2s): from then
// on only the engines' events speak.
func outlastSpeculation() { time.Sleep(2*time.Second + 100*time.Millisecond) }

// Events stop: within kv_events_fresh the replica is scored by the tree
// again (health says approximate), requests keep being served; events
// resume: exact again. The publisher is a plain ZMQ PUB sending the
// engines' wire format for Sluice's own simulated replicas.
func TestKVEventsFallBackWhenEventsStop(t *testing.T) {
	startCaddy(t, globals+`
:9168 {
	custom_router kvfb
	reverse_proxy {
		dynamic custom_router kvfb
		lb_policy cache_aware {
			pool kvfb
			kv_events tcp://127.0.0.1:5567
			kv_events_tokenizer llmd_sim
			kv_events_fresh 1s
		}
	}
}
`+sims(9169))
	url := "http://127.0.0.1:9168"
	const replica = "127.0.0.1:9169"
	setBackends(t, url, "http://"+replica)

	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Dial("tcp://127.0.0.1:5567"); err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	publish := func() {
		seq++
		payload, _ := msgpack.Marshal([]any{float64(time.Now().Unix()), []any{[]any{"AllBlocksCleared"}}})
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte("kv@"+replica+"@m"), s[:], payload)); err != nil {
			t.Fatal(err)
		}
	}
	mode := func() string { return getKVHealth(t, url).Replicas[replica].Mode }
	served := func() {
		if o := complete(url); o.status != 200 {
			t.Fatalf("request during the switch: %+v", o)
		}
	}
	eventually(t, "exact while events flow", func() bool { publish(); served(); return mode() == "exact" })
	eventually(t, "approximate once they stop", func() bool { served(); return mode() == "approximate" })
	eventually(t, "exact again when they resume", func() bool { publish(); served(); return mode() == "exact" })
	drained(t, url)
}
