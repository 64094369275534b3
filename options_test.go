package tinymq_test

// Where these tests need time (backoffs, TTLs, delays), they run in a
// synctest bubble: it passes on a fake clock, exactly and at once.

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

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
