package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
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
	for _, d := range []time.Duration{0, -time.Nanosecond, -time.Second, math.MinInt64} {
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

// panickyNilErr is an error type whose typed nil a late consumer returns.
type panickyNilErr struct{}

func (*panickyNilErr) Error() string { panic("a typed nil's Error was called") }

// A consumer that outlives its deadline and then panics, calls Goexit,
// returns a typed nil, an error or nil: each call fails once at d, what it
// does afterwards is ignored, the pool keeps its size and the ledger holds.
func TestDeliveryTimeoutIgnoresWhateverALateCallDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		release := make(chan struct{})
		var quick atomic.Int64
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			if msg.Data == "quick" {
				quick.Add(1)
				return nil
			}
			<-release // ignores ctx
			switch msg.Data {
			case "panic":
				panic("late panic")
			case "goexit":
				runtime.Goexit()
			case "typednil":
				var e *panickyNilErr
				return e
			case "error":
				return errors.New("late error")
			}
			return nil
		}, 5, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		kinds := []string{"panic", "goexit", "typednil", "error", "nil"}
		for _, k := range kinds {
			require.NoError(t, m.Publish("ev", k))
		}
		synctest.Wait()
		time.Sleep(d)
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(len(kinds)), st.TimedOut, "every call timed out at d")
		assert.Equal(t, len(kinds), st.Abandoned, "abandoned calls are bounded by the concurrency, here all of them")
		require.Len(t, dead, len(kinds))

		// The pool keeps its size while all five calls are stuck.
		for range 50 {
			require.NoError(t, m.Publish("ev", "quick"))
		}
		synctest.Wait()
		assert.Equal(t, int64(50), quick.Load())

		close(release)
		synctest.Wait()
		st = m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned, "every late call returned")
		assert.Equal(t, uint64(50), st.Succeeded, "no late result counts")
		for range 20 {
			require.NoError(t, m.Publish("ev", "quick"))
		}
		stopWithin(t, m)
		assert.Equal(t, int64(70), quick.Load(), "the pool still works after the late calls ended")
		assertLedger(t, "q", m.Stats().Queues["q"])
		assertLedger(t, "dead", m.Stats().Queues["dead"])
	})
}

// A call that is past the bound of abandoned calls keeps its slot (the
// worker waits for it); when it then calls Goexit the slot is not lost and
// its message is not settled twice.
func TestDeliveryTimeoutGoexitAfterTheDeadlineAtTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		release := make(chan struct{})
		var quick atomic.Int64
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			if msg.Data == "quick" {
				quick.Add(1)
				return nil
			}
			<-release
			runtime.Goexit()
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "stuck"))
		synctest.Wait()
		time.Sleep(d) // the first is abandoned, a new goroutine takes the slot
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "stuck"))
		synctest.Wait()
		time.Sleep(d) // the second times out at the bound: its slot waits
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(2), st.TimedOut)
		assert.Equal(t, 1, st.Abandoned, "one abandoned call per worker")
		require.NoError(t, m.Publish("ev", "quick"))
		synctest.Wait()
		assert.Zero(t, quick.Load(), "the only slot waits for its late call")

		close(release) // both Goexit
		synctest.Wait()
		assert.Equal(t, int64(1), quick.Load(), "the slot survives a Goexit after the deadline")
		stopWithin(t, m)
		st = m.Stats().Queues["q"]
		assert.Equal(t, uint64(2), st.TimedOut, "a Goexit after the deadline is no second failure")
		assert.Equal(t, uint64(2), st.Failed)
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

// A late call that calls back into the MQ (Stop, DeleteQueue of its queue,
// Cancel of its subscription, Publish) neither deadlocks nor breaks a count.
func TestDeliveryTimeoutLateCallMayCallBackIntoTheMQ(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(m *tinymq.MQ, sub *tinymq.Subscription) error
	}{
		{"Stop", func(m *tinymq.MQ, _ *tinymq.Subscription) error { m.Stop(); return nil }},
		{"Shutdown", func(m *tinymq.MQ, _ *tinymq.Subscription) error {
			err := m.Shutdown(context.Background())
			if errors.Is(err, tinymq.ErrCalledFromConsumer) {
				return nil
			}
			return err
		}},
		{"DeleteQueue", func(m *tinymq.MQ, _ *tinymq.Subscription) error { _, err := m.DeleteQueue("q"); return err }},
		{"Cancel", func(_ *tinymq.MQ, sub *tinymq.Subscription) error { return sub.Cancel(context.Background()) }},
		{"Publish", func(m *tinymq.MQ, _ *tinymq.Subscription) error { return m.Publish("ev", "quick") }},
		{"PurgeQueue", func(m *tinymq.MQ, _ *tinymq.Subscription) error { _, err := m.PurgeQueue("q"); return err }},
		{"PauseQueue", func(m *tinymq.MQ, _ *tinymq.Subscription) error { return m.PauseQueue("q") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const d = time.Second
				m := tinymq.New(quiet())
				require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDeliveryTimeout(d)))
				require.NoError(t, m.Start(context.Background()))
				var sub atomic.Pointer[tinymq.Subscription]
				callErr := make(chan error, 1)
				s, err := m.Consume("q", func(ctx context.Context, msg *tinymq.Msg) error {
					if msg.Data != "stuck" {
						return nil
					}
					<-ctx.Done()
					time.Sleep(time.Millisecond) // well after the deadline
					callErr <- tc.call(m, sub.Load())
					return nil
				}, 1)
				require.NoError(t, err)
				sub.Store(s)
				require.NoError(t, m.Publish("ev", "stuck"))
				for range 3 {
					require.NoError(t, m.Publish("ev", "after"))
				}
				synctest.Wait()
				time.Sleep(d + time.Millisecond)
				synctest.Wait()
				select {
				case err := <-callErr:
					assert.NoError(t, err, "the late call's %s", tc.name)
				default:
					t.Fatalf("the late call's %s never returned", tc.name)
				}
				stopWithin(t, m)
				st := m.Stats()
				if qs, ok := st.Queues["q"]; ok {
					assert.Equal(t, uint64(1), qs.TimedOut)
					assert.Zero(t, qs.Abandoned)
					assertLedger(t, "q", qs)
				}
				require.NoError(t, s.Cancel(context.Background()))
			})
		})
	}
}

// A late call that Cancels its subscription while other messages wait: the
// slot's new goroutine ends too, the messages stay in the queue for the next
// subscription, and nothing is delivered twice.
func TestDeliveryTimeoutCancelWhileAbandonedHandsTheBacklogOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDeliveryTimeout(d)))
		require.NoError(t, m.Start(context.Background()))
		release := make(chan struct{})
		var first atomic.Int64
		sub, err := m.Consume("q", func(ctx context.Context, msg *tinymq.Msg) error {
			if msg.Data == "stuck" {
				<-release
				return nil
			}
			first.Add(1)
			return nil
		}, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", "stuck"))
		synctest.Wait()
		time.Sleep(d)
		synctest.Wait()
		require.Equal(t, 1, m.Stats().Queues["q"].Abandoned)

		cancelled := make(chan error, 1)
		go func() { cancelled <- sub.Cancel(context.Background()) }()
		synctest.Wait()
		for range 10 {
			require.NoError(t, m.Publish("ev", "n"))
		}
		var second atomic.Int64
		sub2, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { second.Add(1); return nil }, 2)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, int64(10), first.Load()+second.Load(), "every message delivered once")
		select {
		case <-cancelled:
			t.Fatal("Cancel returned while its abandoned call still ran")
		default:
		}
		close(release)
		require.NoError(t, <-cancelled)
		require.NoError(t, sub2.Cancel(context.Background()))
		stopWithin(t, m)
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

// DeleteQueue while a call is abandoned: the delete returns, the late call
// ends later, and Stop waits for it with nothing left uncounted.
func TestDeliveryTimeoutDeleteQueueWhileAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		release := make(chan struct{})
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			if msg.Data == "stuck" {
				<-release
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "stuck"))
		synctest.Wait()
		time.Sleep(d)
		synctest.Wait()
		for range 5 {
			require.NoError(t, m.Publish("ev", "after"))
		}
		deleted := make(chan struct{})
		go func() {
			_, err := m.DeleteQueue("q")
			assert.NoError(t, err)
			close(deleted)
		}()
		synctest.Wait()
		closedWithin(t, deleted, "DeleteQueue with an abandoned call")
		stopped := make(chan struct{})
		go func() { m.Stop(); close(stopped) }()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("Stop returned while an abandoned call of a deleted queue still ran")
		default:
		}
		close(release)
		<-stopped
		_, still := m.Stats().Queues["q"]
		assert.False(t, still)
	})
}

// Shutdown's deadline holds while a call that ignores its context has not
// yet reached its own delivery deadline, and while one is abandoned; a later
// Stop waits for both, and the ledger holds.
func TestDeliveryTimeoutShutdownDeadlineBeforeAndAfterTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			<-release
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Minute)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a"))
		synctest.Wait()
		time.Sleep(time.Minute) // a is abandoned
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "b")) // b runs, its deadline a minute away
		require.NoError(t, m.Publish("ev", "c")) // c waits
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := m.Shutdown(ctx)
		assert.Equal(t, time.Second, time.Since(start), "Shutdown returns at its deadline")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorIs(t, err, tinymq.ErrUndelivered, "c never reached a consumer, b was in one")
		time.Sleep(2 * time.Minute) // b's delivery deadline passes after the abort
		synctest.Wait()
		close(release)
		stopWithin(t, m)
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

// A consumer that returns nil once its deadline has passed has not returned
// by then: its call failed with ErrDeliveryTimeout, however soon after the
// deadline the nil comes, and it is no success.
func TestDeliveryTimeoutLateNilIsNoSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, d = 200, time.Second
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			<-ctx.Done()
			return nil // after the deadline
		}, n, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d)))
		require.NoError(t, m.Start(context.Background()))
		for i := range n {
			require.NoError(t, m.Publish("ev", i))
		}
		stopWithin(t, m)
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(n), st.TimedOut, "every call timed out")
		assert.Zero(t, st.Succeeded, "a nil after the deadline is no success")
		assertLedger(t, "q", st)
	})
}

// A consumer that watches its context and returns ctx.Err() at its deadline
// races the deadline's handler. Whichever wins, the call has failed once
// with an error wrapping ErrDeliveryTimeout (which wraps the consumer's
// ctx.Err() as well only when its return was seen first), and the context's
// deadline is d after the call began.
func TestDeliveryTimeoutFailsAConsumerThatReturnsCtxErr(t *testing.T) {
	const n = 20
	register := func(t *testing.T, m *tinymq.MQ, d time.Duration, wrongDeadline *atomic.Int64) {
		t.Helper()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			if dl, ok := ctx.Deadline(); wrongDeadline != nil && (!ok || !dl.Equal(time.Now().Add(d))) {
				wrongDeadline.Add(1)
			}
			<-ctx.Done()
			return ctx.Err()
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d), tinymq.WithDeadLetter("dlx", "")))
	}
	check := func(t *testing.T, m *tinymq.MQ, dead []*tinymq.Msg) {
		t.Helper()
		wrapsCtx := 0
		for _, msg := range dead {
			require.Len(t, msg.Deaths, 1)
			e := msg.Deaths[0].LastError
			assert.True(t, strings.HasPrefix(e, tinymq.ErrDeliveryTimeout.Error()), "the error %q does not wrap ErrDeliveryTimeout", e)
			if strings.Contains(e, context.DeadlineExceeded.Error()) {
				wrapsCtx++
			}
		}
		t.Logf("%d of %d errors wrap the consumer's ctx.Err() too", wrapsCtx, n)
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(n), st.TimedOut)
		assert.Equal(t, uint64(n), st.Failed, "each call failed once")
		assert.Zero(t, st.Succeeded)
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	}
	t.Run("fake time", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const d = time.Second
			var wrongDeadline atomic.Int64
			m := tinymq.New(quiet())
			dead := deadLetters(t, m)
			register(t, m, d, &wrongDeadline)
			require.NoError(t, m.Start(context.Background()))
			for i := range n {
				require.NoError(t, m.Publish("ev", i))
			}
			m.Stop()
			assert.Zero(t, wrongDeadline.Load(), "calls whose context's deadline was not d after they began")
			check(t, m, recv(t, dead, n))
		})
	})
	t.Run("real time", func(t *testing.T) {
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		register(t, m, 5*time.Millisecond, nil)
		require.NoError(t, m.Start(context.Background()))
		for i := range n {
			require.NoError(t, m.Publish("ev", i))
		}
		got := recv(t, dead, n)
		stopWithin(t, m)
		check(t, m, got)
	})
}

// The late nil of TestDeliveryTimeoutLateNilIsNoSuccess, on a real clock:
// the consumer's nil and the deadline's handler race on the machine, and
// the nil is no success whichever wins.
func TestDeliveryTimeoutLateNilIsNoSuccessInRealTime(t *testing.T) {
	const n = 20
	m := tinymq.New(quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		<-ctx.Done()
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(5*time.Millisecond)))
	require.NoError(t, m.Start(context.Background()))
	for i := range n {
		require.NoError(t, m.Publish("ev", i))
	}
	require.Eventually(t, func() bool {
		st := m.Stats().Queues["q"]
		return st.Succeeded+st.Dropped == n
	}, wait, time.Millisecond)
	stopWithin(t, m)
	st := m.Stats().Queues["q"]
	assert.Zero(t, st.Succeeded, "a nil after the deadline is no success")
	assert.Equal(t, uint64(n), st.TimedOut)
	assertLedger(t, "q", st)
}

// Past the bound of abandoned calls, a call that times out keeps its
// worker: the next message waits for that call to return, not for the
// abandoned one.
func TestDeliveryTimeoutPastTheBoundTheWorkerWaitsForItsOwnCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		release := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
		var mu sync.Mutex
		var begun []int
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			i := msg.Data.(int)
			mu.Lock()
			begun = append(begun, i)
			mu.Unlock()
			<-release[i] // ignores ctx
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(d)))
		require.NoError(t, m.Start(context.Background()))
		for i := range 3 {
			require.NoError(t, m.Publish("ev", i))
		}
		time.Sleep(10 * d)
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []int{0, 1}, begun, "0 abandoned, 1 timed out at the bound and holds the worker")
		mu.Unlock()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(2), st.TimedOut)
		assert.Equal(t, 1, st.Abandoned)
		assert.LessOrEqual(t, st.InFlight, 1)

		close(release[1]) // the worker's own late call returns; 0 still runs
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []int{0, 1, 2}, begun, "the worker took the next message once its own call returned")
		mu.Unlock()
		close(release[0])
		close(release[2])
		m.Stop()
		st = m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned)
		assertLedger(t, "q", st)
	})
}

// What a late call does after its deadline (panic, Goexit, an error) is
// not logged, nor counted again; the worker goes on.
func TestDeliveryTimeoutLogsNothingOfALateCall(t *testing.T) {
	for _, mode := range []string{"panic", "goexit", "error"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logger, records := logRecords()
				m := tinymq.New(tinymq.WithLogger(logger))
				release := make(chan struct{})
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
					if msg.Data != "late" {
						return nil
					}
					<-release // ignores ctx
					switch mode {
					case "panic":
						panic("LATE-PANIC")
					case "goexit":
						runtime.Goexit()
					}
					return errors.New("LATE-ERROR")
				}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second)))
				require.NoError(t, m.Start(context.Background()))
				require.NoError(t, m.Publish("ev", "late"))
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				close(release)
				synctest.Wait()
				for range 5 {
					require.NoError(t, m.Publish("ev", "ok"))
				}
				synctest.Wait()
				st := m.Stats().Queues["q"]
				assert.Equal(t, uint64(1), st.Failed)
				assert.Equal(t, uint64(1), st.TimedOut)
				assert.Equal(t, uint64(5), st.Succeeded)
				assert.Equal(t, uint64(6), st.Delivered)
				assert.Zero(t, st.Abandoned)
				m.Stop()
				assertLedger(t, "q", m.Stats().Queues["q"])
				for _, r := range records(t) {
					assert.NotContains(t, fmt.Sprint(r), "LATE-", "the late call's outcome was logged")
				}
			})
		})
	}
}

// A message whose first call timed out is retried while that call still
// runs; the retry's success is the message's, and the late call's nil adds
// nothing.
func TestDeliveryTimeoutRetrySucceedsWhileTheAbandonedCallRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		var attempts []int
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			attempts = append(attempts, msg.Attempt)
			mu.Unlock()
			if msg.Attempt == 1 {
				<-release // ignores ctx
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 100 * time.Millisecond})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "x"))
		time.Sleep(1050 * time.Millisecond)
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.TimedOut)
		assert.Equal(t, uint64(1), st.Retried)
		assert.Equal(t, 1, st.Scheduled, "the retry backs off")
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []int{1, 2}, attempts)
		mu.Unlock()
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Succeeded, "the retry succeeded beside the abandoned call")
		close(release)
		m.Stop()
		st = m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.Succeeded, "the late nil adds nothing")
		assertLedger(t, "q", st)
	})
}

// Shutdown waits for an abandoned call like a worker: one that returns
// before Shutdown's deadline leaves nothing lost, and Shutdown returns nil.
func TestShutdownReturnsNilOnceTheAbandonedCallsReturn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			time.Sleep(3 * time.Second) // ignores ctx, but ends
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "x"))
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, 1, m.Stats().Queues["q"].Abandoned)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		require.NoError(t, m.Shutdown(ctx))
		assert.Equal(t, 1500*time.Millisecond, time.Since(start), "Shutdown waited for the abandoned call to return")
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Abandoned)
		assert.Equal(t, uint64(1), st.TimedOut)
		assertLedger(t, "q", st)
	})
}

// A typed consumer (RegisterDeliveryHandler) times out as a ConsumerFunc
// does: its call is abandoned and the next message goes on.
func TestDeliveryTimeoutAppliesToTypedConsumers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		m := tinymq.New(quiet())
		require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[int]) error {
			if d.Data == 1 {
				<-release
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		require.NoError(t, m.Publish("ev", 2))
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.TimedOut)
		assert.Equal(t, uint64(1), st.Succeeded)
		assert.Equal(t, 1, st.Abandoned)
		close(release)
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// A timeout of the largest Duration saturates: the deadline does not
// overflow into the past, and the call runs as long as it needs.
func TestDeliveryTimeoutOfMaxDurationNeverExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hasDeadline, expired atomic.Bool
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			_, ok := ctx.Deadline()
			hasDeadline.Store(ok)
			if ctx.Err() != nil {
				expired.Store(true)
			}
			time.Sleep(time.Hour)
			if ctx.Err() != nil {
				expired.Store(true)
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(math.MaxInt64)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		m.Stop()
		t.Logf("the call's context has a deadline: %v", hasDeadline.Load())
		assert.False(t, expired.Load(), "a timeout of MaxInt64 expired (overflow)")
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.Succeeded)
		assert.Zero(t, st.TimedOut)
	})
}

// An abandoned call owns its *Msg: it may go on writing every field while
// the MQ retries the message (no data race under -race), and the retry gets
// the message as it was, not as the abandoned call left it.
func TestDeliveryTimeoutAbandonedCallOwnsItsMsg(t *testing.T) {
	type seen struct {
		Attempt    int
		RoutingKey string
		Data       any
		Header     any
		Deaths     int
	}
	retried := make(chan struct{})
	second := make(chan seen, 1)
	wrote := make(chan int, 1)
	var calls atomic.Int64
	m := tinymq.New(quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
		if calls.Add(1) > 1 {
			second <- seen{msg.Attempt, msg.RoutingKey, msg.Data, msg.Headers["h"], len(msg.Deaths)}
			close(retried)
			return nil
		}
		// The first call ignores its deadline and writes its Msg until the
		// retry has run.
		giveUp := time.After(wait)
		for n := 1; ; n++ {
			select {
			case <-retried:
				wrote <- n
				return nil
			case <-giveUp:
				wrote <- n
				return nil
			default:
			}
			msg.RoutingKey = fmt.Sprint("changed-", n)
			msg.Attempt = 100 + n
			msg.Data = n
			msg.Headers = map[string]any{"h": n}
			msg.Deaths = []tinymq.Death{{Reason: "scribbled"}}
			runtime.Gosched()
		}
	}, 1, tinymq.WithQueueName("q"), tinymq.WithBindingKey("rk"), tinymq.WithDeliveryTimeout(10*time.Millisecond),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "x", tinymq.WithRoutingKey("rk"), tinymq.WithHeaders(map[string]any{"h": "v"})))
	assert.Equal(t, seen{Attempt: 2, RoutingKey: "rk", Data: "x", Header: "v"}, recv(t, second, 1)[0],
		"the retry got the message, not the abandoned call's writes")
	assert.Greater(t, recv(t, wrote, 1)[0], 1, "the abandoned call wrote its Msg while the message was retried")
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Abandoned == 0 }, wait, time.Millisecond)
	stopWithin(t, m)
	st := m.Stats().Queues["q"]
	assert.Equal(t, uint64(1), st.TimedOut)
	assert.Equal(t, uint64(1), st.Retried)
	assert.Equal(t, uint64(1), st.Succeeded, "the retry's outcome is the message's")
	assertLedger(t, "q", st)
}

// A call whose queue is deleted while it runs, and which then times out, is
// a failure after the delete: counted as removed, neither retried nor
// dead-lettered; its late nil counts for nothing, and Stop waits for it.
func TestDeliveryTimeoutAfterItsQueueWasDeletedIsNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release // ignores ctx
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3}), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "x"))
		synctest.Wait()
		_, err := m.DeleteQueue("q")
		require.NoError(t, err)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		d := m.Stats().Deleted
		assert.Equal(t, uint64(1), d.Removed)
		assert.Zero(t, d.Succeeded)
		assert.Zero(t, d.Retried)
		assert.Empty(t, dead, "not dead-lettered")

		stopped := make(chan struct{})
		go func() { m.Stop(); close(stopped) }()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("Stop returned while the deleted queue's abandoned call still ran")
		default:
		}
		close(release)
		<-stopped
		d = m.Stats().Deleted
		assert.Zero(t, d.Succeeded, "the late nil counts for nothing")
		assert.Equal(t, uint64(1), d.Removed)
	})
}

// A durable queue's timed-out message is settled at its deadline: a
// Shutdown whose deadline passes while the abandoned call still runs loses
// nothing, and after a restart the message is not delivered again. (Real
// time: a durable MQ may not run in a synctest bubble, whose channels the
// log's request pool would carry out of it.)
func TestDeliveryTimeoutOfADurableQueueSettlesAtTheDeadline(t *testing.T) {
	dir := t.TempDir()
	release := make(chan struct{})
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		<-release // ignores ctx
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithDeliveryTimeout(20*time.Millisecond)))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "x"))
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].TimedOut == 1 }, wait, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := m.Shutdown(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the abandoned call still runs")
	assert.NotErrorIs(t, err, tinymq.ErrUndelivered, "the message was settled at its deadline")
	close(release)
	stopWithin(t, m)
	assertLedger(t, "q", m.Stats().Queues["q"])

	var calls atomic.Int64
	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		calls.Add(1)
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithDeliveryTimeout(time.Second)))
	assert.Zero(t, m.Stats().Queues["q"].Depth, "nothing restored")
	require.NoError(t, m.Start(context.Background()))
	stopWithin(t, m)
	assert.Zero(t, calls.Load(), "a message settled at its deadline came back after a restart")
}
