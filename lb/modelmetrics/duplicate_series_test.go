package modelmetrics

import "testing"

// One series twice in an exposition (the same name and labels, whatever
// their order or spacing) is malformed text, not two replicas' worth of
// load: the first sample is the series' value, as Prometheus keeps it.
// Summed, a duplicated waiting count doubled the replica's queue.
func TestParseDuplicateSeriesTakesTheFirst(t *testing.T) {
	body := `vllm:num_requests_waiting{engine="0",model_name="a"} 4` + "\n" +
		`vllm:num_requests_waiting{engine="1",model_name="a"} 1` + "\n" +
		`vllm:num_requests_waiting{model_name="a",engine="0"} 4` + "\n" +
		`vllm:num_requests_waiting{ engine = "1" , model_name="a",} 7` + "\n" +
		`vllm:num_requests_running 3` + "\n" +
		`vllm:num_requests_running{} 3` + "\n" +
		`vllm:kv_cache_usage_perc{engine="0"} 0.25` + "\n" +
		`vllm:kv_cache_usage_perc{engine="0"} 0.75` + "\n" +
		`sglang:max_total_num_tokens{tp_rank="0"} 1000` + "\n" +
		`sglang:max_total_num_tokens{tp_rank="0"} 5000` + "\n"
	s, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 5 || s.Running != 3 || s.KVCacheUsage != 0.25 || s.KVTokens != 1000 {
		t.Fatalf("got waiting %v running %v kv %v tokens %v, want 5 3 0.25 1000 (each series' first sample)",
			s.Waiting, s.Running, s.KVCacheUsage, s.KVTokens)
	}
}

// Series that differ in a label value stay distinct, even where the
// differing value is quoted with escapes.
func TestParseSeriesDifferingInOneLabelAreSummed(t *testing.T) {
	body := `vllm:num_requests_waiting{model_name="a\"b"} 1` + "\n" +
		`vllm:num_requests_waiting{model_name="a\\b"} 2` + "\n" +
		`vllm:num_requests_waiting{model_name="a,b"} 4` + "\n" +
		`vllm:num_requests_waiting{model_name="a",b="x"} 8` + "\n"
	s, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 15 {
		t.Fatalf("waiting %v, want 15 (four distinct series)", s.Waiting)
	}
}
