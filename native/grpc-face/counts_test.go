package main

import (
	"sync/atomic"
	"testing"
)

func TestDeltaSendsEachRefusalOnce(t *testing.T) {
	c := newCounts([]float64{1e308}, map[string]string{evaluate: "unary"})
	atomic.AddInt64(&c.refused, 3)
	if got := c.delta(); got.Refused != 3 || got.empty() {
		t.Fatalf("first line: %+v, want 3 refused", got)
	}
	if got := c.delta(); !got.empty() {
		t.Fatalf("second line: %+v, want nothing new", got)
	}
	atomic.AddInt64(&c.refused, 1)
	if got := c.delta(); got.Refused != 1 {
		t.Fatalf("third line: %+v, want 1 refused", got)
	}
}
