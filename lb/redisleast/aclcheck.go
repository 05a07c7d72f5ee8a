package redisleast

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// permScript runs, on one scratch key of the pool and on the instance's
// notification channel, every command the store's scripts and clients use,
// in forms that leave nothing behind. New runs it once, so a Redis user
// lacking a command, or access to the pool's keys or channels, fails the
// load with Redis's NOPERM naming what is missing, instead of every select
// later falling back to local counts (what a denied script wrote is not
// rolled back, hence the DEL first).
// TestPermScriptCoversEveryScriptCommand keeps it in step with the scripts.
//
// KEYS: {tag}:permcheck
// ARGV: notification channel
var permScript = redisconn.PermScript(`local k, ch = KEYS[1], ARGV[1]`, `{
  {'DEL', k}, {'EXISTS', k},
  {'HGET', k, 'f'}, {'HMGET', k, 'f'}, {'HEXISTS', k, 'f'}, {'HGETALL', k}, {'HLEN', k}, {'HVALS', k},
  {'HSET', k, 'f', 'v'}, {'HDEL', k, 'f'},
  {'ZSCORE', k, 'm'}, {'ZRANGE', k, 0, -1}, {'ZRANGEBYSCORE', k, '-inf', '+inf'}, {'ZCARD', k},
  {'ZADD', k, 0, 'm'}, {'ZINCRBY', k, 1, 'm'}, {'ZREM', k, 'm'},
  {'LINDEX', k, 0}, {'LLEN', k}, {'RPUSH', k, 'x'}, {'LREM', k, 0, 'x'}, {'LPOP', k},
  {'SMEMBERS', k}, {'SADD', k, 'm'}, {'SREM', k, 'm'},
  {'SET', k, '1', 'PX', 1000}, {'DEL', k},
  {'PUBLISH', ch, 'permcheck'},
}`, "on the pool's keys or channel, which Sluice needs")

// checkPermissions runs permScript (see there).
func (m *member) checkPermissions(ctx context.Context) error {
	res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return permScript.Exec(ctx, m.rc(), []string{m.k.tag + ":permcheck"}, []string{m.k.notify(m.ident.Load().id)})
	})
	return res.Error() // unwrapped: New tells error replies from transport errors
}
