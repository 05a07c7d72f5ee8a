package redisleast

// keys names one pool's Redis keys. All of them carry the same hash tag,
// so on a Redis Cluster they live in one slot and a script may touch them
// together.
//
//	{tag}:load          ZSET replica → global in-flight count (members = the backend set)
//	{tag}:gone          ZSET replica removed by Sync → requests still in flight on it
//	{tag}:insts         SET  ids of instances that may hold records
//	{tag}:alive:<id>    STRING with a TTL: the instance is alive while it exists
//	{tag}:inst:<id>     HASH request id → replica, one field per request in flight
type keys struct {
	load, gone, insts string
	tag               string
}

func newKeys(prefix, pool string) keys {
	tag := "{sluice:" + prefix + ":" + pool + "}"
	return keys{load: tag + ":load", gone: tag + ":gone", insts: tag + ":insts", tag: tag}
}

func (k keys) alive(id string) string { return k.tag + ":alive:" + id }
func (k keys) inst(id string) string  { return k.tag + ":inst:" + id }
