package flow

import (
	"strings"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	good := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"500", 500},
		{" 42 ", 42},
		{"1k", 1000},
		{"10Gi", 10 << 30},
		{"512Mi", 512 << 20},
		{"1Ki", 1024},
		{"1.5Gi", 3 << 29},
		{"2M", 2_000_000},
		{"1G", 1_000_000_000},
		{"1e3", 1000},
		{"2E", 2e18},
		{"7Ei", 7 << 60},
		{"9223372036854775807", 1<<63 - 1},
	}
	for _, c := range good {
		got, err := ParseQuantity(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseQuantity(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "empty"},
		{"-1", "negative"},
		{"-1Gi", "negative"},
		{"1.5", "whole"},
		{"1.0001k", "whole"},
		{"100m", "suffix"}, // milli makes no sense for counts
		{"10GB", "suffix"},
		{"Gi", "suffix"},
		{"1 Gi", "suffix"},
		{"0x10", "suffix"},
		{"NaN", "suffix"},
		{"Inf", "suffix"},
		{"8Ei", "too large"},
		{"1e30", "too large"},
	}
	for _, c := range bad {
		got, err := ParseQuantity(c.in)
		if err == nil {
			t.Errorf("ParseQuantity(%q) = %d, want an error", c.in, got)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("ParseQuantity(%q) error %q does not mention %q", c.in, err, c.msg)
		}
	}
}
