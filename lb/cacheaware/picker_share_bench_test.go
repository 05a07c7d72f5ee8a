package cacheaware_test

import (
	"testing"

	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/cacheaware/share"
	"github.com/sluice-router/sluice/lb/redisconn"
)

// BenchmarkPickerPick4KBShared is BenchmarkPickerPick4KB with the tree
// shared: every pick also queues its prompt for publishing (no Redis
// here, so the buffer drops its oldest: the request path's whole cost).
func BenchmarkPickerPick4KBShared(b *testing.B) {
	cacheaware.BenchPickerPick(b, func(p *cacheaware.Picker) {
		s := share.New(share.Config{Conn: redisconn.Config{Addrs: []string{"127.0.0.1:1"}}, Pool: "bench"}, p.PeerRouted)
		b.Cleanup(s.Close)
		p.OnInsert(s.Publish)
	})
}
