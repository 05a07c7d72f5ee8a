package modelmetrics

import (
	"errors"
	"math"
	"testing"
)

// A replica's metrics page is outside input: whatever it holds, Parse
// returns either an error and nothing, or a sample every reader can use
// as it is (finite, non-negative counts; a usage fraction in [0, 1];
// cache sizes only when believable), and the same one every time.
//
//	go test -run '^$' -fuzz FuzzParse ./lb/modelmetrics/
func FuzzParse(f *testing.F) {
	for _, body := range []string{vllmNew, vllmOld, sglang, trtllm,
		"tgi_queue_size 3\ntgi_batch_current_size 2\n",
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1` + "\nvllm:num_requests_waiting 0\n",
		"sglang:max_total_num_tokens 161721.0\nsglang:num_queue_reqs 1\n",
		"vllm:num_requests_waiting{a=\"x\\\"}\"} 1e300\nvllm:num_requests_waiting 1e300\n",
		"vllm:kv_cache_usage_perc 55\n",
	} {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := Parse(body)
		again, err2 := Parse(body)
		if s != again || (err == nil) != (err2 == nil) {
			t.Fatalf("two parses differ: %+v, %v and %+v, %v", s, err, again, err2)
		}
		if err != nil {
			if s != (Sample{}) {
				t.Fatalf("error %v with a sample %+v", err, s)
			}
			return
		}
		if s.Have == (Have{}) {
			t.Fatalf("no error and nothing read: %+v", s)
		}
		count := func(name string, v float64, have bool) {
			if !have && v != 0 {
				t.Fatalf("%s %v without its flag", name, v)
			}
			if math.IsNaN(v) || v < 0 || v > maxCount {
				t.Fatalf("%s %v: not a count", name, v)
			}
		}
		count("waiting", s.Waiting, s.Have.Waiting)
		count("running", s.Running, s.Have.Running)
		if !(s.KVCacheUsage >= 0 && s.KVCacheUsage <= 1) || (!s.Have.KVCache && s.KVCacheUsage != 0) {
			t.Fatalf("kv cache usage %v (have %t)", s.KVCacheUsage, s.Have.KVCache)
		}
		if s.Have.KVBlocks != (s.KVBlocks > 0) || s.KVBlocks >= maxKVBlocks {
			t.Fatalf("kv blocks %d (have %t)", s.KVBlocks, s.Have.KVBlocks)
		}
		if s.Have.KVTokens != (s.KVTokens > 0) || int64(s.KVTokens) >= maxKVTokens {
			t.Fatalf("kv tokens %d (have %t)", s.KVTokens, s.Have.KVTokens)
		}
		if s.At != (Sample{}).At || s.Err != nil || errors.Is(err, ErrNoMetrics) {
			t.Fatalf("Parse set what only the scraper sets: %+v", s)
		}
	})
}
