package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/tinymq/tinymq/internal/backoff"
)

func TestBaseGrowsUpToMax(t *testing.T) {
	p := backoff.Policy{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
	for attempt, want := range map[int]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond,
		5: time.Second, 100: time.Second, 1 << 20: time.Second,
	} {
		assert.Equal(t, want, p.Base(attempt), "attempt %d", attempt)
		assert.Equal(t, want, p.Wait(attempt), "attempt %d: no jitter, Wait is Base", attempt)
	}
	flat := backoff.Policy{Initial: time.Second, Max: time.Second, Multiplier: 1}
	assert.Equal(t, time.Second, flat.Base(50))
}

func TestBaseSaturates(t *testing.T) {
	for name, p := range map[string]backoff.Policy{
		"overflows to +Inf":      {Initial: time.Second, Max: math.MaxInt64, Multiplier: math.MaxFloat64},
		"Max is MaxInt64":        {Initial: math.MaxInt64, Max: math.MaxInt64, Multiplier: 2},
		"zero initial, huge mul": {Initial: 0, Max: time.Hour, Multiplier: math.Inf(1)},
	} {
		for _, attempt := range []int{1, 2, 3, 1000} {
			got := p.Wait(attempt)
			assert.GreaterOrEqual(t, got, time.Duration(0), "%s, attempt %d: a negative wait", name, attempt)
			assert.LessOrEqual(t, got, p.Max, "%s, attempt %d", name, attempt)
		}
	}
	p := backoff.Policy{Initial: math.MaxInt64, Max: math.MaxInt64, Multiplier: 2}
	assert.Equal(t, time.Duration(math.MaxInt64), p.Wait(3), "saturated, not wrapped")
}

func TestJitterStaysInItsRange(t *testing.T) {
	p := backoff.Policy{Initial: time.Second, Max: time.Minute, Multiplier: 2, Jitter: 0.5}
	seen := map[bool]bool{}
	for range 1000 {
		w := p.Wait(2)
		assert.GreaterOrEqual(t, w, time.Second, "below d*(1-Jitter)")
		assert.LessOrEqual(t, w, 2*time.Second, "above d")
		seen[w < 1500*time.Millisecond] = true
		j := p.Jittered(10 * time.Millisecond)
		assert.GreaterOrEqual(t, j, 5*time.Millisecond)
		assert.LessOrEqual(t, j, 10*time.Millisecond)
	}
	assert.Len(t, seen, 2, "the waits spread over the range")
	full := backoff.Policy{Initial: time.Second, Max: time.Second, Multiplier: 1, Jitter: 1}
	for range 100 {
		assert.LessOrEqual(t, full.Wait(1), time.Second)
		assert.GreaterOrEqual(t, full.Wait(1), time.Duration(0))
	}
	assert.Equal(t, time.Second, backoff.Policy{Max: time.Second}.Jittered(time.Second), "no jitter")
}

func TestZeroPolicyNeverWaits(t *testing.T) {
	var p backoff.Policy
	assert.Zero(t, p.Wait(1))
	assert.Zero(t, p.Wait(10))
}
