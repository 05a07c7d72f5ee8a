package redisconn

import (
	"regexp"
	"testing"
)

func TestKeyTag(t *testing.T) {
	if got := KeyTag("prod", "gpu-a"); got != "{sluice:prod:gpu-a}" {
		t.Fatalf("KeyTag = %q", got)
	}
}

// Every call mints a new id under the given name, or the host name.
func TestInstanceID(t *testing.T) {
	a, b := InstanceID("edge-1"), InstanceID("edge-1")
	if a == b || !regexp.MustCompile(`^edge-1-[0-9a-f]{12}$`).MatchString(a) {
		t.Fatalf("ids %q %q", a, b)
	}
	if id := InstanceID(""); !regexp.MustCompile(`^.+-[0-9a-f]{12}$`).MatchString(id) {
		t.Fatalf("default id %q", id)
	}
}
