// Package kvevents keeps an exact prefix index from engine KV events.
//
// vLLM, SGLang and llm-d-inference-sim publish over ZMQ what each replica's
// KV cache stores and evicts (BlockStored, BlockRemoved, AllBlocksCleared;
// see decode.go for the wire layouts). This package decodes those messages
// with bounded sizes (a bad one is dropped and counted, never a panic),
// and keeps per replica the set of block keys Sluice computes itself from
// the token ids (keys.go: 16-token blocks, chained xxhash64, Sluice's own
// seed), so the engine's hash seed and block size need not match. Engine
// hashes map to those keys so BlockRemoved, which carries only engine
// hashes, can evict. Index.Match gives each replica's longest cached prefix
// for a request's tokens.
//
// Sequence numbers are tracked per topic and data-parallel rank: a gap or a
// sequence going back (publisher restart) clears that rank's entries, since
// the events in between are lost. Where the engine serves a replay socket
// (vLLM's and SGLang's replay_endpoint), the Listener first asks it for the
// lost messages and clears only if it cannot get them (replay.go). Memory
// is bounded per replica and in total (oldest blocks dropped first,
// counted).
//
// No Caddy import: the cache_aware adapter wires an Index and a Listener.
package kvevents
