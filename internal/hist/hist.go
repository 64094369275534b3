// Package hist keeps the histograms of consumer times that every TinyMQ
// engine reports (tinymq.QueueStats.ConsumerTime), so that their quantiles
// mean the same thing on every engine.
package hist

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram counts durations in power-of-two buckets of nanoseconds: bucket
// i holds durations below 2^(i+MinShift), the last one everything longer.
// The zero value is empty and ready to use; its methods are safe for
// concurrent use and take no lock. A Histogram must not be copied after
// first use.
type Histogram struct {
	buckets [Buckets]atomic.Uint64
	count   atomic.Uint64
	sum     atomic.Uint64
	max     atomic.Int64
}

const (
	// MinShift sizes bucket 0: durations under 2^MinShift ns, 1.024µs.
	MinShift = 10
	// Buckets is the number of buckets; the last holds 36 minutes and more.
	Buckets = 32
)

// Summary is a snapshot of a Histogram. Its fields are those of
// tinymq.DurationStats, in order, so that one converts to the other.
type Summary struct {
	Samples       uint64
	Mean          time.Duration
	P50, P90, P99 time.Duration
	Max           time.Duration
}

// Observe counts d; a negative d counts as 0. It costs a few atomic adds.
func (h *Histogram) Observe(d time.Duration) {
	if d < 0 {
		d = 0
	}
	i := min(bits.Len64(uint64(d)>>MinShift), Buckets-1)
	h.buckets[i].Add(1)
	h.count.Add(1)
	h.sum.Add(uint64(d))
	for cur := h.max.Load(); int64(d) > cur && !h.max.CompareAndSwap(cur, int64(d)); cur = h.max.Load() {
	}
}

// Snapshot summarizes what was observed. The quantiles are upper bounds read
// from the buckets, within a factor of 2 of the true value, and never above
// Max. The buckets are read one at a time while others observe, so a
// snapshot of a busy histogram may be off by the few durations observed
// during the read.
func (h *Histogram) Snapshot() Summary {
	var counts [Buckets]uint64
	var total uint64
	for i := range counts {
		counts[i] = h.buckets[i].Load()
		total += counts[i]
	}
	s := Summary{Samples: total, Max: time.Duration(h.max.Load())}
	if total == 0 {
		return s
	}
	s.Mean = time.Duration(h.sum.Load() / max(h.count.Load(), 1))
	quantile := func(p float64) time.Duration {
		target := uint64(p*float64(total) + 0.5)
		var cum uint64
		for i, c := range counts {
			cum += c
			if cum >= max(target, 1) {
				return min(time.Duration(1)<<(i+MinShift), s.Max)
			}
		}
		return s.Max
	}
	s.P50, s.P90, s.P99 = quantile(0.50), quantile(0.90), quantile(0.99)
	return s
}
