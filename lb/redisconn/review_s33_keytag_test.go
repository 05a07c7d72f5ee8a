package redisconn_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// slotter is a real Redis that answers CLUSTER KEYSLOT: the test cluster
// when one runs, else a private cluster-enabled node of this test (it
// computes slots without owning any).
func slotter(t *testing.T) rueidis.Client {
	t.Helper()
	if addrs := redistest.ClusterAddrs(); len(addrs) > 0 {
		return redistest.Client(t, redisconn.Config{Addrs: addrs})
	}
	dir := t.TempDir()
	srv, err := redistest.Start("", "--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	opt, err := (redisconn.Config{Addrs: []string{srv.Addr}}).WithDefaults().ClientOption(0)
	if err != nil {
		t.Fatal(err)
	}
	opt.ForceSingleClient = true // the node owns no slot: no cluster client
	cl, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Redis Cluster hashes a key by what lies between its first '{' and the
// first '}' after it. For every key_prefix Validate accepts, that is the
// whole tag {sluice:<key_prefix>:<pool>}, so different pools spread over
// the masters (docs/redis.md). A '}' in key_prefix used to end the tag
// early: every pool of the deployment then hashed to one slot, one master.
func TestKeyTagHashesWholeForEveryAcceptedPrefix(t *testing.T) {
	cl := slotter(t)
	ctx := context.Background()
	slot := func(key string) int64 {
		t.Helper()
		n, err := cl.Do(ctx, cl.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, prefix := range []string{"", "prod", "eu:prod", "a}b", "}", "a{b", "x}{y}"} {
		if (redisconn.Config{Addrs: []string{"h:6379"}, KeyPrefix: prefix}).WithDefaults().Validate() != nil {
			continue // refused at load: never names a key
		}
		for _, pool := range []string{"gpu-a", "gpu-b", "default"} {
			tag := redisconn.KeyTag(prefix, pool)
			whole := tag[1 : len(tag)-1]
			if got, want := slot(tag+":load"), slot(whole); got != want {
				t.Errorf("key_prefix %q accepted, pool %q: %s hashes to slot %d, the whole tag to %d",
					prefix, pool, tag+":load", got, want)
			}
		}
	}
}
