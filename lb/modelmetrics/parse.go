package modelmetrics

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
)

type field uint8

const (
	fieldWaiting field = iota
	fieldRunning
	fieldKV
)

// source is one metric feeding a field, optionally only its series whose
// label equals want. Within a field, earlier sources win.
type source struct {
	name        string
	label, want string
	field       field
}

var sources = [...]source{
	{name: "vllm:num_requests_waiting", field: fieldWaiting},
	{name: "sglang:num_queue_reqs", field: fieldWaiting},
	{name: "nv_trt_llm_request_metrics", label: "request_type", want: "waiting", field: fieldWaiting},
	{name: "tgi_queue_size", field: fieldWaiting},

	{name: "vllm:num_requests_running", field: fieldRunning},
	{name: "sglang:num_running_reqs", field: fieldRunning},
	{name: "nv_trt_llm_request_metrics", label: "request_type", want: "scheduled", field: fieldRunning},
	{name: "tgi_batch_current_size", field: fieldRunning},

	{name: "vllm:kv_cache_usage_perc", field: fieldKV},
	{name: "vllm:gpu_cache_usage_perc", field: fieldKV},
	{name: "sglang:token_usage", field: fieldKV},
	{name: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", want: "fraction", field: fieldKV},
}

// byName indexes sources by metric name.
var byName = func() map[string][]int {
	m := map[string][]int{}
	for i, s := range sources {
		m[s.name] = append(m[s.name], i)
	}
	return m
}()

// ErrNoMetrics: the body has none of the understood metrics, so it says
// nothing about the replica's load (wrong path, or an unsupported server).
var ErrNoMetrics = errors.New("modelmetrics: no known model-server metric in the response")

// Parse reads the Prometheus text format and returns the load it reports.
// Comments, unknown metrics, histograms and lines that are not samples of
// an understood metric are skipped; a malformed or non-finite sample of an
// understood metric is an error, as is a body with none of them. A series
// given twice counts once, with its first sample (see seriesSet).
func Parse(body []byte) (Sample, error) {
	type acc struct {
		v    float64
		seen bool
	}
	var accs [len(sources)]acc
	var s Sample
	var seen seriesSet
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := bytes.IndexAny(line, "{ \t")
		if end < 0 {
			end = len(line) // a name alone: bad if it is one of ours
		}
		// Blanks may part the name from its label set (`name {l="v"} 1`
		// is valid text: Prometheus reads it); read as a value, the label
		// set failed every scrape of such a replica.
		after := bytes.TrimLeft(line[end:], " \t")
		switch string(line[:end]) {
		case cacheConfigInfo:
			if n, size, ok := kvBlocks(after); ok && !s.Have.KVBlocks {
				s.KVBlocks, s.Have.KVBlocks = n, true
				if t := int64(n) * int64(size); size > 0 && t < maxKVTokens && !s.Have.KVTokens {
					s.KVTokens, s.Have.KVTokens = int(t), true
				}
			}
			continue
		case sglangMaxTokens:
			if seen.again(line[:end], after) {
				continue
			}
			if n, ok := kvTokens(after); ok {
				// One series per rank: tensor-parallel ranks share one
				// pool and report it alike; the largest is the pool.
				s.KVTokens, s.Have.KVTokens = max(s.KVTokens, n), true
			}
			continue
		}
		idx, ok := byName[string(line[:end])]
		if !ok {
			continue
		}
		name := line[:end]
		labels, rest, err := splitLabels(after)
		if err != nil {
			return Sample{}, fmt.Errorf("modelmetrics: %s: %w", name, err)
		}
		v, err := parseValue(rest)
		if err != nil {
			return Sample{}, fmt.Errorf("modelmetrics: %s: %w", name, err)
		}
		if seen.again(name, after) {
			continue // a series given twice: its first sample stands (see seriesSet)
		}
		for _, i := range idx {
			src := &sources[i]
			if src.label != "" {
				got, ok := labelValue(labels, src.label)
				if !ok || string(got) != src.want {
					continue
				}
			}
			a := &accs[i]
			if src.field == fieldKV {
				a.v = max(a.v, usage(v))
			} else {
				if v < 0 {
					return Sample{}, fmt.Errorf("modelmetrics: %s: negative count %v", name, v)
				}
				a.v += v
				if a.v > maxCount {
					return Sample{}, fmt.Errorf("modelmetrics: %s: count %v beyond belief (the series sum to more than %d)", name, v, int64(maxCount))
				}
			}
			a.seen = true
		}
	}
	for i, src := range sources {
		a := accs[i]
		if !a.seen {
			continue
		}
		switch {
		case src.field == fieldWaiting && !s.Have.Waiting:
			s.Waiting, s.Have.Waiting = a.v, true
		case src.field == fieldRunning && !s.Have.Running:
			s.Running, s.Have.Running = a.v, true
		case src.field == fieldKV && !s.Have.KVCache:
			s.KVCacheUsage, s.Have.KVCache = a.v, true
		}
	}
	if s.Have == (Have{}) {
		return Sample{}, ErrNoMetrics
	}
	return s, nil
}

// maxCount bounds a believable count of requests, and the sum of a
// field's series: past float64's exact integers a count is no count, and
// a sum that overflows to +Inf scores every replica NaN (Inf − Inf).
const maxCount = 1 << 53

// cacheConfigInfo is vLLM's info metric of its cache configuration
// (llm-d-inference-sim exports it too); its num_gpu_blocks label is the
// KV cache size in blocks.
const cacheConfigInfo = "vllm:cache_config_info"

// maxKVBlocks bounds a believable cache size: a larger label is ignored,
// as is anything but a plain positive integer ("None" before sizing).
const maxKVBlocks = 1 << 31

// sglangMaxTokens is SGLang's KV cache size in tokens (a gauge set once
// at its start).
const sglangMaxTokens = "sglang:max_total_num_tokens"

// maxBlockTokens bounds a believable block size (vLLM's are 1-256
// tokens); a larger label leaves the size in tokens unknown.
const maxBlockTokens = 1 << 16

// maxKVTokens bounds a believable size in tokens (and keeps it an int on
// 32-bit platforms).
const maxKVTokens = min(1<<47, math.MaxInt)

// kvBlocks reads num_gpu_blocks, and block_size where it is valid (else
// 0), from an info line's label set. An info line is no load figure: a
// malformed one is ignored, not an error.
func kvBlocks(rest []byte) (blocks, blockTokens int, ok bool) {
	labels, _, err := splitLabels(rest)
	if err != nil {
		return 0, 0, false
	}
	v, found := labelValue(labels, "num_gpu_blocks")
	if !found {
		return 0, 0, false
	}
	n, ok := positiveInt(v, maxKVBlocks)
	if !ok {
		return 0, 0, false
	}
	if v, found := labelValue(labels, "block_size"); found {
		blockTokens, _ = positiveInt(v, maxBlockTokens)
	}
	return n, blockTokens, true
}

// kvTokens reads a size gauge's value: a whole number of tokens (written
// as a float, "161721.0"), positive and believable; anything else leaves
// the size unknown.
func kvTokens(rest []byte) (int, bool) {
	_, rest, err := splitLabels(rest)
	if err != nil {
		return 0, false
	}
	v, err := parseValue(rest)
	if err != nil || v != math.Trunc(v) || v <= 0 || v >= maxKVTokens {
		return 0, false
	}
	return int(v), true
}

// positiveInt reads a label value that must be a plain decimal integer in
// (0, limit): "None" (not sized yet), signs, fractions, hex are not.
func positiveInt(v []byte, limit int64) (int, bool) {
	if len(v) == 0 || len(v) > 10 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n <= 0 || n >= limit {
		return 0, false
	}
	return int(n), true
}

// usage turns a usage value into a fraction: some exporters report percent.
func usage(v float64) float64 {
	if v > 1 && v <= 100 {
		v /= 100
	}
	return min(max(v, 0), 1)
}

// splitLabels splits `{a="b",…} value [ts]` (or ` value [ts]`) into the
// label text between the braces and the rest.
func splitLabels(s []byte) (labels, rest []byte, err error) {
	if len(s) == 0 || s[0] != '{' {
		return nil, s, nil
	}
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++ // skip the escaped character
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return s[1:i], s[i+1:], nil
		}
	}
	return nil, nil, errors.New("unterminated label set")
}

// parseValue reads the sample value, ignoring an optional timestamp.
func parseValue(s []byte) (float64, error) {
	s = bytes.TrimLeft(s, " \t")
	if i := bytes.IndexAny(s, " \t"); i >= 0 {
		s = s[:i]
	}
	v, err := strconv.ParseFloat(string(s), 64)
	if err != nil {
		return 0, fmt.Errorf("bad value %s", quoteClipped(s))
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("non-finite value %s", quoteClipped(s))
	}
	return v, nil
}

// maxQuoted bounds the replica's text an error quotes: the error is kept
// per replica and shown by health, and a value may be megabytes long.
const maxQuoted = 64

// quoteClipped quotes at most maxQuoted bytes of b, saying how long the
// rest was.
func quoteClipped(b []byte) string {
	if len(b) <= maxQuoted {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("%q… (%d bytes)", b[:maxQuoted], len(b))
}

// labelValue returns the raw (still escaped) value of label key. The
// wanted values contain no escapes, so comparing raw text is exact.
func labelValue(labels []byte, key string) ([]byte, bool) {
	for len(labels) > 0 {
		labels = bytes.TrimLeft(labels, " \t,")
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 {
			return nil, false
		}
		k := bytes.TrimSpace(labels[:eq])
		labels = bytes.TrimLeft(labels[eq+1:], " \t")
		if len(labels) == 0 || labels[0] != '"' {
			return nil, false
		}
		end := 1
		for end < len(labels) && labels[end] != '"' {
			if labels[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(labels) {
			return nil, false
		}
		if string(k) == key {
			return labels[1:end], true
		}
		labels = labels[end+1:]
	}
	return nil, false
}
