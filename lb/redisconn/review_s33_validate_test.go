package redisconn

import (
	"strings"
	"testing"
)

// An address whose port Sluice could never dial is a configuration error
// at load: a typo'd port used to load, and every Redis feature then ran
// on its local fallback for good (cache_aware's sharing retried forever,
// global_redis_least took it for a Redis away).
func TestValidateRefusesAnAddressWithoutAUsablePort(t *testing.T) {
	for _, addr := range []string{"10.0.0.5:", "10.0.0.5:637x", "10.0.0.5:99999", "10.0.0.5:0", "10.0.0.5:-1"} {
		err := Config{Addrs: []string{"10.0.0.6:6379", addr}}.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), addr) {
			t.Errorf("Validate(%q) = %v, want an error naming it", addr, err)
		}
	}
	for _, addr := range []string{"10.0.0.5:6379", "[::1]:6380", "redis.internal:65535", "localhost:1"} {
		if err := (Config{Addrs: []string{addr}}).WithDefaults().Validate(); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", addr, err)
		}
	}
}
