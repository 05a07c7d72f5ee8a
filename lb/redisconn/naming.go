package redisconn

import (
	"crypto/rand"
	"encoding/hex"
	"os"
)

// How Sluice names things in Redis, in one place for every feature that
// shares state through it (global_redis_least, flow_control's gate,
// cache_aware's shared tree).

// KeyTag is the hash tag every key of pool starts with:
// {sluice:<prefix>:<pool>}. Redis Cluster keeps the keys of one tag in
// one slot, so one script can touch every key of a pool; prefix keeps
// deployments that share a Redis apart. Neither may hold '}' (Validate
// refuses it in the prefix; pool names are letters, digits, '.', '_', '-'),
// which would end the tag early.
func KeyTag(prefix, pool string) string { return "{sluice:" + prefix + ":" + pool + "}" }

// InstanceID names one instance's records in Redis: name (default: the
// host name, else "sluice"), a dash and 12 random hex digits, new at every
// call, so a restarted instance never takes over the records (leases,
// holdings) its previous life left behind.
func InstanceID(name string) string {
	if name == "" {
		name, _ = os.Hostname()
		if name == "" {
			name = "sluice"
		}
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return name + "-" + hex.EncodeToString(b)
}
