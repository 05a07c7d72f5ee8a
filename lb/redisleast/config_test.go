package redisleast

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redisconn"
)

func TestConfigValidateNamesTheField(t *testing.T) {
	base := Config{Config: redisconn.Config{Addrs: []string{"127.0.0.1:6379"}}}.WithDefaults()
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if base.LeaseTTL != 10*time.Second || base.ReadTimeout != 250*time.Millisecond || base.InstanceID == "" {
		t.Fatalf("defaults not filled: %+v", base)
	}
	for field, mut := range map[string]func(*Config){
		"redis":            func(c *Config) { c.Addrs = nil },
		"redis:":           func(c *Config) { c.Addrs = []string{"no-port"} },
		"db":               func(c *Config) { c.DB = -1 },
		"ca_file":          func(c *Config) { c.CAFile = "/x.pem" },
		"max_inflight":     func(c *Config) { c.MaxInflight = -1 },
		"lease_ttl":        func(c *Config) { c.LeaseTTL = time.Millisecond },
		"breaker_failures": func(c *Config) { c.BreakerFailures = -1 },
		"queue_timeout":    func(c *Config) { c.QueueTimeout = time.Second },
		"read_timeout":     func(c *Config) { c.ReadTimeout = -time.Second },
	} {
		c := base
		mut(&c)
		err := c.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), strings.TrimSuffix(field, ":")) {
			t.Errorf("%s: err = %v, want one naming the field", field, err)
		}
	}
	c := base
	c.TLS, c.CAFile = true, "/nonexistent/ca.pem"
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "ca_file") {
		t.Errorf("missing CA file: err = %v", err)
	}
}

func TestKeysShareOneHashTag(t *testing.T) {
	k := newKeys("prod", "llama")
	for _, key := range []string{k.load, k.gone, k.insts, k.alive("i1"), k.inst("i1"),
		k.queue, k.waiters, k.assigned, k.notify("i1")} {
		if !strings.HasPrefix(key, "{sluice:prod:llama}:") {
			t.Errorf("%q lacks the pool's hash tag", key)
		}
	}
}

// permScript runs every command the scripts call, so New's check names
// a missing one.
func TestPermScriptCoversEveryScriptCommand(t *testing.T) {
	call, step := regexp.MustCompile(`redis\.call\('([A-Z]+)'`), regexp.MustCompile(`\{'([A-Z]+)'`)
	perm, err := os.ReadFile("aclcheck.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	for _, m := range step.FindAllStringSubmatch(string(perm), -1) {
		checked[m[1]] = true
	}
	for _, f := range []string{"scripts.go", "queue_scripts.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			if !checked[m[1]] {
				t.Errorf("%s calls %s, which permScript does not check", f, m[1])
			}
		}
	}
}
