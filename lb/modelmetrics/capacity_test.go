package modelmetrics

import (
	"errors"
	"testing"
)

// vLLM (and llm-d-inference-sim) export their KV cache size from the
// start as an info metric's label: the capacity is known before the
// cache has ever filled.
func TestParseKVBlocks(t *testing.T) {
	const load = "vllm:num_requests_waiting 0\n"
	for _, c := range []struct {
		name  string
		body  string
		want  int
		known bool
	}{
		{"vLLM", load + `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_gpu_blocks="27152",num_cpu_blocks="None"} 1.0`, 27152, true},
		{"llm-d-inference-sim", load + `vllm:cache_config_info{block_size="16",num_gpu_blocks="136"} 1`, 136, true},
		{"alone it still says something", `vllm:cache_config_info{num_gpu_blocks="200"} 1`, 200, true},
		{"the first valid series", load + "vllm:cache_config_info{num_gpu_blocks=\"None\"} 1\nvllm:cache_config_info{num_gpu_blocks=\"64\"} 1\nvllm:cache_config_info{num_gpu_blocks=\"99\"} 1", 64, true},
		{"not yet sized", load + `vllm:cache_config_info{num_gpu_blocks="None"} 1`, 0, false},
		{"no label", load + `vllm:cache_config_info{block_size="16"} 1`, 0, false},
		{"zero", load + `vllm:cache_config_info{num_gpu_blocks="0"} 1`, 0, false},
		{"negative", load + `vllm:cache_config_info{num_gpu_blocks="-5"} 1`, 0, false},
		{"fractional", load + `vllm:cache_config_info{num_gpu_blocks="1.5"} 1`, 0, false},
		{"hex", load + `vllm:cache_config_info{num_gpu_blocks="0x10"} 1`, 0, false},
		{"huge", load + `vllm:cache_config_info{num_gpu_blocks="99999999999999999999999"} 1`, 0, false},
		{"above the bound", load + `vllm:cache_config_info{num_gpu_blocks="2147483648"} 1`, 0, false},
		{"escaped", load + `vllm:cache_config_info{num_gpu_blocks="1\"2"} 1`, 0, false},
		{"unterminated value", load + `vllm:cache_config_info{num_gpu_blocks="12} 1`, 0, false},
		{"a bad value is not this field's business", load + `vllm:cache_config_info{num_gpu_blocks="12"} x`, 12, true},
		{"absent", load, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if s.KVBlocks != c.want || s.Have.KVBlocks != c.known {
				t.Fatalf("got %d (known %v), want %d (%v)", s.KVBlocks, s.Have.KVBlocks, c.want, c.known)
			}
		})
	}
	// Unsized and nothing else: no metric this package understands.
	if _, err := Parse([]byte(`vllm:cache_config_info{num_gpu_blocks="None"} 1`)); !errors.Is(err, ErrNoMetrics) {
		t.Fatalf("unsized alone: %v", err)
	}
	// A broken label set of an info line is skipped, not a failed scrape.
	if _, err := Parse([]byte(load + `vllm:cache_config_info{num_gpu_blocks="12 1`)); err != nil {
		t.Fatalf("broken info line: %v", err)
	}
}

// The size in tokens, the unit every engine's cache can be compared in:
// vLLM's blocks times its block size, SGLang's max_total_num_tokens.
func TestParseKVTokens(t *testing.T) {
	const vllm = "vllm:num_requests_waiting 0\n"
	const sglang = "sglang:num_queue_reqs{model_name=\"m\"} 0\n"
	for _, c := range []struct {
		name  string
		body  string
		want  int
		known bool
	}{
		{"vLLM", vllm + `vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="27152",num_cpu_blocks="None"} 1.0`, 27152 * 16, true},
		{"vLLM, block size after the count", vllm + `vllm:cache_config_info{num_gpu_blocks="136",block_size="32"} 1`, 136 * 32, true},
		{"vLLM without a block size", vllm + `vllm:cache_config_info{num_gpu_blocks="200"} 1`, 0, false},
		{"vLLM, block size not a number", vllm + `vllm:cache_config_info{block_size="None",num_gpu_blocks="200"} 1`, 0, false},
		{"vLLM, block size beyond belief", vllm + `vllm:cache_config_info{block_size="65536",num_gpu_blocks="200"} 1`, 0, false},
		{"vLLM, not yet sized", vllm + `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1`, 0, false},
		{"SGLang", sglang + `sglang:max_total_num_tokens{model_name="m"} 161721.0`, 161721, true},
		{"SGLang, one series per rank", sglang + "sglang:max_total_num_tokens{tp_rank=\"0\"} 5000\nsglang:max_total_num_tokens{tp_rank=\"1\"} 5000", 5000, true},
		{"SGLang, exponent form", sglang + `sglang:max_total_num_tokens 1.5e+06`, 1500000, true},
		{"SGLang, fractional", sglang + `sglang:max_total_num_tokens 10.5`, 0, false},
		{"SGLang, zero", sglang + `sglang:max_total_num_tokens 0`, 0, false},
		{"SGLang, negative", sglang + `sglang:max_total_num_tokens -3`, 0, false},
		{"SGLang, not a number", sglang + `sglang:max_total_num_tokens NaN`, 0, false},
		{"SGLang, beyond belief", sglang + `sglang:max_total_num_tokens 1e300`, 0, false},
		{"SGLang, broken labels", sglang + `sglang:max_total_num_tokens{model_name="m 5`, 0, false},
		{"absent", sglang, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if s.KVTokens != c.want || s.Have.KVTokens != c.known {
				t.Fatalf("got %d (known %v), want %d (%v)", s.KVTokens, s.Have.KVTokens, c.want, c.known)
			}
		})
	}
}
