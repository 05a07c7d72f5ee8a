package kvevents

// KV-cache groups: vLLM runs a hybrid model (full attention with
// sliding-window or mamba layers) with one KV-cache group per layer kind,
// each publishing its blocks under the same hashes (group_idx). The index
// keys one full-attention group (see keyedGroup).

// maxGroupIdx bounds a KV-cache group's index (vLLM's models have a few
// groups; DeepSeek-V4 five): one beyond keys nothing.
const maxGroupIdx = 255

// mainKinds are the kv_cache_spec_kind values of vLLM's full-attention
// groups (vllm/v1/kv_cache_interface.py; NVIDIA Dynamo's kv-router keys
// the same three).
var mainKinds = map[string]bool{"full_attention": true, "mla_attention": true, "sink_full_attention": true}

// keyedGroup says whether the index keys ev's KV-cache group, and which
// it is. vLLM reuses a prefix only as far as its full-attention group
// holds it (kv_cache_coordinator.py: that group bounds the hit first);
// a sliding-window or mamba group's blocks, under the same hashes, do
// not make a prefix reusable, and many of its stores name no positions
// (Event.Sparse). So one full-attention group is keyed: a group is one
// when a store said so (kv_cache_spec_kind), or, of a group whose kind
// no store gave (vLLM before 0.26, or none: SGLang, the sim), when it is
// group 0. Of several, the lowest (vLLM frees a request's groups in
// order, so the lowest loses its blocks first); a lower one seen later
// replaces it, and what was keyed of the other goes. Limits: a sliding
// window or mamba group that lost the end of a prefix the full-attention
// group holds shortens the engine's reuse where the index does not.
func (ix *Index) keyedGroup(r *replica, ev *Event) (int, bool) {
	g := 0
	if ev.HasGroup {
		g = ev.Group
	}
	if g < 0 || g > maxGroupIdx {
		return 0, false
	}
	if ev.Kind == BlockStored && ev.SpecKind != "" {
		if r.groupMain == nil {
			r.groupMain = make(map[int]bool)
		}
		r.groupMain[g] = mainKinds[ev.SpecKind]
		if g == r.primary && !r.groupMain[g] {
			ix.dropGroup(r, g)
			r.primary = -1
		}
	}
	main, known := r.groupMain[g]
	if !known {
		main = g == 0
	}
	switch {
	case !main:
		return 0, false
	case ev.Kind == BlockStored && (r.primary < 0 || g < r.primary):
		if r.primary >= 0 {
			ix.dropGroup(r, r.primary)
		}
		r.primary = g
	case r.primary < 0:
		// a removal before any store: nothing keyed yet (removed_unknown)
		return g, true
	}
	return g, g == r.primary
}

// dropGroup drops every block of one KV-cache group, all ranks and media.
func (ix *Index) dropGroup(r *replica, g int) {
	ix.dropSources(r, func(src source) bool { return src.group == g })
}
