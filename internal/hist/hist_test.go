package hist_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/tinymq/tinymq/internal/hist"
)

func TestEmptySnapshotIsZero(t *testing.T) {
	var h hist.Histogram
	assert.Equal(t, hist.Summary{}, h.Snapshot())
}

func TestQuantilesAreUpperBoundsWithinTwo(t *testing.T) {
	var h hist.Histogram
	for i := 1; i <= 100; i++ {
		h.Observe(time.Duration(i) * time.Microsecond)
	}
	s := h.Snapshot()
	assert.Equal(t, uint64(100), s.Samples)
	assert.Equal(t, 100*time.Microsecond, s.Max)
	assert.Equal(t, 50500*time.Nanosecond, s.Mean)
	for name, c := range map[string]struct{ got, true time.Duration }{
		"P50": {s.P50, 50 * time.Microsecond},
		"P90": {s.P90, 90 * time.Microsecond},
		"P99": {s.P99, 99 * time.Microsecond},
	} {
		assert.GreaterOrEqual(t, c.got, c.true, name)
		assert.LessOrEqual(t, c.got, min(2*c.true, s.Max), name)
	}
}

// The buckets are the ones every engine reports: a quantile is the top of
// its bucket, a power of two from 2^MinShift ns, capped by Max.
func TestBucketBounds(t *testing.T) {
	for name, c := range map[string]struct {
		d, want time.Duration
	}{
		"negative counts as 0":   {-time.Second, 0},
		"in bucket 0, below Max": {1000, 1000},
		"exactly 2^MinShift":     {1 << hist.MinShift, 1 << hist.MinShift},
		"bucket 1":               {1500, 1500},
		"bucket 10":              {time.Millisecond, time.Millisecond},
	} {
		var h hist.Histogram
		h.Observe(c.d)
		s := h.Snapshot()
		assert.Equal(t, c.want, s.Max, name)
		assert.Equal(t, c.want, s.P50, "%s: capped by Max", name)
	}
	for name, c := range map[string]struct {
		d, want time.Duration
	}{
		"bucket 0":  {1000, 1 << hist.MinShift},
		"bucket 1":  {1500, 2 << hist.MinShift},
		"bucket 10": {time.Millisecond, 1 << 20},
	} {
		var h hist.Histogram
		for range 99 {
			h.Observe(c.d)
		}
		h.Observe(time.Hour) // sets Max far above
		s := h.Snapshot()
		assert.Equal(t, c.want, s.P50, "%s: the top of the bucket", name)
		assert.Equal(t, c.want, s.P99, name)
	}
}

// The last bucket holds everything from 2^(MinShift+Buckets-2) ns (about 18
// minutes) up, and reports its top, 2^(MinShift+Buckets-1) ns (about 36
// minutes): above that a quantile is below the true value. This pins the
// behaviour both engines share.
func TestLastBucketReportsItsTop(t *testing.T) {
	var h hist.Histogram
	h.Observe(time.Hour)
	s := h.Snapshot()
	assert.Equal(t, time.Hour, s.Max)
	assert.Equal(t, time.Duration(1)<<(hist.MinShift+hist.Buckets-1), s.P99)
}

func TestObserveIsSafeForConcurrentUse(t *testing.T) {
	var h hist.Histogram
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				h.Observe(time.Duration(g*1000+i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	s := h.Snapshot()
	assert.Equal(t, uint64(8000), s.Samples)
	assert.Equal(t, 7999*time.Microsecond, s.Max)
}
