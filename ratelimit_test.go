package tinymq_test

import (
	"context"
	"math"
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
	}{{0, 1}, {-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {1, 0}, {1, -1}} {
		m := tinymq.New()
		err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithRateLimit(tc.rate, tc.burst))
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "WithRateLimit(%v, %d)", tc.rate, tc.burst)
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
