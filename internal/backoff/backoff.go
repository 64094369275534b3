// Package backoff computes exponential backoffs with jitter: the waits of
// TinyMQ's retry policies, on every engine, and of its broker engines'
// reconnects.
package backoff

import (
	"math"
	"math/rand/v2"
	"time"
)

// Policy describes waits that grow exponentially, up to a cap, with a random
// part. Its methods expect a valid Policy (0 <= Initial <= Max,
// Multiplier >= 1, 0 <= Jitter <= 1): validating and defaulting belong to
// the option that built it, such as tinymq.RetryPolicy. The zero Policy
// never waits.
type Policy struct {
	// Initial is the wait after the first failed attempt.
	Initial time.Duration
	// Max caps every wait.
	Max time.Duration
	// Multiplier is how much each wait grows over the one before.
	Multiplier float64
	// Jitter is the fraction of each wait that is random: a wait of d
	// becomes a value in [d*(1-Jitter), d].
	Jitter float64
}

// Wait returns the wait after the given failed attempt (1 for the first),
// jitter included: [Policy.Base] less a random fraction of it, at most
// Jitter. It is safe for concurrent use.
func (p Policy) Wait(attempt int) time.Duration {
	return p.duration(p.jitter(p.base(attempt)))
}

// Base returns the wait after the given failed attempt (1 for the first),
// before jitter: Initial * Multiplier^(attempt-1), at most Max. Every attempt
// after the first whose Base is Max has Max too.
func (p Policy) Base(attempt int) time.Duration {
	return p.duration(p.base(attempt))
}

// Jittered returns d less a random fraction of it, at most Jitter: a value
// in [d*(1-Jitter), d]. It is safe for concurrent use.
func (p Policy) Jittered(d time.Duration) time.Duration {
	return p.duration(p.jitter(float64(d)))
}

func (p Policy) base(attempt int) float64 {
	d := float64(p.Initial) * math.Pow(p.Multiplier, float64(attempt-1))
	if d >= float64(p.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(p.Max)
	}
	return d
}

func (p Policy) jitter(d float64) float64 {
	if p.Jitter > 0 {
		d -= d * p.Jitter * rand.Float64()
	}
	return d
}

// duration converts d, at most float64(Max), to a Duration.
// float64(MaxInt64) rounds up to 2^63, which does not convert back to a
// Duration: saturate rather than wrap around to a negative wait.
func (p Policy) duration(d float64) time.Duration {
	if d >= math.MaxInt64 {
		return p.Max
	}
	return time.Duration(d)
}
