package modelmetrics

import "time"

// Sample is one replica's load as last read from its metrics endpoint.
type Sample struct {
	Waiting, Running float64
	KVCacheUsage     float64 // fraction of the KV cache in use, 0..1
	// KVBlocks is the engine's KV cache size in blocks (vLLM's
	// num_gpu_blocks), known from its start, before the cache fills.
	KVBlocks int
	// KVTokens is the same size in tokens, the unit engines agree on:
	// vLLM's num_gpu_blocks × block_size, SGLang's max_total_num_tokens
	// (its pages may hold 1 token or 64, vLLM's blocks 16).
	KVTokens int
	// Have says which of the fields above the server exports; a missing
	// field is zero and must not be read as "idle".
	Have Have
	// At is when the values were read (the last successful scrape); zero
	// if no scrape has succeeded yet.
	At time.Time
	// Err is why the latest scrape failed, nil if it succeeded. The values
	// are then those of the last successful scrape, if any.
	Err error
}

// Have flags the fields a sample carries.
type Have struct{ Waiting, Running, KVCache, KVBlocks, KVTokens bool }

// Freshness says whether a sample may be trusted. The zero value is Unknown.
type Freshness uint8

const (
	// Unknown: the target was never scraped (or is not a target).
	Unknown Freshness = iota
	// Stale: the latest scrape failed or the values are older than
	// Config.Staleness.
	Stale
	// Fresh: the latest scrape succeeded within Config.Staleness.
	Fresh
)

func (f Freshness) String() string {
	switch f {
	case Stale:
		return "stale"
	case Fresh:
		return "fresh"
	}
	return "unknown"
}
