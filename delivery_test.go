package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
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

// A message that already has a death record is fanned out to two queues
// that both dead-letter it: each copy gets its own record in front of the
// shared one, and neither queue's kept Deaths change.
func TestDeathRecordsAreIsolatedPerQueue(t *testing.T) {
	for _, f := range consumerForms() {
		if !f.meta {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			final := make(chan *tinymq.Msg, 100)
			var mu sync.Mutex
			kept := map[string][][]tinymq.Death{}
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("src"), tinymq.WithDeadLetter("dlx1", "")))
			for _, q := range []string{"x", "y"} {
				require.NoError(t, f.register(m, "dlx1", tinymq.Fanout, func(_ context.Context, c formCall) error {
					mu.Lock()
					kept[q] = append(kept[q], c.Deaths)
					mu.Unlock()
					return errors.New("fail in " + q)
				}, 2, tinymq.WithQueueName(q), tinymq.WithDeadLetter("dlx2", "")))
			}
			require.NoError(t, m.RegisterQueue("dlx2", tinymq.Fanout, sink(final), 1, tinymq.WithQueueName("final")))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			const n = 20
			for i := range n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
			}
			seen := map[string]int{}
			for _, msg := range recv(t, final, 2*n) {
				p := msg.Data.(*numbered)
				if assert.Len(t, msg.Deaths, 2, "message %d", p.N) {
					q := msg.Deaths[0].Queue
					seen[fmt.Sprintf("%d/%s", p.N, q)]++
					assert.Contains(t, []string{"x", "y"}, q)
					assert.Equal(t, "fail in "+q, msg.Deaths[0].LastError)
					assert.Equal(t, "src", msg.Deaths[1].Queue)
					assert.Equal(t, 1, msg.Deaths[0].Count)
					assert.Equal(t, 1, msg.Deaths[1].Count)
				}
			}
			assert.Len(t, seen, 2*n, "each queue dead-letters its own copy once")
			stopWithin(t, m)
			for q, list := range kept {
				require.Len(t, list, n, q)
				for _, deaths := range list {
					if assert.Len(t, deaths, 1, "%s: its Deaths changed after another queue dead-lettered its copy", q) {
						assert.Equal(t, "src", deaths[0].Queue)
						assert.Equal(t, 1, deaths[0].Count)
					}
				}
			}
			for _, q := range []string{"src", "x", "y", "final"} {
				assertLedger(t, q, m.Stats().Queues[q])
			}
		})
	}
}

// A second death in the same queue increments the record's Count and moves
// it to the front; a copy delivered after the first death keeps Count 1.
func TestDeathCountDoesNotRewriteEarlierCopies(t *testing.T) {
	for _, f := range consumerForms() {
		if !f.meta {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			var calls callCounts
			type keptCopy struct {
				n      int
				deaths []tinymq.Death
				count  int
			}
			got := make(chan keptCopy, 100)
			aSaw := make(chan formCall, 100)
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, c formCall) error {
				aSaw <- c
				if calls.inc(c.N) <= 2 {
					return errors.New("die")
				}
				return nil
			}, 2, tinymq.WithQueueName("a"), tinymq.WithDeadLetter("dlx", "")))
			require.NoError(t, m.Bind("a", "dlx", tinymq.Fanout))
			require.NoError(t, f.register(m, "dlx", tinymq.Fanout, func(_ context.Context, c formCall) error {
				kc := keptCopy{n: c.N, deaths: c.Deaths}
				if len(c.Deaths) > 0 {
					kc.count = c.Deaths[0].Count
				}
				got <- kc
				return nil
			}, 2, tinymq.WithQueueName("k")))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			const n = 10
			for i := range n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
			}
			copies := recv(t, got, 2*n)
			seenByA := map[int][]int{}
			for _, c := range recv(t, aSaw, 3*n) {
				cnt := 0
				if len(c.Deaths) > 0 {
					cnt = c.Deaths[0].Count
				}
				seenByA[c.N] = append(seenByA[c.N], cnt)
			}
			stopWithin(t, m)
			for i := range n {
				got := seenByA[i]
				sort.Ints(got)
				assert.Equal(t, []int{0, 1, 2}, got, "message %d: death Count as queue a saw it, per delivery", i)
			}
			byN := map[int][]keptCopy{}
			for _, c := range copies {
				byN[c.n] = append(byN[c.n], c)
			}
			for i := range n {
				list := byN[i]
				require.Len(t, list, 2, "message %d", i)
				sort.Slice(list, func(a, b int) bool { return list[a].count < list[b].count })
				for j, c := range list {
					if assert.Len(t, c.deaths, 1, "one record per queue and reason") {
						assert.Equal(t, j+1, c.count, "message %d: Count when delivered", i)
						assert.Equal(t, j+1, c.deaths[0].Count, "message %d: a kept copy's death record was rewritten later", i)
						assert.Equal(t, "a", c.deaths[0].Queue)
						assert.Equal(t, "ev", c.deaths[0].Exchange, "the first death's exchange is kept")
					}
				}
			}
			s := m.Stats().Queues["a"]
			assert.Equal(t, uint64(3*n), s.Accepted)
			assert.Equal(t, uint64(2*n), s.DeadLettered)
			assertLedger(t, "a", s)
		})
	}
}

// One keyed publish to three queues with different retry policies: each
// queue counts its own attempts, and only the queue that gave up
// dead-letters its copy, with its own death record.
func TestRetriesOfOnePublishAreIsolatedPerQueue(t *testing.T) {
	for _, f := range consumerForms() {
		if !f.meta {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			dead := hDeadQueue(t, m, 100)
			var mu sync.Mutex
			attempts := map[string][]int{}
			hdr := map[string]any{"h": "v", "n": int64(3)}
			for i, policy := range []int{3, 2, 1} {
				q := fmt.Sprintf("q%d", i)
				require.NoError(t, f.register(m, "ev", tinymq.Topic, func(_ context.Context, c formCall) error {
					mu.Lock()
					attempts[fmt.Sprintf("%s/%d", q, c.N)] = append(attempts[fmt.Sprintf("%s/%d", q, c.N)], c.Attempt)
					mu.Unlock()
					if c.Queue != q || c.RoutingKey != "a.b" || c.Headers["h"] != "v" || len(c.Deaths) != 0 {
						return tinymq.Permanent(fmt.Errorf("%s saw %+v", q, c))
					}
					switch q {
					case "q0":
						return errors.New("q0 fails")
					case "q1":
						if c.Attempt == 1 {
							return errors.New("q1 fails once")
						}
					}
					return nil
				}, 2, tinymq.WithQueueName(q), tinymq.WithBindingKey("a.*"), tinymq.WithDeadLetter("dlx", ""),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: policy, InitialBackoff: time.Millisecond})))
			}
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			const n = 20
			for i := range n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}, tinymq.WithRoutingKey("a.b"), tinymq.WithHeaders(hdr)))
			}
			for _, d := range recv(t, dead, n) {
				if assert.Len(t, d.Deaths, 1) {
					assert.Equal(t, "q0", d.Deaths[0].Queue)
					assert.Equal(t, 3, d.Deaths[0].Attempts)
					assert.Equal(t, "q0 fails", d.Deaths[0].LastError)
					assert.Equal(t, "a.b", d.Deaths[0].RoutingKey)
				}
				assert.Equal(t, "a.b", d.RoutingKey)
				assert.Equal(t, "v", d.Headers["h"])
			}
			stopWithin(t, m)
			for i := range n {
				assert.Equal(t, []int{1, 2, 3}, attempts[fmt.Sprintf("q0/%d", i)])
				assert.Equal(t, []int{1, 2}, attempts[fmt.Sprintf("q1/%d", i)])
				assert.Equal(t, []int{1}, attempts[fmt.Sprintf("q2/%d", i)])
			}
			st := m.Stats()
			assert.Equal(t, hCounts{Delivered: 3 * n, Failed: 3 * n, Retried: 2 * n, DeadLettered: n}, hCountsOf(st.Queues["q0"]))
			assert.Equal(t, hCounts{Delivered: 2 * n, Succeeded: n, Failed: n, Retried: n}, hCountsOf(st.Queues["q1"]))
			assert.Equal(t, hCounts{Delivered: n, Succeeded: n}, hCountsOf(st.Queues["q2"]))
			assert.Equal(t, map[string]any{"h": "v", "n": int64(3)}, hdr, "published headers untouched")
		})
	}
}

// multiErr wraps several errors (Unwrap() []error).
type multiErr []error

func (e multiErr) Error() string { return "multi" }

func (e multiErr) Unwrap() []error { return e }

// saysPermanentErr matches ErrPermanent through its own Is.
type saysPermanentErr struct{}

func (saysPermanentErr) Error() string { return "says permanent" }

func (saysPermanentErr) Is(target error) bool { return target == tinymq.ErrPermanent }

// ErrPermanent anywhere in the chain (wrapped, joined, in a multi-error, in a
// panic value, behind a *PanicError) skips the retries; anything else is
// retried up to MaxAttempts.
func TestPermanentAnywhereInTheChainSkipsRetries(t *testing.T) {
	base := errors.New("base")
	perm := tinymq.Permanent(base)
	type tc struct {
		fail      func() error // returns the error, or panics
		permanent bool
	}
	cases := map[string]tc{
		"Permanent":                  {func() error { return perm }, true},
		"wrapped":                    {func() error { return fmt.Errorf("a: %w", fmt.Errorf("b: %w", perm)) }, true},
		"joined":                     {func() error { return errors.Join(errors.New("x"), perm) }, true},
		"two %w":                     {func() error { return fmt.Errorf("%w, %w", errors.New("x"), perm) }, true},
		"multi, deep":                {func() error { return multiErr{errors.New("x"), multiErr{errors.New("y"), fmt.Errorf("z: %w", perm)}} }, true},
		"own Is":                     {func() error { return fmt.Errorf("w: %w", saysPermanentErr{}) }, true},
		"returned PanicError":        {func() error { return &tinymq.PanicError{Value: perm} }, true},
		"PanicError joined":          {func() error { return errors.Join(errors.New("x"), &tinymq.PanicError{Value: perm}) }, true},
		"panic(Permanent)":           {func() error { panic(perm) }, true},
		"panic(wrapped Permanent)":   {func() error { panic(fmt.Errorf("w: %w", perm)) }, true},
		"plain error":                {func() error { return base }, false},
		"panic(string)":              {func() error { panic("boom") }, false},
		"Permanent text, not chain":  {func() error { return errors.New(perm.Error()) }, false},
		"PanicError of plain error":  {func() error { return &tinymq.PanicError{Value: base} }, false},
		"joined without a permanent": {func() error { return errors.Join(errors.New("x"), base) }, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m := tinymq.New(quiet())
			dead := deadLetters(t, m)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				return c.fail()
			}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			require.NoError(t, m.Publish("ev", 1))
			d := recv(t, dead, 1)[0]
			st := waitSettled(t, m, "q", 1)
			want := 3
			if c.permanent {
				want = 1
			}
			assert.Equal(t, want, d.Deaths[0].Attempts)
			assert.Equal(t, uint64(want), st.Delivered)
			assert.Equal(t, uint64(want-1), st.Retried)
			assert.Equal(t, uint64(1), st.DeadLettered)
		})
	}
}

// WithMaxLen counts the same messages as Depth: with a limit of 3, three
// published before Start and one of them in the consumer, one more is
// accepted and the next refused (a worker's batch once hid two of them).
func TestMaxLenCountsEveryWaitingMessage(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithMaxLen(3, tinymq.RejectPublish)))
	for i := range 3 {
		require.NoError(t, m.Publish("ev", i))
	}
	require.NoError(t, m.Start(context.Background()))
	recv(t, entered, 1)
	require.NoError(t, m.Publish("ev", 3))
	assert.ErrorIs(t, m.Publish("ev", 4), tinymq.ErrQueueFull)
	assert.Equal(t, 3, m.Stats().Queues["q"].Depth)
	close(release)
	m.Stop()
}

// A retry into a full queue does not push it past its limit: with
// RejectPublish the retry is refused and the message dead-lettered with
// reason maxlen; Depth never exceeds the limit.
func TestRetryIntoAFullQueueKeepsTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		dead := deadLetters(t, m)
		first := true
		release := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			if first {
				first = false
				<-release
				return errors.New("fail once")
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithMaxLen(2, tinymq.RejectPublish), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "fails"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.Publish("ev", "b")) // the queue is full
		close(release)
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.LessOrEqual(t, st.Depth, 2)
		m.Stop()
		d := <-dead
		assert.Equal(t, "fails", d.Data)
		assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
		assert.Equal(t, "fail once", d.Deaths[0].LastError)
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Overflowed)
	})
}

// RabbitMQ: a message that expires at the head of its queue is dead-lettered
// when its TTL passes, even while every consumer is busy, so dead letters come
// out in expiry order.
func TestExpiryAtTheHeadIsOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		m := tinymq.New()
		type death struct {
			data any
			at   time.Duration
		}
		var mu sync.Mutex
		var deaths []death
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			deaths = append(deaths, death{msg.Data, time.Since(start)})
			mu.Unlock()
			return nil
		}, 1, tinymq.WithQueueName("dead")))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			time.Sleep(time.Hour) // every consumer is busy
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "busy"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "one second", tinymq.WithExpiration(time.Second)))
		require.NoError(t, m.Publish("ev", "two seconds", tinymq.WithExpiration(2*time.Second)))
		time.Sleep(3 * time.Second)
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []death{{"one second", time.Second}, {"two seconds", 2 * time.Second}}, deaths)
		mu.Unlock()
		m.Stop()
	})
}

// RabbitMQ: only the head expires on time; a short TTL behind a long one
// waits until it reaches the head.
func TestShortTTLBehindALongOneWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		m := tinymq.New()
		at := make(chan time.Duration, 2)
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			at <- time.Since(start)
			return nil
		}, 1))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			time.Sleep(time.Hour)
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "busy"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "long", tinymq.WithExpiration(5*time.Second)))
		require.NoError(t, m.Publish("ev", "short", tinymq.WithExpiration(time.Second)))
		time.Sleep(6 * time.Second)
		synctest.Wait()
		assert.Equal(t, 5*time.Second, <-at)
		assert.Equal(t, 5*time.Second, <-at, "the short one expired behind the long one and goes when it reaches the head")
		m.Stop()
	})
}

// RabbitMQ (rabbit_dead_letter): an expiry cycle through two queues is broken
// per target queue: A expires into B, B expires into A, and A's copy is
// dropped, while a third queue bound to the same dead-letter exchange still
// gets its copy.
func TestTwoQueueExpiryCycleDropsOnlyTheCyclingCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		busy := func(context.Context, *tinymq.Msg) error { time.Sleep(time.Hour); return nil }
		require.NoError(t, m.RegisterQueue("to-a", tinymq.Fanout, busy, 1, tinymq.WithQueueName("A"),
			tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("to-b", "")))
		require.NoError(t, m.RegisterQueue("to-b", tinymq.Fanout, busy, 1, tinymq.WithQueueName("B"),
			tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("to-a", "")))
		witness := make(chan *tinymq.Msg, 10)
		require.NoError(t, m.RegisterQueue("to-a", tinymq.Fanout, sink(witness), 1, tinymq.WithQueueName("C")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("to-a", "busy A"))
		require.NoError(t, m.Publish("to-b", "busy B"))
		<-witness
		synctest.Wait()
		// B expires it (1s) into A and C; A expires it (1s) towards B, where
		// it died before with no rejection since: B's copy is dropped.
		require.NoError(t, m.Publish("to-b", "loop"))
		time.Sleep(5 * time.Second)
		synctest.Wait()
		st := m.Stats()
		assert.Equal(t, uint64(1), st.Queues["B"].DeadLettered, "B's expiry went to A and C")
		assert.Equal(t, uint64(0), st.Queues["A"].DeadLettered)
		assert.Equal(t, uint64(1), st.Queues["A"].Dropped, "A's expiry would cycle into B: dropped")
		require.Len(t, witness, 1, "C got its copy of B's dead letter")
		assert.Equal(t, "loop", (<-witness).Data)
		m.Stop()
	})
}

// RabbitMQ: a cycle that contains a rejection is not broken.
func TestCycleThroughARejectionIsNotBroken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		var calls atomic.Int32
		got := make(chan *tinymq.Msg, 1)
		require.NoError(t, m.RegisterQueue("work", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			if calls.Add(1) == 1 {
				return errors.New("rejected once")
			}
			got <- msg
			return nil
		}, 1, tinymq.WithQueueName("work"), tinymq.WithDeadLetter("wait", "")))
		// the wait queue has no consumer that gets to it: its messages expire back to work
		require.NoError(t, m.RegisterQueue("wait", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			time.Sleep(time.Hour)
			return nil
		}, 1, tinymq.WithQueueName("wait"), tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("work", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("wait", "busy"))
		synctest.Wait()
		require.NoError(t, m.Publish("work", "job"))
		time.Sleep(3 * time.Second)
		synctest.Wait()
		require.Len(t, got, 1, "work -> rejected -> wait -> expired -> work: delivered again")
		msg := <-got
		require.Len(t, msg.Deaths, 2)
		assert.Equal(t, tinymq.ReasonExpired, msg.Deaths[0].Reason)
		assert.Equal(t, "wait", msg.Deaths[0].Queue)
		assert.Equal(t, tinymq.ReasonRejected, msg.Deaths[1].Reason)
		assert.Equal(t, "work", msg.Deaths[1].Queue)
		m.Stop()
	})
}

// RabbitMQ's x-death keeps one entry per queue and reason with a count, and
// the entry keeps the exchange and routing key of its first death; the
// records do not grow with each lap of a rejection cycle.
func TestDeathRecordsCountLaps(t *testing.T) {
	m := tinymq.New()
	got := make(chan *tinymq.Msg, 1)
	var laps atomic.Int32
	require.NoError(t, m.RegisterQueue("work", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
		if laps.Add(1) <= 5 {
			return errors.New("again")
		}
		got <- msg
		return nil
	}, 1, tinymq.WithQueueName("work"), tinymq.WithBindingKey("#"), tinymq.WithDeadLetter("work", "retry.key")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("work", "job", tinymq.WithRoutingKey("first.key")))
	msg := recv(t, got, 1)[0]
	m.Stop()
	require.Len(t, msg.Deaths, 1, "one record per queue and reason")
	d := msg.Deaths[0]
	assert.Equal(t, 5, d.Count)
	assert.Equal(t, "first.key", d.RoutingKey, "the routing key of the first death")
	assert.Equal(t, uint64(1), d.MessageID, "the message's ID when it first died")
	assert.Equal(t, "again", d.LastError)
	assert.Equal(t, "retry.key", msg.RoutingKey)
}

// A message that failed and then expired while backing off keeps its last
// error in its death record.
func TestExpiredWhileBackingOffKeepsItsLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return errors.New("database down")
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""), tinymq.WithMessageTTL(time.Second),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 2 * time.Second})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		time.Sleep(5 * time.Second)
		synctest.Wait()
		require.Len(t, dead, 1)
		d := (<-dead).Deaths[0]
		assert.Equal(t, tinymq.ReasonExpired, d.Reason)
		assert.Equal(t, "database down", d.LastError)
		m.Stop()
	})
}

// RabbitMQ drops only the copy that a full reject-publish queue refuses: a
// dead letter has no publisher to hand an error to. The others get theirs.
func TestDeadLetterRefusedByOneFullQueueReachesTheOthers(t *testing.T) {
	m := tinymq.New()
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		entered <- struct{}{}
		<-release
		return nil
	}, 1, tinymq.WithQueueName("full"), tinymq.WithMaxLen(1, tinymq.RejectPublish)))
	ok := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(ok), 1, tinymq.WithQueueName("ok")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("dlx", "in consumer"))
	recv(t, entered, 1)
	require.NoError(t, m.Publish("dlx", "fills the queue"))
	recv(t, ok, 2)
	require.NoError(t, m.Publish("ev", "dies"))
	d := recv(t, ok, 1)[0]
	assert.Equal(t, "dies", d.Data)
	// The dead letter can arrive before its source counts it.
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].DeadLettered == 1 }, wait, time.Millisecond)
	st := m.Stats()
	assert.Equal(t, uint64(1), st.Queues["full"].Rejected)
	assert.ErrorIs(t, m.Publish("dlx", "a publish is still all or nothing"), tinymq.ErrQueueFull)
	close(release)
	m.Stop()
}
