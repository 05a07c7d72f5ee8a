package caddymodule

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// errUnknownOption is what an option setter returns for a name it does
// not know.
var errUnknownOption = errors.New("unknown option")

// parseOptionBlock parses `<directive> { <option> <value> ... }` where the
// directive takes no argument and every option exactly one value; set
// applies one option. Every error names the directive and the option.
func parseOptionBlock(d *caddyfile.Dispenser, directive string, set func(opt, val string) error) error {
	d.Next() // the directive or policy name
	if d.NextArg() {
		return d.Errf("%s: takes no arguments, only a block; got %q", directive, d.Val())
	}
	for d.NextBlock(0) {
		opt := d.Val()
		if !d.NextArg() {
			return d.Errf("%s: %s needs a value", directive, opt)
		}
		val := d.Val()
		if d.NextArg() {
			return d.Errf("%s: %s takes one value", directive, opt)
		}
		if err := set(opt, val); errors.Is(err, errUnknownOption) {
			return d.Errf("%s: unknown option %q", directive, opt)
		} else if err != nil {
			return d.Errf("%s: bad %s %q: %v", directive, opt, val, err)
		}
	}
	return nil
}

// atLeast parses an integer option that must be >= min.
func atLeast(s string, min int) (int, error) {
	n, err := strconv.Atoi(s)
	if err == nil && n < min {
		err = fmt.Errorf("must be at least %d", min)
	}
	return n, err
}

// parseSecondsOrDuration accepts a Go/Caddy duration ("3s", "1d") or a
// plain number of seconds ("3", "0.05"); "-1" means disabled.
func parseSecondsOrDuration(s string) (caddy.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		// Bound before converting: NaN or 1e300 would overflow int64.
		if math.IsNaN(f) || math.Abs(f) > 1e9 {
			return 0, fmt.Errorf("%q seconds is out of range", s)
		}
		return caddy.Duration(f * float64(time.Second)), nil
	}
	d, err := caddy.ParseDuration(s)
	return caddy.Duration(d), err
}

// parseUnitFloat parses a number in [0, 1].
func parseUnitFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err == nil && !(f >= 0 && f <= 1) {
		err = fmt.Errorf("must be in [0, 1]")
	}
	return f, err
}
