package flow

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestLabelsAreValidShortAndBounded(t *testing.T) {
	if got := SanitizeLabel("tenant-\xff\xfe"); !utf8.ValidString(got) || !strings.HasPrefix(got, "tenant-") {
		t.Fatalf("invalid UTF-8 kept: %q", got)
	}
	long := strings.Repeat("é", MaxLabelBytes) // 2 bytes a rune
	if got := SanitizeLabel(long); len(got) > MaxLabelBytes || !utf8.ValidString(got) {
		t.Fatalf("long label: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	var set labelSet
	for i := 0; i < MaxLabelValues; i++ {
		if v := set.value(fmt.Sprint("t", i)); v == OverflowLabel {
			t.Fatalf("value %d overflowed before the bound", i)
		}
	}
	if v := set.value("one-more"); v != OverflowLabel {
		t.Fatalf("past the bound: %q, want %q", v, OverflowLabel)
	}
	if v := set.value("t7"); v != "t7" {
		t.Fatalf("a value seen before the bound must stay itself, got %q", v)
	}
	if ValidFlowID("a\xff") || ValidFlowID(strings.Repeat("a", MaxLabelBytes+1)) || !ValidFlowID("tenant-42") {
		t.Fatal("ValidFlowID")
	}
}
