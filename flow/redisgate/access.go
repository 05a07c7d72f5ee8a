package redisgate

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// accessScript runs, on two scratch keys of the pool, every command the
// claim script uses, in forms that leave nothing behind (what HSET and
// ZADD add, HDEL and ZREM take away; DEL of keys already empty); the
// first refusal comes back as NOPERM naming the command
// (redisconn.PermScript).
// TestAccessScriptCoversTheClaimScript keeps it in step with the claim
// script.
//
// KEYS: {tag}:flow:permcheck (a hash), {tag}:flow:permcheck:z (a sorted set)
var accessScript = redisconn.PermScript(`local h, z = KEYS[1], KEYS[2]`, `{
  {'TIME'},
  {'HSET', h, 'f', 'v'}, {'HGET', h, 'f'}, {'HGETALL', h}, {'HVALS', h}, {'HLEN', h}, {'HINCRBY', h, 'n', 1},
  {'HDEL', h, 'f'}, {'HDEL', h, 'n'},
  {'ZADD', z, 0, 'm'}, {'ZCARD', z}, {'ZRANGEBYSCORE', z, '-inf', '+inf'}, {'ZRANGE', z, 0, -1, 'WITHSCORES'},
  {'ZREM', z, 'm'}, {'DEL', h, z},
}`, "on the pool's keys, which flow_control needs")

// CheckAccess connects once with cfg and runs every command the gate
// will use on the pool's keys. A Redis that answers with an error — a
// wrong password, a user lacking a command or the pool's keys — is
// configuration: the error says what Redis refused, and the caller
// should refuse the config. A Redis that cannot be reached (refused,
// timed out, unknown host) is not: CheckAccess returns nil and the gate
// starts on its fallback share, as it does whenever Redis is away.
func CheckAccess(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	opt, err := cfg.Conn.ClientOption(redisconn.ConnTimeout(cfg.Conn.ReadTimeout))
	if err != nil {
		return err
	}
	cl, err := rueidis.NewClient(opt)
	if err != nil {
		if isReply(err) {
			return fmt.Errorf("redis %v: %w", cfg.Conn.Addrs, err)
		}
		return nil // unreachable: the gate's fallback, logged when it starts
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.Conn.ReadTimeout)
	defer cancel()
	k := KeysFor(cfg.Conn.KeyPrefix, cfg.Pool)
	scratch := k.Live[:len(k.Live)-len("live")] + "permcheck"
	err = accessScript.Exec(ctx, cl, []string{scratch, scratch + ":z"}, nil).Error()
	if err != nil && isReply(err) {
		return fmt.Errorf("redis %v: checking the user's permissions: %w", cfg.Conn.Addrs, err)
	}
	return nil
}

// isReply is true for an error Redis answered (not a transport error).
func isReply(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}
