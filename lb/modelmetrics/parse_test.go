package modelmetrics

import (
	"errors"
	"testing"
)

const vllmNew = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 4.0
vllm:num_requests_waiting{engine="1",model_name="a"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.75
vllm:gpu_cache_usage_perc{engine="0",model_name="a"} 0.1
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="a"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="a"} 7.0
vllm:time_to_first_token_seconds_count{model_name="a"} 7.0
vllm:time_to_first_token_seconds_sum{model_name="a"} 1.5
vllm:num_requests_waiting_created{model_name="a"} 1.7e9
`

// Older vLLM: gpu_cache_usage_perc only, and a timestamp after the value.
const vllmOld = `vllm:num_requests_running{model_name="b"} 1 1712345678000
vllm:num_requests_waiting{model_name="b"} 0
vllm:gpu_cache_usage_perc{model_name="b"} 0.5
`

const sglang = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 8.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 8.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="m",tp_rank="1"} 3.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.4
sglang:token_usage{model_name="m",tp_rank="1"} 0.6
`

const trtllm = `# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 6
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 6
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 9
nv_trt_llm_request_metrics{model="other",request_type="waiting",version="1"} 1
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.4875
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 3042
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6239
`

func TestParseEngines(t *testing.T) {
	for _, tc := range []struct {
		name, body           string
		waiting, running, kv float64
	}{
		// kv_cache_usage_perc wins over gpu_cache_usage_perc; usage is maxed.
		{"vllm new", vllmNew, 5, 5, 0.75},
		{"vllm old", vllmOld, 0, 1, 0.5},
		{"sglang", sglang, 5, 16, 0.6},
		// Only request_type waiting / scheduled count; the fraction, not
		// the used/max blocks, is the usage.
		{"trt-llm", trtllm, 10, 6, 0.4875},
		// The simulator's shape: both engines' names; vLLM's are read once.
		{"vllm and sglang", vllmOld + sglang, 0, 1, 0.5},
	} {
		s, err := Parse([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if s.Have != (Have{Waiting: true, Running: true, KVCache: true}) || s.Waiting != tc.waiting || s.Running != tc.running || s.KVCacheUsage != tc.kv {
			t.Errorf("%s: got %+v, want waiting %v running %v kv %v", tc.name, s, tc.waiting, tc.running, tc.kv)
		}
	}
}

func TestParseUsagePercentAndClamp(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  float64
	}{{"0.3", 0.3}, {"1", 1}, {"42", 0.42}, {"100", 1}, {"250", 1}, {"-0.2", 0}} {
		s, err := Parse([]byte("sglang:token_usage " + tc.value + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if s.KVCacheUsage != tc.want {
			t.Errorf("usage %s: got %v, want %v", tc.value, s.KVCacheUsage, tc.want)
		}
	}
}

func TestParseToleratesJunkAndReportsPartialData(t *testing.T) {
	body := "\r\n" +
		"garbage line without value\n" +
		"{}\n" +
		`weird_metric{a="x}y",b="q\"uote"} 1` + "\n" +
		"# EOF-ish comment\n" +
		`vllm:num_requests_waiting{model_name="with \"quote\" and }"} 2` + "\r\n" +
		`  vllm:num_requests_running   3` + "\n" +
		"python_gc_objects_collected_total{generation=\"0\"} NaN\n"
	s, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 2 || s.Running != 3 || s.Have != (Have{Waiting: true, Running: true}) {
		t.Fatalf("got %+v", s)
	}
}

func TestParseErrors(t *testing.T) {
	for _, body := range []string{"", "<html>not metrics</html>\n", "# only comments\nprocess_cpu_seconds_total 12\n"} {
		if s, err := Parse([]byte(body)); !errors.Is(err, ErrNoMetrics) {
			t.Errorf("%q: got %+v, %v; want ErrNoMetrics", body, s, err)
		}
	}
	// A malformed sample of a known metric fails the whole body, even next
	// to good ones: half-read load is not load.
	for _, bad := range []string{
		"vllm:num_requests_waiting{model_name=\"a\" 2\n",
		"vllm:num_requests_waiting abc\n",
		"vllm:num_requests_waiting NaN\n",
		"vllm:num_requests_waiting +Inf\n",
		"vllm:num_requests_running -1\n",
		"vllm:num_requests_running\n",
		"sglang:token_usage{model_name=\"unterminated} 0.5\n",
		// Counts past exact integers, or series whose sum does not stay
		// finite: a load figure no scorer can rank (Inf − Inf is NaN).
		"vllm:num_requests_waiting 1e16\n",
		"vllm:num_requests_waiting{model_name=\"a\"} 1e308\nvllm:num_requests_waiting{model_name=\"b\"} 1e308\n",
	} {
		s, err := Parse([]byte(sglang + bad))
		if err == nil || errors.Is(err, ErrNoMetrics) {
			t.Errorf("%q: got %+v, %v; want a parse error", bad, s, err)
		}
	}
}

func TestParseTRTLabelMustMatchExactly(t *testing.T) {
	// A request_type that only starts like a wanted one is not it.
	body := `nv_trt_llm_request_metrics{request_type="waiting_extra"} 5` + "\n" +
		`nv_trt_llm_request_metrics{request_type="scheduled"} 2` + "\n"
	s, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if s.Have.Waiting || s.Running != 2 {
		t.Fatalf("got %+v", s)
	}
}
