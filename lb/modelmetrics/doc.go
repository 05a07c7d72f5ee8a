// Package modelmetrics scrapes each replica's own view of its load from the
// model server's Prometheus endpoint: requests waiting, requests running and
// KV-cache usage. It is the data layer shared by the load_aware scorers and
// flow control's saturation detector; one Scraper serves one pool.
//
// Understood metric names, per field, first present wins (so a server that
// exports both the vLLM and the SGLang names, like the project's simulator,
// is read once, under the vLLM names):
//
//	field         vLLM                                    SGLang                   Triton TensorRT-LLM backend                               TGI
//	Waiting       vllm:num_requests_waiting               sglang:num_queue_reqs    nv_trt_llm_request_metrics{request_type="waiting"}        tgi_queue_size
//	Running       vllm:num_requests_running               sglang:num_running_reqs  nv_trt_llm_request_metrics{request_type="scheduled"}      tgi_batch_current_size
//	KVCacheUsage  vllm:kv_cache_usage_perc, then          sglang:token_usage       nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}
//	              vllm:gpu_cache_usage_perc (older vLLM)
//
// A metric with several series (per model_name, per engine, …) is summed for
// the counts and maxed for the usage fraction; a series given twice (same
// name and labels) counts once, with its first sample. Usage values are fractions;
// a value above 1 and at most 100 is taken as a percentage and divided by
// 100, and the result is clamped to [0, 1]. The trtllm_ names of trtllm-serve
// (1.1) carry only counters and latency histograms, no queue or KV gauges,
// so they are not read.
//
// A replica is outside input, so what a scrape reads is bounded: the
// headers to 64 KiB, the (decompressed) body to MaxBodyBytes, the whole
// exchange to Config.Timeout; a redirect is followed only on the
// replica's own host (a redirect elsewhere is a failed scrape, not that
// host's load); and the error a failed scrape keeps quotes at most a few
// hundred bytes of what the replica sent.
//
// Replicas at https:// URLs are read with Config.TLS (the TLS settings of
// the proxy in front of them), over HTTP/1.1.
//
// A replica whose last scrape failed (transport error, timeout, non-200,
// unparsable body, none of the names above) or whose last good scrape is
// older than Config.Staleness is Stale, and one never scraped is Unknown:
// a dead replica never looks idle. A failing replica is scraped less often
// (see Config.MaxBackoff) and stays Stale until a scrape succeeds.
package modelmetrics
