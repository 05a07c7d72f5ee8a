package caddymodule

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// An explicit zero is a zero however it is spelled: "0.0", "-0", "+0" or
// "00" parse to the same number as "0", and must not turn into the
// default (cache_threshold 0.5, balance_abs_threshold 32) because the
// text is not exactly "0".
func TestCacheAwareExplicitZeroInAnySpelling(t *testing.T) {
	for _, c := range []struct{ opt, val string }{
		{"cache_threshold", "0"},
		{"cache_threshold", "0.0"},
		{"cache_threshold", "0.000"},
		{"cache_threshold", "-0"},
		{"cache_threshold", "0e0"},
		{"balance_abs_threshold", "0"},
		{"balance_abs_threshold", "00"},
		{"balance_abs_threshold", "+0"},
		{"balance_abs_threshold", "-0"},
	} {
		var p CacheAware
		d := caddyfile.NewTestDispenser("cache_aware {\n" + c.opt + " " + c.val + "\n}")
		if err := p.UnmarshalCaddyfile(d); err != nil {
			t.Fatalf("%s %s: %v", c.opt, c.val, err)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("%s %s: %v", c.opt, c.val, err)
		}
		cfg := p.routerConfig().WithDefaults()
		switch c.opt {
		case "cache_threshold":
			if cfg.CacheThreshold != 0 {
				t.Errorf("cache_threshold %s runs with %g, want 0", c.val, cfg.CacheThreshold)
			}
		default:
			if cfg.BalanceAbsThreshold != 0 {
				t.Errorf("balance_abs_threshold %s runs with %d, want 0", c.val, cfg.BalanceAbsThreshold)
			}
		}
	}
	// A value that is not zero stays what it says, and a bad one is still refused.
	var p CacheAware
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("cache_aware {\ncache_threshold 0.25\nbalance_abs_threshold 7\n}")); err != nil {
		t.Fatal(err)
	}
	if cfg := p.routerConfig().WithDefaults(); cfg.CacheThreshold != 0.25 || cfg.BalanceAbsThreshold != 7 {
		t.Fatalf("runs with %+v, want cache_threshold 0.25, balance_abs_threshold 7", cfg)
	}
	for _, bad := range []string{"cache_threshold -0.5", "cache_threshold x", "balance_abs_threshold 0.0", "balance_abs_threshold -1"} {
		var p CacheAware
		if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("cache_aware {\n" + bad + "\n}")); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
