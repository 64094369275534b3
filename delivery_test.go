package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// These tests run in a synctest bubble where they need time: backoffs, TTLs
// and delays pass on a fake clock, exactly and at once.

func TestRetryBackoffIsExponentialCappedAndDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var at []time.Duration
		var attempts []int
		m := tinymq.New()
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Since(start))
			attempts = append(attempts, msg.Attempt)
			return fmt.Errorf("smtp down (%d)", msg.Attempt)
		}, 1, tinymq.WithQueueName("email"), tinymq.WithBindingKey("user.#"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 250 * time.Millisecond}),
			tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "hello", tinymq.WithRoutingKey("user.created")))
		m.Stop() // waits for every retry and the dead letter
		require.Len(t, dead, 1)

		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 550 * time.Millisecond}, at,
			"backoff 100ms, then 200ms, then capped at 250ms")
		assert.Equal(t, []int{1, 2, 3, 4}, attempts)
		d := <-dead
		assert.Equal(t, "hello", d.Data)
		assert.Equal(t, "dlx", d.Exchange)
		assert.Equal(t, "user.created", d.RoutingKey, "an empty dead-letter key keeps the message's own")
		require.Len(t, d.Deaths, 1)
		death := d.Deaths[0]
		assert.Equal(t, tinymq.ReasonRejected, death.Reason)
		assert.Equal(t, "ev", death.Exchange)
		assert.Equal(t, "email", death.Queue)
		assert.Equal(t, "user.created", death.RoutingKey)
		assert.Equal(t, 4, death.Attempts)
		assert.Equal(t, "smtp down (4)", death.LastError)
		assert.Equal(t, start.Add(550*time.Millisecond), death.Time)

		st := m.Stats().Queues["email"]
		assert.Equal(t, uint64(4), st.Delivered)
		assert.Equal(t, uint64(4), st.Failed)
		assert.Equal(t, uint64(3), st.Retried)
		assert.Equal(t, uint64(1), st.DeadLettered)
		assert.Equal(t, 0, st.Depth)
	})
}

func TestRetryJitterStaysWithinItsFraction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		var mu sync.Mutex
		first := map[int]time.Time{}
		var waits []time.Duration
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			defer mu.Unlock()
			if msg.Attempt == 1 {
				first[msg.Data.(int)] = time.Now()
				return errors.New("fail once")
			}
			waits = append(waits, time.Since(first[msg.Data.(int)]))
			return nil
		}, 4, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, Jitter: 0.5})))
		require.NoError(t, m.Start(context.Background()))
		for i := range n {
			require.NoError(t, m.Publish("ev", i))
		}
		m.Stop()
		require.Len(t, waits, n)
		distinct := map[time.Duration]bool{}
		for _, w := range waits {
			assert.GreaterOrEqual(t, w, 500*time.Millisecond)
			assert.LessOrEqual(t, w, time.Second)
			distinct[w] = true
		}
		assert.Greater(t, len(distinct), n/2, "jitter spreads the retries")
	})
}

func TestRetryDoesNotHoldTheWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var order []string
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			order = append(order, fmt.Sprintf("%v#%d", msg.Data, msg.Attempt)) // one worker: no lock needed
			if msg.Data == "a" && msg.Attempt == 1 {
				return errors.New("fail")
			}
			return nil
		}, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.Publish("ev", "b"))
		synctest.Wait()
		assert.Equal(t, []string{"a#1", "b#1"}, order, "b is not held behind a's backoff")
		assert.Equal(t, 1, m.Stats().Queues["ev#1"].Scheduled)
		m.Stop() // waits the hour for a's retry
		assert.Equal(t, []string{"a#1", "b#1", "a#2"}, order)
	})
}

func TestPermanentErrorsAndPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls sync.Map
		m := tinymq.New()
		dead := deadLetters(t, m)
		bad := errors.New("malformed")
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			n, _ := calls.LoadOrStore(msg.Data, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			switch msg.Data {
			case "permanent":
				return tinymq.Permanent(bad)
			case "panic":
				panic("boom")
			}
			return nil
		}, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3}), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "permanent"))
		require.NoError(t, m.Publish("ev", "panic"))
		m.Stop()
		require.Len(t, dead, 2)
		count := func(k string) int32 { v, _ := calls.Load(k); return v.(*atomic.Int32).Load() }
		assert.Equal(t, int32(1), count("permanent"), "a permanent error skips the retries")
		assert.Equal(t, int32(3), count("panic"), "a panic is retried like an error")
		got := map[any]tinymq.Death{}
		for range 2 {
			d := <-dead
			got[d.Data] = d.Deaths[0]
		}
		assert.Equal(t, "malformed", got["permanent"].LastError)
		assert.Equal(t, 1, got["permanent"].Attempts)
		assert.Contains(t, got["panic"].LastError, "boom")
		assert.Equal(t, 3, got["panic"].Attempts)
	})
	assert.ErrorIs(t, tinymq.Permanent(errors.New("x")), tinymq.ErrPermanent)
	e := errors.New("cause")
	assert.ErrorIs(t, tinymq.Permanent(e), e)
	assert.Equal(t, "cause", tinymq.Permanent(e).Error())
	assert.NoError(t, tinymq.Permanent(nil))
}

func TestDeadMessagesWithoutDeadLetterExchangeAreLoggedAndCounted(t *testing.T) {
	log, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return errors.New("nope")
	}, 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	m.Stop()
	st := m.Stats().Queues["q"]
	assert.Equal(t, uint64(1), st.Dropped)
	assert.Zero(t, st.DeadLettered)
	recs := records(t)
	require.Len(t, recs, 1)
	assert.Equal(t, "tinymq: message dropped", recs[0]["msg"])
	assert.Equal(t, "rejected", recs[0]["reason"])
	assert.Equal(t, "nope", recs[0]["err"])
	assert.Equal(t, "no dead-letter exchange", recs[0]["drop_cause"])

	t.Run("a dead-letter exchange that cannot route drops and logs", func(t *testing.T) {
		log, records := logRecords()
		m := tinymq.New(tinymq.WithLogger(log))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return errors.New("nope")
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("missing", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		m.Stop()
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Dropped)
		recs := records(t)
		require.Len(t, recs, 1)
		assert.Contains(t, recs[0]["drop_cause"], "unknown exchange")
	})
}

func TestTTLExpiredMessagesNeverReachTheConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []any
		m := tinymq.New()
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			got = append(got, msg.Data)
			if msg.Data == "slow" {
				time.Sleep(2 * time.Second) // the others wait behind it
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("dlx", "expired")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "slow"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "queue-ttl"))                                                  // 1s: expires at 1s
		require.NoError(t, m.Publish("ev", "long-msg-ttl", tinymq.WithExpiration(time.Hour)))             // the queue's 1s is shorter
		time.Sleep(1500 * time.Millisecond)                                                               // t=1.5s
		require.NoError(t, m.Publish("ev", "short-msg-ttl", tinymq.WithExpiration(100*time.Millisecond))) // expires at 1.6s
		require.NoError(t, m.Publish("ev", "fresh"))                                                      // expires at 2.5s; delivered at 2s
		m.Stop()
		assert.Equal(t, []any{"slow", "fresh"}, got)
		require.Len(t, dead, 3)
		var expired []any
		for range 3 {
			d := <-dead
			assert.Equal(t, tinymq.ReasonExpired, d.Deaths[0].Reason)
			assert.Equal(t, 0, d.Deaths[0].Attempts)
			assert.Equal(t, "expired", d.RoutingKey)
			expired = append(expired, d.Data)
		}
		assert.Equal(t, []any{"queue-ttl", "long-msg-ttl", "short-msg-ttl"}, expired)
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(3), st.Expired)
		assert.Equal(t, uint64(3), st.DeadLettered)
		assert.Equal(t, uint64(2), st.Delivered)
	})
}

// RabbitMQ (rabbit_dead_letter:detect_cycles): a message dead-lettered for
// expiry into a queue it already died in, with no rejection since, is dropped
// for that queue; a self-cycle is broken at the first death.
func TestExpiryDeadLetterCycleIsBroken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log, records := logRecords()
		m := tinymq.New(tinymq.WithLogger(log))
		var got []any
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			got = append(got, msg.Data)
			time.Sleep(2 * time.Second) // longer than the TTL: what waits behind expires
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("ev", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "blocker-1"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "loop"))
		require.NoError(t, m.Publish("ev", "blocker-2"))
		// t=1s: loop and blocker-2 expire at the head of q while the consumer
		// is busy; dead-lettered back into q, they would cycle: dropped.
		m.Stop()
		assert.Equal(t, []any{"blocker-1"}, got)
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(0), st.DeadLettered)
		assert.Equal(t, uint64(2), st.Dropped, "each expired message would cycle into q: dropped")
		var cycles int
		for _, r := range records(t) {
			if cause, _ := r["drop_cause"].(string); strings.HasPrefix(cause, "dead-letter cycle") {
				cycles++
			}
		}
		assert.Equal(t, 2, cycles)
	})
}

func TestMaxLenDropHeadDeadLettersTheOldest(t *testing.T) {
	got := make(chan *tinymq.Msg, 10)
	m := tinymq.New()
	dead := deadLetters(t, m)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"),
		tinymq.WithMaxLen(3, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
	for i := 1; i <= 5; i++ {
		require.NoError(t, m.Publish("ev", i)) // not started: nothing is consumed
	}
	st := m.Stats().Queues["q"]
	assert.Equal(t, 3, st.Depth)
	assert.Equal(t, uint64(2), st.Overflowed)
	require.NoError(t, m.Start(context.Background()))
	m.Stop()
	require.Len(t, got, 3)
	var kept []any
	for range 3 {
		kept = append(kept, (<-got).Data)
	}
	assert.Equal(t, []any{3, 4, 5}, kept)
	require.Len(t, dead, 2)
	for _, want := range []int{1, 2} {
		d := <-dead
		assert.Equal(t, want, d.Data)
		assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
	}
}

func TestMaxLenRejectPublishIsAllOrNothing(t *testing.T) {
	small, big := make(chan *tinymq.Msg, 10), make(chan *tinymq.Msg, 10)
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(small), 1, tinymq.WithQueueName("small"),
		tinymq.WithMaxLen(2, tinymq.RejectPublish)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(big), 1, tinymq.WithQueueName("big")))
	require.NoError(t, m.Publish("ev", 1))
	require.NoError(t, m.Publish("ev", 2))
	err := m.Publish("ev", 3)
	require.ErrorIs(t, err, tinymq.ErrQueueFull)
	assert.Contains(t, err.Error(), `"small"`)
	s := m.Stats()
	assert.Equal(t, 2, s.Queues["big"].Depth, "the queue with room did not get the refused message either")
	assert.Equal(t, uint64(1), s.Queues["small"].Rejected)
	assert.Equal(t, uint64(2), s.Exchanges["ev"].Published)
	require.NoError(t, m.Start(context.Background()))
	m.Stop()
	assert.Len(t, big, 2)
	assert.Len(t, small, 2)
}

func TestMaxLenBlockWaitsForRoomUntilTheContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var got []any
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			got = append(got, msg.Data)
			<-release
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithMaxLen(1, tinymq.Block)))
		other := make(chan *tinymq.Msg, 10)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(other), 1, tinymq.WithQueueName("other")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1)) // taken by the consumer, which holds it
		synctest.Wait()
		require.NoError(t, m.Publish("ev", 2)) // fills the queue

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := m.PublishContext(ctx, "ev", 3)
		require.ErrorIs(t, err, tinymq.ErrQueueFull)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Len(t, other, 2, "a blocked publish reaches no queue")

		done := make(chan error)
		go func() { done <- m.PublishContext(context.Background(), "ev", 4) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("publish returned %v while the queue was full", err)
		default:
		}
		release <- struct{}{} // message 1 done; the worker takes 2, making room
		require.NoError(t, <-done)
		close(release)
		m.Stop()
		assert.Equal(t, []any{1, 2, 4}, got)
	})
}

func TestStopReleasesBlockedPublishers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release
			return nil
		}, 1, tinymq.WithMaxLen(1, tinymq.Block)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", 2))
		done := make(chan error)
		go func() { done <- m.Publish("ev", 3) }()
		synctest.Wait()
		stopped := make(chan struct{})
		go func() { m.Stop(); close(stopped) }()
		require.ErrorIs(t, <-done, tinymq.ErrStopped)
		close(release)
		<-stopped
	})
}

func TestDelayedDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Duration
		var data []any
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			at = append(at, time.Since(start))
			data = append(data, msg.Data)
			return nil
		}, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Publish("ev", "later", tinymq.WithDelay(5*time.Second))) // before Start
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "soon", tinymq.WithDelay(time.Second)))
		require.NoError(t, m.Publish("ev", "now"))
		synctest.Wait()
		assert.Equal(t, []any{"now"}, data)
		assert.Equal(t, 2, m.Stats().Queues["q"].Scheduled)
		m.Stop() // waits for the delayed messages
		assert.Equal(t, []any{"now", "soon", "later"}, data)
		assert.Equal(t, []time.Duration{0, time.Second, 5 * time.Second}, at)
	})
}

func TestShutdownCountsScheduledMessagesAsUndelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			t.Error("the delayed message must not be delivered after the deadline")
			return nil
		}, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1, tinymq.WithDelay(time.Hour)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := m.Shutdown(ctx)
		require.ErrorIs(t, err, tinymq.ErrUndelivered)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "1 never reached a consumer")
		m.Stop()
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Undelivered)
		time.Sleep(2 * time.Hour) // the scheduler is gone; nothing fires
	})
}

func TestDeliveryOptionValidation(t *testing.T) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, nop, 1))
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"negative attempts", func() error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: -1}))
		}, tinymq.ErrInvalidOption},
		{"multiplier below 1", func() error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{Multiplier: 0.5}))
		}, tinymq.ErrInvalidOption},
		{"jitter above 1", func() error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{Jitter: 1.5}))
		}, tinymq.ErrInvalidOption},
		{"max below initial", func() error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}))
		}, tinymq.ErrInvalidOption},
		{"max length 0", func() error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMaxLen(0, tinymq.DropHead))
		}, tinymq.ErrInvalidOption},
		{"unknown overflow", func() error { return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMaxLen(1, 0)) }, tinymq.ErrInvalidOption},
		{"zero queue TTL", func() error { return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMessageTTL(0)) }, tinymq.ErrInvalidOption},
		{"empty dead-letter exchange", func() error { return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithDeadLetter("", "k")) }, tinymq.ErrEmptyName},
		{"zero message TTL", func() error { return m.Publish("ev", 1, tinymq.WithExpiration(0)) }, tinymq.ErrInvalidOption},
		{"negative delay", func() error { return m.Publish("ev", 1, tinymq.WithDelay(-time.Second)) }, tinymq.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { require.ErrorIs(t, tt.call(), tt.want) })
	}
	m.Stop()
}

func TestStatsReconcile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
			time.Sleep(time.Duration(msg.Data.(int)) * time.Millisecond)
			if msg.Data.(int)%3 == 0 {
				return errors.New("divisible by 3")
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithBindingKey("k"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		for i := 1; i <= 30; i++ {
			require.NoError(t, m.Publish("ev", i, tinymq.WithRoutingKey("k")))
		}
		require.ErrorIs(t, m.Publish("ev", 0, tinymq.WithRoutingKey("other")), tinymq.ErrNoRoute)
		m.Stop()
		s := m.Stats()
		assert.Equal(t, tinymq.ExchangeStats{Kind: tinymq.Direct, Published: 30, Unroutable: 1}, s.Exchanges["ev"])
		q := s.Queues["q"]
		assert.Equal(t, uint64(30), q.Accepted)
		assert.Equal(t, uint64(20), q.Succeeded)
		assert.Equal(t, uint64(10), q.DeadLettered)
		assert.Equal(t, q.Accepted, q.Succeeded+q.DeadLettered+q.Dropped+q.Undelivered)
		assert.Equal(t, uint64(40), q.Delivered)
		assert.Equal(t, uint64(20), q.Failed)
		assert.Equal(t, uint64(10), q.Retried)
		assert.Zero(t, q.Depth)
		assert.Zero(t, q.InFlight)
		assert.Len(t, dead, 10)
		assert.Equal(t, uint64(10), s.Queues["dead"].Succeeded)
		ct := q.ConsumerTime
		assert.Positive(t, ct.Samples)
		assert.LessOrEqual(t, ct.Max, 30*time.Millisecond)
		assert.GreaterOrEqual(t, ct.Max, time.Millisecond)
		assert.LessOrEqual(t, ct.P50, ct.P99)
		assert.LessOrEqual(t, ct.P99, ct.Max)
	})
}

// TestStressEveryAcceptedMessageEndsOnce publishes from many goroutines into
// consumers that fail and panic at random, stops in the middle of it, and
// checks that every accepted message ended exactly once, delivered or
// dead-lettered, and that the counters agree.
func TestStressEveryAcceptedMessageEndsOnce(t *testing.T) {
	const publishers, perPublisher = 8, 1000
	type outcome struct {
		mu   sync.Mutex
		seen map[int]int
	}
	record := func(o *outcome, id int) {
		o.mu.Lock()
		o.seen[id]++
		o.mu.Unlock()
	}
	log, _ := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	queues := []string{"a", "b", "c"}
	succeeded := map[string]*outcome{}
	dead := map[string]*outcome{}
	for _, q := range queues {
		succeeded[q] = &outcome{seen: map[int]int{}}
		dead[q] = &outcome{seen: map[int]int{}}
	}
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		record(dead[msg.Deaths[0].Queue], msg.Data.(int))
		return nil
	}, 2, tinymq.WithQueueName("dead")))
	for i, name := range queues {
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			switch rand.IntN(4) {
			case 0:
				return errors.New("random failure")
			case 1:
				panic("random panic")
			}
			record(succeeded[msg.Queue], msg.Data.(int))
			return nil
		}, i+1, tinymq.WithQueueName(name), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Microsecond, MaxBackoff: time.Millisecond, Jitter: 1})))
	}
	require.NoError(t, m.Start(context.Background()))

	var next atomic.Int64
	var mu sync.Mutex
	accepted := map[int]bool{}
	var wg sync.WaitGroup
	flowing := make(chan struct{}, publishers)
	// Each publisher stops at a bound of its own, so that the work left for
	// Stop to drain does not depend on how long the scheduler lets one run.
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perPublisher {
				id := int(next.Add(1))
				if err := m.Publish("ev", id); err != nil {
					assert.ErrorIs(t, err, tinymq.ErrStopped)
					return
				}
				mu.Lock()
				accepted[id] = true
				mu.Unlock()
				if i == 200 {
					flowing <- struct{}{}
				}
			}
		}()
	}
	recv(t, flowing, publishers)
	m.Stop()
	wg.Wait()

	s := m.Stats()
	for _, q := range queues {
		st := s.Queues[q]
		assert.Equal(t, uint64(len(accepted)), st.Accepted, "queue %s accepted", q)
		assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered, "queue %s: every message succeeded or was dead-lettered", q)
		assert.Zero(t, st.Dropped+st.Undelivered+uint64(st.Depth+st.InFlight), "queue %s", q)
		assert.Equal(t, st.Failed, st.Retried+st.DeadLettered, "queue %s: each failure was retried or final", q)
		for id := range accepted {
			ok, d := succeeded[q].seen[id], dead[q].seen[id]
			if ok+d != 1 {
				t.Fatalf("queue %s, message %d: succeeded %d times, dead-lettered %d times", q, id, ok, d)
			}
		}
		assert.Len(t, succeeded[q].seen, int(st.Succeeded))
		assert.Len(t, dead[q].seen, int(st.DeadLettered))
	}
	assert.Equal(t, s.Queues["a"].DeadLettered+s.Queues["b"].DeadLettered+s.Queues["c"].DeadLettered, s.Queues["dead"].Succeeded)
}

func TestRetryDeliversACopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen []*tinymq.Msg
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			seen = append(seen, msg) // kept after returning, as a consumer may
			if msg.Attempt == 1 {
				return errors.New("once")
			}
			return nil
		}, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "x"))
		m.Stop()
		require.Len(t, seen, 2)
		assert.NotSame(t, seen[0], seen[1])
		assert.Equal(t, 1, seen[0].Attempt, "the kept Msg did not change")
		assert.Equal(t, 2, seen[1].Attempt)
		assert.Equal(t, seen[0].ID, seen[1].ID)
	})
}
