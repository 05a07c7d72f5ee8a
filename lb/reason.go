package lb

// Why a policy chose a replica. Pick sets Request.Reason to one of these
// after a successful pick, so the adapter can show the decision (access
// log, response headers, a debug line); they are part of the documented
// interface (docs/api.md), so keep them short, stable and snake_case.
const (
	// ReasonLeastLatency: the lowest predicted latency, picked at once
	// (queued_least_latency).
	ReasonLeastLatency = "least_latency"
	// ReasonQueued: the request waited in the policy's queue until a slot
	// was handed to it (queued_least_latency, the global queue of
	// global_redis_least).
	ReasonQueued = "queued"
	// ReasonPrefixMatch: the replica holding the longest cached prefix of
	// the prompt (cache_aware).
	ReasonPrefixMatch = "prefix_match"
	// ReasonImbalanced: the pool was imbalanced, so the least loaded
	// replica won whatever it caches (cache_aware).
	ReasonImbalanced = "imbalanced"
	// ReasonLeastLoad: the fewest requests in flight (cache_aware on a
	// prefix miss, or a request without a prompt).
	ReasonLeastLoad = "least_load"
	// ReasonSmallestTree: the replica caching the least text (cache_aware
	// on a prefix miss under miss_policy smallest_tree).
	ReasonSmallestTree = "smallest_tree"
	// ReasonScore: the best total of the weighted scorers (load_aware).
	ReasonScore = "score"
	// ReasonFallback: a retry took the next replica of the first
	// attempt's ranking (load_aware).
	ReasonFallback = "fallback"
	// ReasonGlobalLeast: the least loaded across every instance, counted
	// exactly in Redis (global_redis_least).
	ReasonGlobalLeast = "global_least"
	// ReasonViewPick: picked from this instance's recent view of Redis's
	// counts, beyond call_rate (global_redis_least).
	ReasonViewPick = "view_pick"
	// ReasonLocalFallback: this instance's own counts chose
	// (global_redis_least): Redis did not answer, or none of the
	// candidates is a member of the pool in Redis (another instance
	// synced a different backend set).
	ReasonLocalFallback = "local_fallback"
)
