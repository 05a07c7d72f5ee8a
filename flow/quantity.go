package flow

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Kubernetes quantity suffixes. "m" (milli) is left out on purpose: counts
// and bytes are whole numbers.
var (
	binarySuffixes  = map[string]float64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
	decimalSuffixes = map[string]float64{"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
	quantityNumber  = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)
)

// ParseQuantity reads a max_bytes or max_requests value: a plain integer
// or a Kubernetes quantity such as "10Gi", "512Mi", "1k", "1.5G" or "1e3".
// The value must be a whole, non-negative number that fits in an int64.
func ParseQuantity(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty quantity")
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("quantity %q is negative", s)
		}
		return n, nil
	}
	num, mult := t, 1.0
	if m, ok := binarySuffixes[suffix(t, 2)]; ok {
		num, mult = t[:len(t)-2], m
	} else if m, ok := decimalSuffixes[suffix(t, 1)]; ok {
		num, mult = t[:len(t)-1], m
	}
	if strings.HasPrefix(num, "-") {
		return 0, fmt.Errorf("quantity %q is negative", s)
	}
	if !quantityNumber.MatchString(num) {
		return 0, fmt.Errorf("quantity %q: want a whole number, optionally with a suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E (e.g. 10Gi, 1k)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("quantity %q: %v", s, err)
	}
	v := f * mult
	switch {
	case v >= math.MaxInt64:
		return 0, fmt.Errorf("quantity %q is too large", s)
	case v != math.Trunc(v):
		return 0, fmt.Errorf("quantity %q is not a whole number", s)
	}
	return int64(v), nil
}

func suffix(s string, n int) string {
	if len(s) <= n {
		return ""
	}
	return s[len(s)-n:]
}
