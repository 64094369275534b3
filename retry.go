package tinymq

import (
	"fmt"
	"math"
	"time"

	"github.com/tinymq/tinymq/internal/backoff"
)

// RetryPolicy says how often and when a queue delivers a message again after
// its consumer returned an error or panicked. Zero fields take the defaults
// given on each field.
//
// A retried message waits on a timer, not in a worker: the worker goes on with
// the messages behind it, and the retry joins the back of the queue when its
// backoff has passed, so retries reorder a queue's messages.
type RetryPolicy struct {
	// MaxAttempts is how many deliveries a message gets in all, the first
	// included. Default 3.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt. Default 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait. Default 30s, or InitialBackoff if longer.
	MaxBackoff time.Duration
	// Multiplier is how much each wait grows over the one before. Default 2;
	// at least 1.
	Multiplier float64
	// Jitter is the fraction of each wait that is random: a wait of d becomes a
	// value in [d*(1-Jitter), d]. It spreads retries that failed together so they
	// do not come back together. Default 0 (none); at most 1.
	Jitter float64
}

func (p RetryPolicy) normalize() (RetryPolicy, error) {
	if p.MaxAttempts < 0 || p.InitialBackoff < 0 || p.MaxBackoff < 0 ||
		(p.Multiplier != 0 && p.Multiplier < 1) || p.Jitter < 0 || p.Jitter > 1 ||
		math.IsNaN(p.Multiplier) || math.IsNaN(p.Jitter) {
		return p, fmt.Errorf("%w: retry policy %+v", ErrInvalidOption, p)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 3
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = 100 * time.Millisecond
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = max(30*time.Second, p.InitialBackoff)
	}
	if p.MaxBackoff < p.InitialBackoff {
		return p, fmt.Errorf("%w: MaxBackoff %v below InitialBackoff %v", ErrInvalidOption, p.MaxBackoff, p.InitialBackoff)
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	return p, nil
}

// backoff returns the wait after the given failed attempt (1 for the first),
// jitter included: InitialBackoff * Multiplier^(attempt-1), at most
// MaxBackoff, less a random fraction of it, at most Jitter (internal/backoff,
// which every engine uses). The policy must be normalized.
func (p RetryPolicy) backoff(attempt int) time.Duration {
	return backoff.Policy{Initial: p.InitialBackoff, Max: p.MaxBackoff, Multiplier: p.Multiplier, Jitter: p.Jitter}.Wait(attempt)
}

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }

func (e permanentError) Unwrap() error { return e.err }

func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks a consumer's error as one that retrying cannot fix, such as a
// malformed payload: the message skips its remaining attempts and is
// dead-lettered at once. errors.Is(Permanent(err), err) holds. Permanent(nil)
// is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}
