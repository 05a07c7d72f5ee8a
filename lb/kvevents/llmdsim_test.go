package kvevents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

// A real publisher: llm-d-inference-sim (built by scripts/llmd-sim.sh, named
// by SLUICE_LLMD_SIM) dials our SUB socket and publishes what its KV cache
// stores and evicts. Ports: ZMQ the listener's (bound on port 0), HTTP
// one free a moment ago (the sim must be told it).

func llmdSim(t *testing.T) string {
	bin := os.Getenv("SLUICE_LLMD_SIM")
	if bin == "" {
		t.Skip("SLUICE_LLMD_SIM is not set: export SLUICE_LLMD_SIM=\"$(bash scripts/llmd-sim.sh)\" to run the real-publisher tests")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("SLUICE_LLMD_SIM=%s: %v (build it with scripts/llmd-sim.sh)", bin, err)
	}
	return bin
}

// startSim runs the sim with a small KV cache (kvBlocks blocks of 16 tokens)
// publishing to zmqPort, and waits until it answers.
func startSim(t *testing.T, bin string, httpPort, zmqPort, kvBlocks int, extra ...string) (stop func()) {
	t.Helper()
	args := append([]string{"--model", "m", "--port", fmt.Sprint(httpPort), "--mode", "echo",
		"--enable-kvcache", "--kv-cache-size", fmt.Sprint(kvBlocks), "--block-size", "16",
		"--event-batch-size", "1",
		"--zmq-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", zmqPort), "--force-dummy-tokenizer"}, extra...)
	return startSimArgs(t, bin, httpPort, args)
}

// startSimArgs runs the sim with args (POD_IP its loopback address) and
// waits until it answers.
func startSimArgs(t *testing.T, bin string, httpPort int, args []string) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	pod := fmt.Sprintf("127.0.0.1:%d", httpPort)
	cmd.Env = append(os.Environ(), "POD_IP="+pod)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("sim output:\n%s", logs.String())
		}
	})
	waitFor(t, "the sim to answer", func() bool {
		resp, err := http.Get("http://" + pod + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return stop
}

func postJSON(t *testing.T, url string, body, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d", url, resp.StatusCode)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
}

// tokenize asks the engine (vLLM's /tokenize, which the sim serves).
func tokenize(t *testing.T, pod, prompt string) []uint32 {
	var r struct {
		Tokens []uint32 `json:"tokens"`
	}
	postJSON(t, "http://"+pod+"/tokenize", map[string]any{"model": "m", "prompt": prompt}, &r)
	return r.Tokens
}

func complete(t *testing.T, pod, prompt string) {
	postJSON(t, "http://"+pod+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1}, nil)
}

// prompt returns a prompt of n words of a topic (one dummy token each).
func prompt(topic string, n int) string {
	words := make([]string, n)
	for i := range words {
		words[i] = fmt.Sprintf("%s%d", topic, i)
	}
	return strings.Join(words, " ")
}

func TestLLMDSimPublishesIntoIndex(t *testing.T) {
	bin := llmdSim(t)
	for _, format := range []struct {
		name  string
		extra []string
	}{{"positional", nil}, {"named", []string{"--use-vllm-map-event-format"}}} {
		t.Run(format.name, func(t *testing.T) {
			httpPort := freePort(t)
			ix := NewIndex(Config{})
			pods := map[string]bool{}
			l := listenAny(t, ListenerConfig{Index: ix, Resolve: func(pod string) (string, bool) { return pod, pods[pod] }})
			defer l.Close()
			zmqPort := portOf(l.Addr())
			pods[fmt.Sprintf("127.0.0.1:%d", httpPort)] = true // read only from here on
			// 8 blocks of 16 tokens: two 80-token prompts do not fit together.
			pod := fmt.Sprintf("127.0.0.1:%d", httpPort)
			startSim(t, bin, httpPort, zmqPort, 8, format.extra...)

			a, b, c := prompt("alpha", 80), prompt("beta", 80), prompt("gamma", 80)
			ta, tb, tc := tokenize(t, pod, a), tokenize(t, pod, b), tokenize(t, pod, c)
			if len(ta) != 80 || len(tb) != 80 || len(tc) != 80 {
				t.Fatalf("tokens: %d, %d, %d", len(ta), len(tb), len(tc))
			}
			// Sluice's own copy of the sim's tokenizer agrees with the sim.
			for _, text := range []string{a, "Hello, world! How's it going? {x: [1, 2]} a-b_c /path\\n", ""} {
				mine, _ := SimTokenizer{}.Tokenize("m", text)
				if theirs := tokenize(t, pod, text); !slices.Equal(mine, theirs) {
					t.Fatalf("%q: SimTokenizer %v, the sim %v", text, mine, theirs)
				}
			}
			held := func(tokens []uint32) int { return ix.Match(ix.Keys(tokens), []string{pod})[0] }
			blocks := func() int { return ix.Stats().Replicas[pod].Blocks }

			// The socket may connect after the first events went out (PUB
			// drops until then): send A until its blocks show up.
			waitFor(t, "prompt A's 5 blocks in the index", func() bool {
				complete(t, pod, a)
				return held(ta) == 5
			})
			// B needs 5 blocks; 3 are free, so 2 of A's go (which two is
			// the sim's pick among equally old blocks). The cache is full:
			// the index holds exactly its 8 blocks.
			complete(t, pod, b)
			waitFor(t, "B in, 2 of A's blocks out", func() bool { return held(tb) == 5 && blocks() == 8 })
			if held(ta) > 3 {
				t.Fatalf("A still fully held: %d blocks", held(ta))
			}
			// C needs 5: A's last 3 (the oldest unused) and 2 of B's go.
			complete(t, pod, c)
			waitFor(t, "C in, A out", func() bool { return held(tc) == 5 && held(ta) == 0 && blocks() == 8 })
			if held(tb) == 5 {
				t.Fatal("B still fully held")
			}
			s := ix.Stats()
			if s.EventDrops[ReasonParent] != 0 || s.RemovedUnknown != 0 || s.Gaps != 0 || s.Restarts != 0 || s.UnknownEvents != 0 {
				t.Fatalf("index disagrees with the engine: %+v", s)
			}
			for r, n := range s.Drops {
				if n != 0 {
					t.Fatalf("dropped %d messages (%s): %+v", n, r, s)
				}
			}
			for r, n := range s.EventDrops {
				if n != 0 {
					t.Fatalf("dropped %d events (%s): %+v", n, r, s)
				}
			}
			t.Logf("%s: %d batches, %d events, %d blocks held", format.name, ix.Stats().Batches, ix.Stats().Events, ix.Stats().Blocks)
		})
	}
}

// A restarted publisher starts its sequence again: the replica's entries
// from before the restart are stale (the new process never removes them)
// and must go. The old process publishes more batches than the new one can
// lose to the subscription race, so its first batch that arrives goes back.
func TestLLMDSimRestartClears(t *testing.T) {
	bin := llmdSim(t)
	ix := NewIndex(Config{})
	httpPort := freePort(t)
	pod := fmt.Sprintf("127.0.0.1:%d", httpPort)
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: func(p string) (string, bool) { return p, p == pod }})
	defer l.Close()
	zmqPort := portOf(l.Addr())
	held := func(tokens []uint32) int { return ix.Match(ix.Keys(tokens), []string{pod})[0] }

	stop := startSim(t, bin, httpPort, zmqPort, 64)
	var old [][]uint32
	for i := 0; i < 8; i++ {
		p := prompt(fmt.Sprintf("old%d_", i), 16)
		tk := tokenize(t, pod, p)
		waitFor(t, "an old prompt's block", func() bool { complete(t, pod, p); return held(tk) == 1 })
		old = append(old, tk)
	}
	stop()

	startSim(t, bin, httpPort, zmqPort, 64) // its port again: it was the sim's until now
	p := prompt("new", 32)
	tk := tokenize(t, pod, p)
	waitFor(t, "the new prompt's blocks", func() bool { complete(t, pod, p); return held(tk) == 2 })
	s := ix.Stats()
	if s.Restarts != 1 {
		t.Fatalf("restarts: %+v", s)
	}
	for i, tk := range old {
		if held(tk) != 0 {
			t.Fatalf("old prompt %d still held after the restart: %+v", i, s)
		}
	}
}

// The sim evicts among one request's blocks in map order, so a prompt
// loses blocks from its middle; served again, it stores the missing
// blocks in one event whose parent is the last block it still held, not
// each block's own. Engine hashes name whole prefixes, so the index keys a
// re-stored hash as it had before its removal: afterwards it holds the
// whole prompt, as the engine does.
func TestLLMDSimReStoredBlocksKeepTheirKeys(t *testing.T) {
	bin := llmdSim(t)
	httpPort := freePort(t)
	pod := fmt.Sprintf("127.0.0.1:%d", httpPort)
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: func(p string) (string, bool) { return p, p == pod }})
	defer l.Close()
	zmqPort := portOf(l.Addr())
	startSim(t, bin, httpPort, zmqPort, 8)
	held := func(tokens []uint32) int { return ix.Match(ix.Keys(tokens), []string{pod})[0] }

	a := prompt("alpha", 80)
	ta := tokenize(t, pod, a)
	waitFor(t, "prompt A's 5 blocks in the index", func() bool { complete(t, pod, a); return held(ta) == 5 })
	for round := 0; round < 4; round++ {
		// 5 blocks of another prompt: 2 of A's go (which two is the
		// sim's pick), then A again brings them back.
		other := prompt(fmt.Sprintf("other%d_", round), 80)
		to := tokenize(t, pod, other)
		complete(t, pod, other)
		waitFor(t, "the other prompt in", func() bool { return held(to) == 5 })
		complete(t, pod, a)
		waitFor(t, fmt.Sprintf("round %d: A wholly held again", round), func() bool { return held(ta) == 5 })
	}
	if s := ix.Stats(); s.ReStored == 0 || s.EventDrops[ReasonParent] != 0 {
		t.Fatalf("stats: %+v", s)
	}
}
