package sim

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
)

// serveMetrics writes the replica's metrics in the Prometheus text format,
// under the names vLLM (and SGLang) servers use, so that load-aware policies
// can scrape a simulated replica like a real one.
func (rp *Replica) serveMetrics(w http.ResponseWriter) {
	_, _ = w.Write(rp.appendMetrics(nil))
}

// MetricsText returns what GET /metrics serves.
func (rp *Replica) MetricsText() string {
	return string(rp.appendMetrics(nil))
}

func (rp *Replica) appendMetrics(dst []byte) []byte {
	st := rp.Stats()
	b := bytes.NewBuffer(dst)
	label := `{model_name="` + rp.cfg.Model + `"}`
	usage := float64(st.Running) / float64(rp.cfg.Concurrency)

	metric := func(name, typ, help, labels, value string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n%s%s %s\n", name, help, name, typ, name, labels, value)
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	i := func(v int) string { return strconv.Itoa(v) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

	metric("vllm:num_requests_running", "gauge", "Number of requests currently running on the simulated GPU.", label, i(st.Running))
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting in the replica's queue.", label, i(st.Waiting))
	switch {
	case st.KVBlocks > 0:
		kv := f(st.KVUsage())
		help := "Simulated KV-cache usage (blocks held by running requests / KV blocks), 0..1."
		metric("vllm:gpu_cache_usage_perc", "gauge", help, label, kv)
		metric("vllm:kv_cache_usage_perc", "gauge", help, label, kv)
	case st.KVCapacityTokens > 0:
		kv := f(st.KVUsage())
		help := "Simulated KV-cache usage (tokens held by running requests / capacity), 0..1."
		metric("vllm:gpu_cache_usage_perc", "gauge", help, label, kv)
		metric("vllm:kv_cache_usage_perc", "gauge", help, label, kv)
	case rp.cache != nil:
		metric("vllm:gpu_cache_usage_perc", "gauge", "Simulated KV-cache usage (running / concurrency), 0..1.", label, f(usage))
		kv := float64(st.PrefixCachedBlocks) / float64(st.PrefixCapacityBlocks)
		metric("vllm:kv_cache_usage_perc", "gauge", "Simulated KV-cache usage (prefix-cache blocks held / capacity), 0..1.", label, f(kv))
	default:
		metric("vllm:gpu_cache_usage_perc", "gauge", "Simulated KV-cache usage (running / concurrency), 0..1.", label, f(usage))
		metric("vllm:kv_cache_usage_perc", "gauge", "Simulated KV-cache usage (running / concurrency), 0..1.", label, f(usage))
	}
	metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in prompt tokens looked up (0 when the prefix cache is off).", label, u(st.PrefixQueries))
	metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in cached prompt tokens (0 when the prefix cache is off).", label, u(st.PrefixHits))
	metric("vllm:request_success_total", "counter", "Number of successfully served requests.", label, u(st.Served))
	metric("vllm:prompt_tokens_total", "counter", "Number of prompt tokens of served requests.", label, u(st.PromptTokens))
	metric("vllm:generation_tokens_total", "counter", "Number of generated tokens of served requests.", label, u(st.CompletionTokens))
	metric("sglang:num_running_reqs", "gauge", "Number of running requests (SGLang name).", label, i(st.Running))
	metric("sglang:num_queue_reqs", "gauge", "Number of queued requests (SGLang name).", label, i(st.Waiting))

	replica := `{replica="` + rp.cfg.Name + `"}`
	metric("sim_max_running", "gauge", "Largest number of requests running at once so far.", replica, i(st.MaxRunning))
	metric("sim_max_waiting", "gauge", "Largest number of requests waiting at once so far.", replica, i(st.MaxWaiting))
	metric("sim_concurrency", "gauge", "Configured number of requests served at once.", replica, i(rp.cfg.Concurrency))
	metric("sim_prefix_cache_query_blocks_total", "counter", "Full prompt blocks looked up in the prefix cache.", replica, u(st.PrefixQueryBlocks))
	metric("sim_prefix_cache_hit_blocks_total", "counter", "Full prompt blocks found in the prefix cache.", replica, u(st.PrefixHitBlocks))
	metric("sim_prefix_cache_blocks", "gauge", "Blocks held in the prefix cache.", replica, i(st.PrefixCachedBlocks))
	metric("sim_prefix_cache_capacity_blocks", "gauge", "Capacity of the prefix cache in blocks (0: off).", replica, i(st.PrefixCapacityBlocks))
	if st.KVCapacityTokens > 0 {
		metric("sim_kv_tokens", "gauge", "KV tokens held by running requests (prompt + generated so far).", replica, i(st.KVTokens))
		metric("sim_kv_capacity_tokens", "gauge", "Configured KV capacity in tokens.", replica, i(st.KVCapacityTokens))
	}
	if rp.eng != nil {
		metric("sim_engine_steps_total", "counter", "Engine steps run.", replica, u(st.Steps))
		metric("sim_engine_prefill_tokens_total", "counter", "Prompt tokens prefilled in engine steps.", replica, u(st.PrefillTokens))
		metric("sim_engine_decode_tokens_total", "counter", "Tokens decoded in engine steps (first tokens excluded: the prefill yields them).", replica, u(st.DecodeTokens))
		metric("sim_engine_busy_seconds_total", "counter", "Time the engine spent in steps.", replica, f(st.Busy.Seconds()))
		metric("sim_kv_blocks_used", "gauge", "KV blocks held by running requests (shared prompt blocks once).", replica, i(st.KVBlocksUsed))
		metric("sim_kv_blocks_cached", "gauge", "Free KV blocks still holding a cached prompt block.", replica, i(st.KVBlocksCached))
		metric("sim_kv_blocks", "gauge", "Configured KV blocks.", replica, i(st.KVBlocks))
	}
	if rp.pl != nil {
		metric("sim_prefilling", "gauge", "Prefills running now (at most 1 with prefill_blocks_decode).", replica, i(st.Prefilling))
		metric("sim_prefill_waiting", "gauge", "Running requests waiting for their turn to prefill.", replica, i(st.PrefillWaiting))
		metric("sim_decode_stall_seconds_total", "counter", "Decode time lost to other requests' prefills, summed over requests.", replica, f(st.DecodeStall.Seconds()))
	}

	rp.statusMu.Lock()
	statuses := make([]int, 0, len(rp.byStatus))
	for s := range rp.byStatus {
		statuses = append(statuses, s)
	}
	slices.Sort(statuses)
	counts := make([]uint64, len(statuses))
	for k, s := range statuses {
		counts[k] = rp.byStatus[s]
	}
	rp.statusMu.Unlock()

	b.WriteString("# HELP sim_requests_total Inference requests by response status (499: the client went away).\n")
	b.WriteString("# TYPE sim_requests_total counter\n")
	for k, s := range statuses {
		fmt.Fprintf(b, "sim_requests_total{replica=%q,status=\"%d\"} %d\n", rp.cfg.Name, s, counts[k])
	}
	return b.Bytes()
}
