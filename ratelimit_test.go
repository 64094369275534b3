package tinymq_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

func TestRateLimitHoldsItsRateWithin5PercentOver10Seconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst = 100.0, 10
		var calls atomic.Int64
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			calls.Add(1)
			return nil
		}, 4, tinymq.WithQueueName("q"), tinymq.WithRateLimit(rate, burst)))
		require.NoError(t, m.Start(context.Background()))
		for i := range 2000 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		assert.Equal(t, int64(burst), calls.Load(), "the full bucket's burst at once")

		time.Sleep(10 * time.Second)
		synctest.Wait()
		want := burst + rate*10
		got := float64(calls.Load())
		assert.InDelta(t, want, got, want*0.05, "deliveries in 10s at %v/s with burst %d", rate, burst)
		assert.Equal(t, 2000-int(got), m.Stats().Queues["q"].Depth, "the rest wait in the queue")

		m.Stop() // delivers the rest, at the rate
		assert.Equal(t, int64(2000), calls.Load())
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

func TestRateLimitLetsTTLsExpireWhileMessagesWaitForAToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			calls.Add(1)
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithRateLimit(1, 1),
			tinymq.WithMessageTTL(500*time.Millisecond), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		start := time.Now()
		for i := range 3 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		assert.Equal(t, int64(1), calls.Load(), "one token: one delivery")

		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		require.Len(t, dead, 2, "the waiting messages expired at the head, without a token")
		for range 2 {
			d := (<-dead).Deaths[0]
			assert.Equal(t, tinymq.ReasonExpired, d.Reason)
			assert.Equal(t, start.Add(500*time.Millisecond), d.Time)
		}
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(2), st.Expired)
		assert.Zero(t, st.Depth)

		// The next token still comes at 1s (the message, published at
		// 700ms, lives until 1.2s).
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, m.Publish("ev", 3))
		time.Sleep(299 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int64(1), calls.Load(), "no token before 1s")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int64(2), calls.Load(), "the token due at 1s")
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

func TestRateLimitRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{{0, 1}, {-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {1, 0}, {1, -1},
		{math.Inf(-1), 1}, {-math.SmallestNonzeroFloat64, 1}, {math.Copysign(0, -1), 1}, {1, math.MinInt}, {math.NaN(), 0}} {
		m := tinymq.New()
		err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithRateLimit(tc.rate, tc.burst))
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "WithRateLimit(%v, %d)", tc.rate, tc.burst)
		err = m.DeclareQueue("q", "ev2", tinymq.Fanout, tinymq.WithRateLimit(tc.rate, tc.burst))
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "DeclareQueue WithRateLimit(%v, %d)", tc.rate, tc.burst)
		m.Stop()
	}
}

func TestRateLimitIsPartOfAQueuesSettings(t *testing.T) {
	m := tinymq.New()
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithRateLimit(5, 1)))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithRateLimit(5, 1)), "the same settings")
	assert.ErrorIs(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithRateLimit(6, 1)), tinymq.ErrDuplicateQueue)
	assert.ErrorIs(t, m.DeclareQueue("q", "ev", tinymq.Fanout), tinymq.ErrDuplicateQueue)
	m.Stop()
}

// rateQueue registers a queue "q" on fanout "ev" with the rate limit, whose
// consumer counts its calls, and starts the MQ.
func rateQueue(t *testing.T, rate float64, burst, conc int, opts ...tinymq.QueueOption) (*tinymq.MQ, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	m := tinymq.New(quiet())
	opts = append([]tinymq.QueueOption{tinymq.WithQueueName("q"), tinymq.WithRateLimit(rate, burst)}, opts...)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		calls.Add(1)
		return nil
	}, conc, opts...))
	require.NoError(t, m.Start(context.Background()))
	return m, &calls
}

// A pause does not bank tokens beyond the burst: after a long pause, resume
// delivers at most burst at once, then the rate holds.
func TestRateLimitPauseBanksNoMoreThanTheBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst = 10.0, 5
		m, calls := rateQueue(t, rate, burst, 4)
		for i := range 500 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		require.Equal(t, int64(burst), calls.Load())
		require.NoError(t, m.PauseQueue("q"))
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Equal(t, int64(burst), calls.Load(), "nothing while paused")
		require.NoError(t, m.ResumeQueue("q"))
		synctest.Wait()
		assert.Equal(t, int64(2*burst), calls.Load(), "a full bucket, no more, after the pause")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		want := 2*burst + rate*10
		assert.InDelta(t, want, float64(calls.Load()), want*0.05)
		_, err := m.PurgeQueue("q")
		require.NoError(t, err)
		stopWithin(t, m)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// A purge while workers wait for a token leaves them nothing to wait for:
// Stop then returns at once instead of pacing out the backlog, and later
// messages are delivered at the rate.
func TestRateLimitPurgeThenStopDoesNotWaitForTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, calls := rateQueue(t, 1, 1, 2)
		for i := range 100 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		require.Equal(t, int64(1), calls.Load())
		n, err := m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 99, n)
		require.NoError(t, m.Publish("ev", "late"))
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, int64(2), calls.Load(), "the next token, at 1s")
		start := time.Now()
		m.Stop()
		assert.Zero(t, time.Since(start), "Stop waited for no token")
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// Stop with a backlog delivers it at the rate; Shutdown's deadline bounds
// that wait and counts the rest as undelivered.
func TestRateLimitShutdownDeadlineHoldsWithABacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, calls := rateQueue(t, 10, 1, 3)
		for i := range 1000 {
			require.NoError(t, m.Publish("ev", i))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := m.Shutdown(ctx)
		assert.Equal(t, 2*time.Second, time.Since(start), "Shutdown returns at its deadline, not after 100s of tokens")
		assert.ErrorIs(t, err, tinymq.ErrUndelivered)
		assert.InDelta(t, 21, calls.Load(), 1, "the burst and 10 a second until the deadline")
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1000)-uint64(calls.Load()), st.Undelivered)
		assertLedger(t, "q", st)
	})
}

// Cancel while the workers wait for a token returns at once; a new
// subscription then continues at the same rate (the bucket is the queue's).
func TestRateLimitCancelWhileWaitingForATokenAndConsumeAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithRateLimit(2, 2)))
		require.NoError(t, m.Start(context.Background()))
		var calls atomic.Int64
		count := func(context.Context, *tinymq.Msg) error { calls.Add(1); return nil }
		sub, err := m.Consume("q", count, 3)
		require.NoError(t, err)
		for i := range 100 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		require.Equal(t, int64(2), calls.Load())
		start := time.Now()
		require.NoError(t, sub.Cancel(context.Background()))
		assert.Zero(t, time.Since(start), "Cancel does not wait for a token")
		time.Sleep(10 * time.Second) // the bucket refills to its burst only
		synctest.Wait()
		assert.Equal(t, int64(2), calls.Load(), "no consumer, no delivery")
		sub2, err := m.Consume("q", count, 1)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, int64(4), calls.Load(), "a full bucket")
		time.Sleep(5 * time.Second)
		synctest.Wait()
		assert.Equal(t, int64(14), calls.Load(), "2 a second again")
		require.NoError(t, sub2.Cancel(context.Background()))
		_, err = m.PurgeQueue("q")
		require.NoError(t, err)
		stopWithin(t, m)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// Retries take tokens too, and a rate-limited retry policy ends in dead
// letters with the ledger kept.
func TestRateLimitCountsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			calls.Add(1)
			return assert.AnError
		}, 2, tinymq.WithQueueName("q"), tinymq.WithRateLimit(1, 1), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int64(3), calls.Load(), "one delivery a second, retries included")
		m.Stop()
		assert.Equal(t, int64(6), calls.Load())
		assert.Len(t, dead, 2)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// A rate limit costs no goroutine: many idle rate-limited queues with a
// backlog run as many goroutines as the same queues without the limit.
func TestRateLimitCostsNoGoroutinePerQueue(t *testing.T) {
	count := func(rate bool) int {
		m := tinymq.New(quiet())
		for i := range 50 {
			opts := []tinymq.QueueOption{tinymq.WithQueueName("q" + string(rune('A'+i%26)) + string(rune('a'+i/26)))}
			if rate {
				opts = append(opts, tinymq.WithRateLimit(0.001, 1))
			} else {
				opts = append(opts, tinymq.WithMessageTTL(time.Hour))
			}
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
				if rate {
					return nil
				}
				<-ctx.Done() // without the limit, hold the workers as the limit holds them
				return nil
			}, 1, opts...))
		}
		require.NoError(t, m.Start(context.Background()))
		for range 3 {
			require.NoError(t, m.Publish("ev", 1))
		}
		require.Eventually(t, func() bool {
			s := m.Stats()
			for _, q := range s.Queues {
				if q.Delivered == 0 {
					return false
				}
			}
			return true
		}, wait, time.Millisecond)
		n := runtime.NumGoroutine()
		_ = m.Shutdown(canceledCtx()) // ends both kinds at once: what waits is undelivered
		m.Stop()
		return n
	}
	without := count(false)
	with := count(true)
	assert.LessOrEqual(t, with, without+1, "goroutines with 50 rate-limited queues vs without")
}

func canceledCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// A tiny rate (one delivery in many years) is valid and must not make the
// scheduler spin: the wait for the next token overflows a Duration.
func TestRateLimitTinyRateWaitsWithoutSpinning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, calls := rateQueue(t, 1e-12, 1, 1)
		require.NoError(t, m.Publish("ev", 1))
		require.NoError(t, m.Publish("ev", 2))
		synctest.Wait()
		time.Sleep(time.Hour) // with the bug: 3.6e12 wakes, never ends
		synctest.Wait()
		assert.Equal(t, int64(1), calls.Load())
		_, err := m.PurgeQueue("q")
		require.NoError(t, err)
		m.Stop()
	})
}

// Valid extremes of rate and burst are taken: a rate too small to refill in
// a second, or too large to count, and a burst of MaxInt. The full bucket's
// burst is delivered at once, then the rate; Shutdown's deadline bounds what
// the limit holds back.
func TestRateLimitTakesExtremeValues(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
	}{
		{math.SmallestNonzeroFloat64, 1}, {1e-300, 1}, {1e-9, 3}, {math.MaxFloat64, 1}, {1e300, 1}, {1e18, 1}, {1e9, 1},
		{1, math.MaxInt}, {math.MaxFloat64, math.MaxInt}, {math.SmallestNonzeroFloat64, math.MaxInt},
	} {
		t.Run(fmt.Sprintf("%g/%d", tc.rate, tc.burst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 20
				m, calls := rateQueue(t, tc.rate, tc.burst, 4)
				for i := range n {
					require.NoError(t, m.Publish("ev", i))
				}
				time.Sleep(time.Second)
				synctest.Wait()
				got := calls.Load()
				want := int64(math.Min(n, math.Floor(float64(tc.burst)+tc.rate)))
				assert.Equal(t, want, got, "after 1s: the burst and a second's rate, at most all")
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				err := m.Shutdown(ctx)
				if got == n {
					assert.NoError(t, err)
				} else {
					assert.ErrorIs(t, err, tinymq.ErrUndelivered, "%d held back", n-got)
				}
				m.Stop()
				assertLedger(t, "q", m.Stats().Queues["q"])
			})
		})
	}
}

// The bucket is the queue's, whatever its number of consumers and workers:
// two subscriptions of four workers each get the burst at once, then one
// delivery every 1/rate between them; another queue of the exchange is not
// limited.
func TestRateLimitIsOneBucketForAllTheQueuesConsumers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst, n = 10, 3, 23
		start := time.Now()
		var mu sync.Mutex
		var times []time.Duration
		count := func(context.Context, *tinymq.Msg) error {
			mu.Lock()
			times = append(times, time.Since(start))
			mu.Unlock()
			return nil
		}
		delivered := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(times)
		}
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithRateLimit(rate, burst)))
		for range 2 {
			_, err := m.Consume("q", count, 4)
			require.NoError(t, err)
		}
		var free atomic.Int64
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			free.Add(1)
			return nil
		}, 1, tinymq.WithQueueName("unlimited")))
		require.NoError(t, m.Start(context.Background()))
		for i := range n {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		assert.Equal(t, burst, delivered(), "the burst at once")
		assert.Equal(t, int64(n), free.Load(), "the other queue is not limited")
		for _, at := range []time.Duration{50, 100, 150, 999, 1000, 1500, 2000} {
			time.Sleep(at*time.Millisecond - time.Since(start))
			synctest.Wait()
			want := min(burst+int(at/100), n)
			assert.Equal(t, want, delivered(), "at %dms", at)
		}
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// Over a long run the limit never runs ahead: after t seconds at most
// burst + rate*t deliveries began (and no fewer than one less), whatever the
// rate's rounding.
func TestRateLimitNeverRunsAheadOverALongRun(t *testing.T) {
	for _, rate := range []float64{3, 7, 0.3, 333.3} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				secs := 3000 / rate
				m, calls := rateQueue(t, rate, 1, 2)
				for i := range int(secs*rate) + 10 {
					require.NoError(t, m.Publish("ev", i))
				}
				time.Sleep(time.Duration(secs * float64(time.Second)))
				synctest.Wait()
				most := int64(1 + math.Floor(rate*secs+1e-9))
				got := calls.Load()
				assert.LessOrEqual(t, got, most, "after %.1fs at %v/s", secs, rate)
				assert.GreaterOrEqual(t, got, most-1, "after %.1fs at %v/s", secs, rate)
				_ = m.Shutdown(canceledCtx())
				m.Stop()
				assertLedger(t, "q", m.Stats().Queues["q"])
			})
		})
	}
}

// The messages that wait for a token wait in the queue as any others do:
// Peek shows them, PurgeQueue and DeleteQueue remove and count them, and the
// next message after a purge gets the next token.
func TestRateLimitBacklogCanBePeekedPurgedAndDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, calls := rateQueue(t, 1, 1, 3)
		for i := range 5 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		peeked, err := m.Peek("q", 10)
		require.NoError(t, err)
		assert.Len(t, peeked, 4, "what waits for a token")
		n, err := m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 4, n)
		require.NoError(t, m.Publish("ev", 9))
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, int64(2), calls.Load(), "the next message got the token of 1s")
		for i := range 3 {
			require.NoError(t, m.Publish("ev", i))
		}
		synctest.Wait()
		n, err = m.DeleteQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 3, n, "the three that wait for the token of 2s")
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.Equal(t, int64(2), calls.Load())
		m.Stop()
		st := m.Stats()
		assert.Equal(t, uint64(4), st.Deleted.Purged)
		assert.Equal(t, uint64(3), st.Deleted.Removed)
	})
}

// A delivery that timed out is retried at the next token, not at once:
// a timeout does not give its token back.
func TestRateLimitTimedOutRetryWaitsForAToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		release := make(chan struct{})
		var mu sync.Mutex
		var times []time.Duration
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			times = append(times, time.Since(start))
			mu.Unlock()
			if msg.Attempt == 1 {
				<-release // ignores ctx
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithRateLimit(0.1, 1), tinymq.WithDeliveryTimeout(time.Second),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		time.Sleep(11 * time.Second)
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []time.Duration{0, 10 * time.Second}, times, "the retry waited for the token of 10s")
		mu.Unlock()
		close(release)
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.Succeeded)
		assertLedger(t, "q", st)
	})
}
