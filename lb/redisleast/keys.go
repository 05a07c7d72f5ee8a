package redisleast

import "github.com/sluice-router/sluice/lb/redisconn"

// keys names one pool's Redis keys. All of them carry the same hash tag,
// so on a Redis Cluster they live in one slot and a script may touch them
// together.
//
//	{tag}:load          ZSET replica → global in-flight count (members = the backend set)
//	{tag}:gone          ZSET replica removed by Sync → requests still in flight on it
//	{tag}:insts         SET  ids of instances that may hold records
//	{tag}:picks         ZSET member "n": picks recorded by batches (least-request mode, viewpick.go)
//	{tag}:alive:<id>    STRING with a TTL: the instance is alive while it exists
//	{tag}:inst:<id>     HASH request id → replica, one field per request in flight ("" a
//	                    tombstone); "#" the last batch applied, "!" the records' version
//	                    (reconcile.go)
//	{tag}:permcheck     scratch key of the permission check at New (never left behind)
//
// Queueing mode (QueueTimeout > 0) adds one global FIFO per pool. A queued
// request is named by its token "<instance id>:<request id>" (request ids
// are base 36, so the last ':' splits a token).
//
//	{tag}:queue         LIST tokens, oldest first (may hold tokens already cancelled)
//	{tag}:waiters       HASH token → instance id: the requests still waiting
//	{tag}:assigned      HASH token → replica: requests the queue handed a slot, until released
//	{tag}:cands         HASH token → the waiter's candidates, newline-separated: the only
//	                    replicas it may be handed (its instance's pool less the replicas
//	                    its request excluded and those down by passive health)
//	{tag}:qseq          HASH token → its place in the queue's order, "#" the counter: kept
//	                    while the token waits or holds the slot it was handed, so a
//	                    hand-over its instance's health refuses goes back to that place
//	                    (requeueQueueScript)
//	{tag}:idle          HASH member → "1": members no queued waiter lists among its
//	                    candidates (dispatch leaves them out: see dispatchFn)
//	{tag}:notify:<id>   pub/sub channel of instance <id>: "<request id> <replica>" per hand-over
type keys struct {
	load, gone, insts, picks string
	queue, waiters, assigned string
	cands, idle              string
	tag                      string
}

func newKeys(prefix, pool string) keys {
	tag := redisconn.KeyTag(prefix, pool)
	return keys{load: tag + ":load", gone: tag + ":gone", insts: tag + ":insts", picks: tag + ":picks",
		queue: tag + ":queue", waiters: tag + ":waiters", assigned: tag + ":assigned",
		cands: tag + ":cands", idle: tag + ":idle", tag: tag}
}

func (k keys) alive(id string) string  { return k.tag + ":alive:" + id }
func (k keys) inst(id string) string   { return k.tag + ":inst:" + id }
func (k keys) notify(id string) string { return k.tag + ":notify:" + id }
