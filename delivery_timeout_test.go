package tinymq_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// stuckConsumer is a consumer that, for the payload "stuck", ignores its
// context and returns only once release is closed; any other payload
// succeeds at once. It records the deadline of each stuck call's context.
type stuckConsumer struct {
	release   chan struct{}
	mu        sync.Mutex
	deadlines []time.Time
	running   atomic.Int32 // calls inside the consumer now
	done      atomic.Int32 // calls that returned nil for other payloads
	pair      *barrier     // the payload "pair" waits for another "pair" call
}

func newStuck() *stuckConsumer {
	return &stuckConsumer{release: make(chan struct{}), pair: newBarrier(2)}
}

func (c *stuckConsumer) consume(ctx context.Context, m *tinymq.Msg) error {
	c.running.Add(1)
	defer c.running.Add(-1)
	if m.Data == "pair" {
		if err := c.pair.arrive(ctx); err != nil {
			return err
		}
		c.done.Add(1)
		return nil
	}
	if m.Data == "stuck" {
		d, _ := ctx.Deadline()
		c.mu.Lock()
		c.deadlines = append(c.deadlines, d)
		c.mu.Unlock()
		<-c.release
		return nil
	}
	c.done.Add(1)
	return nil
}

func TestDeliveryTimeoutFailsTheCallAtItsDeadlineAndKeepsThePoolsSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		c := newStuck()
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, c.consume, 2, tinymq.WithQueueName("q"),
			tinymq.WithDeliveryTimeout(d), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		start := time.Now()

		require.NoError(t, m.Publish("ev", "stuck"))
		synctest.Wait()
		time.Sleep(d - time.Nanosecond)
		synctest.Wait()
		assert.Zero(t, m.Stats().Queues["q"].TimedOut, "no timeout before d")
		time.Sleep(time.Nanosecond)
		synctest.Wait()

		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.TimedOut, "the timeout fired at d")
		assert.Equal(t, uint64(1), st.Failed)
		assert.Equal(t, 1, st.Abandoned, "the stuck call is abandoned")
		assert.Equal(t, 0, st.InFlight, "an abandoned call's message is settled, not in flight")
		require.Len(t, dead, 1)
		death := (<-dead).Deaths[0]
		assert.Equal(t, tinymq.ReasonRejected, death.Reason)
		assert.Contains(t, death.LastError, "delivery timed out")
		assert.Equal(t, start.Add(d), death.Time)
		c.mu.Lock()
		assert.Equal(t, []time.Time{start.Add(d)}, c.deadlines, "the context's deadline is d after the call began")
		c.mu.Unlock()

		// The pool keeps its size: two calls run at once beside the stuck
		// one, each waiting for the other.
		require.NoError(t, m.Publish("ev", "pair"))
		require.NoError(t, m.Publish("ev", "pair"))
		synctest.Wait()
		assert.Equal(t, int32(2), c.done.Load(), "both halves of the pair met")
		for range 18 {
			require.NoError(t, m.Publish("ev", "quick"))
		}
		synctest.Wait()
		assert.Equal(t, int32(20), c.done.Load())
		assert.Equal(t, int32(1), c.running.Load(), "only the stuck call still runs")
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].TimedOut, "the pair met well before its deadline")

		// The bound: two more stuck calls (concurrency 2) time out; one more
		// abandoned call fits, the other's slot waits for it.
		require.NoError(t, m.Publish("ev", "stuck"))
		require.NoError(t, m.Publish("ev", "stuck"))
		synctest.Wait()
		time.Sleep(d)
		synctest.Wait()
		st = m.Stats().Queues["q"]
		assert.Equal(t, uint64(3), st.TimedOut)
		assert.Equal(t, 2, st.Abandoned, "abandoned calls are bounded by the concurrency")
		assert.Equal(t, int32(3), c.running.Load(), "every stuck call still runs")
		require.Len(t, dead, 2)

		// One slot is free still: a quick message is delivered.
		require.NoError(t, m.Publish("ev", "quick"))
		synctest.Wait()
		assert.Equal(t, int32(21), c.done.Load())

		close(c.release) // the late calls return; their results are ignored
		synctest.Wait()
		st = m.Stats().Queues["q"]
		assert.Equal(t, 0, st.Abandoned)
		assert.Equal(t, uint64(21), st.Succeeded, "a late nil is not a success")
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

func TestDeliveryTimeoutIsRetriedThenDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = 500 * time.Millisecond
		var attempts []int
		var mu sync.Mutex
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		// A consumer that watches its context: it returns ctx.Err() at the
		// deadline, racing the timeout's handler; either way the delivery
		// fails with ErrDeliveryTimeout.
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			attempts = append(attempts, msg.Attempt)
			mu.Unlock()
			<-ctx.Done()
			return ctx.Err()
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 100 * time.Millisecond}),
			tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		start := time.Now()
		require.NoError(t, m.Publish("ev", "slow"))
		m.Stop()

		assert.Equal(t, []int{1, 2, 3}, attempts)
		require.Len(t, dead, 1)
		death := (<-dead).Deaths[0]
		assert.Equal(t, 3, death.Attempts)
		assert.Contains(t, death.LastError, "delivery timed out")
		assert.Equal(t, start.Add(3*d+100*time.Millisecond+200*time.Millisecond), death.Time,
			"three timeouts of d and two backoffs")
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(3), st.TimedOut)
		assert.Equal(t, uint64(3), st.Failed)
		assert.Equal(t, uint64(2), st.Retried)
		assert.Equal(t, uint64(1), st.DeadLettered)
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

func TestDeliveryTimeoutIgnoresTheLateCallsResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logger, records := logRecords()
		m := tinymq.New(tinymq.WithLogger(logger))
		release := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release
			return errors.New("late")
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "x"))
		time.Sleep(time.Second)
		synctest.Wait()
		close(release)
		m.Stop()
		found := false
		for _, r := range records(t) {
			if e, _ := r["err"].(string); e != "" {
				assert.Contains(t, e, tinymq.ErrDeliveryTimeout.Error())
				assert.NotContains(t, e, "late", "the late call's result is ignored")
				found = true
			}
		}
		assert.True(t, found, "the dropped message was logged with its error")
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Dropped)
	})
}

func TestStopWaitsForAbandonedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newStuck()
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, c.consume, 1, tinymq.WithQueueName("q"),
			tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "stuck"))
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, 1, m.Stats().Queues["q"].Abandoned)

		stopped := make(chan struct{})
		go func() {
			m.Stop()
			close(stopped)
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("Stop returned while an abandoned call still ran")
		default:
		}
		close(c.release)
		<-stopped
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

func TestShutdownDeadlineHoldsWithAbandonedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newStuck()
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, c.consume, 1, tinymq.WithQueueName("q"),
			tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "stuck"))
		time.Sleep(time.Second)
		synctest.Wait()

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := m.Shutdown(ctx)
		assert.Equal(t, 2*time.Second, time.Since(start), "Shutdown returns at its deadline")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, tinymq.ErrUndelivered, "no message was lost: the timed-out one was settled")
		assert.Contains(t, err.Error(), "1 consumer calls abandoned")

		close(c.release)
		m.Stop() // waits for the abandoned call
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

func TestCancelWaitsForTheSubscriptionsAbandonedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newStuck()
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		sub, err := m.Consume("q", c.consume, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", "stuck"))
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, 1, m.Stats().Queues["q"].Abandoned)

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.ErrorIs(t, sub.Cancel(ctx), context.DeadlineExceeded, "Cancel waits for the abandoned call")
		close(c.release)
		require.NoError(t, sub.Cancel(context.Background()))
		assert.Zero(t, m.Stats().Queues["q"].Abandoned)
		m.Stop()
	})
}

func TestDeliveryTimeoutRefusesBadValues(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		m := tinymq.New()
		err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithDeliveryTimeout(d))
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "WithDeliveryTimeout(%v)", d)
		m.Stop()
	}
}

func TestDeliveryTimeoutAndRateLimitAreUnsupportedOnAnEngine(t *testing.T) {
	for name, opt := range map[string]tinymq.QueueOption{
		"WithDeliveryTimeout": tinymq.WithDeliveryTimeout(time.Second),
		"WithRateLimit":       tinymq.WithRateLimit(10, 1),
	} {
		e := &hEngine{specs: map[string]tinymq.QueueSpec{}}
		m := tinymq.New(tinymq.WithEngine(e))
		err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1, opt)
		assert.ErrorIs(t, err, tinymq.ErrUnsupported, name)
		assert.Empty(t, e.specs, "%s: nothing declared on the engine", name)
		m.Stop()
	}
}
