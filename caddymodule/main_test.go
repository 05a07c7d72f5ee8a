package caddymodule

import (
	"testing"

	"github.com/sluice-router/sluice/lb/redistest"
)

// TestMain gives the Redis-backed tests a server: SLUICE_TEST_REDIS_ADDR's,
// or a private redis-server for the run (redistest.Addr fails a test that
// needs one under CI=true, and skips it elsewhere, when there is none).
func TestMain(m *testing.M) { redistest.Main(m) }
