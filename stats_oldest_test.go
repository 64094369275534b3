package tinymq_test

// QueueStats.OldestAge: how long the oldest ready message has waited.

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

func oldestAge(m *tinymq.MQ, q string) time.Duration { return m.Stats().Queues[q].OldestAge }

// consumeHoldingA subscribes one worker to queue q of m, whose consumer
// holds the message "a" until hold is closed.
func consumeHoldingA(t *testing.T, m *tinymq.MQ, hold <-chan struct{}) *tinymq.Subscription {
	t.Helper()
	sub, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error {
		if msg.Data == "a" {
			<-hold
		}
		return nil
	}, 1)
	require.NoError(t, err)
	return sub
}

// ageInRange asserts OldestAge within [truth, truth+clockSlack].
func ageInRange(t *testing.T, got, truth time.Duration, msg string) {
	t.Helper()
	assert.GreaterOrEqual(t, got, truth, "%s: never less than the truth", msg)
	assert.LessOrEqual(t, got, truth+clockSlack, "%s: at most a tick more than the truth", msg)
}

// A worker's batch counts from its first entry not begun yet, not from the
// first it took.
func TestOldestAgeBatchRemainderIsNotOlderThanItIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		holdX, holdB := make(chan struct{}), make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			switch msg.Data {
			case "x":
				<-holdX
			case "b":
				<-holdB
			}
			return nil
		}, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "x"))
		synctest.Wait() // x in the consumer
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(5 * time.Second)
		require.NoError(t, m.Publish("ev", "c"))
		time.Sleep(time.Second)
		ageInRange(t, oldestAge(m, "q"), 6*time.Second, "a waited 6s")

		close(holdX) // the worker takes a, b, c in one batch; a passes, b blocks
		synctest.Wait()
		qs := m.Stats().Queues["q"]
		require.Equal(t, 1, qs.Ready, "only c waits")
		require.Equal(t, 1, qs.InFlight, "b is in the consumer")
		ageInRange(t, qs.OldestAge, time.Second, "c waited 1s")
		close(holdB)
	})
}

// Restore: entries come back in publish order, each stamped when it became
// ready; a message published earlier whose delay (or retry backoff) ended
// later is the head, and must not hide an older ready message behind it.
func TestOldestAgeRestoredDelayedHeadHidesOlderReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a", tinymq.WithDelay(time.Second))) // ready at t0+1s
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, m.Publish("ev", "b")) // ready at t0+50ms
		time.Sleep(2 * time.Second)
		ageInRange(t, oldestAge(m, "q"), 2*time.Second, "live: b waited 2s")
		m.Stop()

		time.Sleep(3 * time.Second)
		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		ageInRange(t, oldestAge(m, "q"), 5*time.Second, "restored: b has waited 5s")
	})
}

func TestOldestAgeRestoredRetryHeadHidesOlderReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		sub, err := m.Consume("q", func(ctx context.Context, msg *tinymq.Msg) error { return errors.New("no") }, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", "a")) // fails, back at t0+1s
		synctest.Wait()
		require.NoError(t, sub.Cancel(context.Background()))
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, m.Publish("ev", "b")) // ready at t0+100ms
		time.Sleep(2 * time.Second)
		require.Equal(t, 2, m.Stats().Queues["q"].Ready)
		ageInRange(t, oldestAge(m, "q"), 2*time.Second, "live: b waited 2s")
		m.Stop()

		time.Sleep(3 * time.Second)
		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.Equal(t, 2, m.Stats().Queues["q"].Ready)
		ageInRange(t, oldestAge(m, "q"), 5*time.Second, "restored: b has waited 5s")
	})
}

// A group's next message joins the tail of the queue with the stamp it got in
// its group's backlog: behind a newer head it is still the oldest.
func TestOldestAgeGroupNextBehindNewerHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		hold := make(chan struct{})
		holdG1 := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			switch msg.Data {
			case "g1":
				<-holdG1
			case "y", "z1":
				<-hold
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "g1", tinymq.WithMessageGroup("g")))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "g2", tinymq.WithMessageGroup("g"))) // backlog, t0
		require.NoError(t, m.Publish("ev", "y"))                                // second worker, held
		synctest.Wait()
		time.Sleep(4 * time.Second)
		require.NoError(t, m.Publish("ev", "z1"))
		require.NoError(t, m.Publish("ev", "z2"))
		time.Sleep(time.Second)
		ageInRange(t, oldestAge(m, "q"), 5*time.Second, "g2 in the backlog")
		close(holdG1) // g2 joins the tail behind z2; worker 1 takes z1 and blocks
		synctest.Wait()
		qs := m.Stats().Queues["q"]
		require.Equal(t, 2, qs.Ready, "z2 and g2 wait")
		ageInRange(t, qs.OldestAge, 5*time.Second, "g2 waited 5s and is ready")
		close(hold)
	})
}

func startedQueue(t *testing.T, opts ...tinymq.QueueOption) *tinymq.MQ {
	t.Helper()
	m := tinymq.New()
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, append([]tinymq.QueueOption{tinymq.WithQueueName("q")}, opts...)...))
	require.NoError(t, m.Start(context.Background()))
	synctest.Wait()
	return m
}

func TestOldestAgePausedAndNoConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.PauseQueue("q"))
		time.Sleep(2 * time.Second)
		ageInRange(t, oldestAge(m, "q"), 2*time.Second, "paused, no consumer")
		_, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 2)
		require.NoError(t, err)
		synctest.Wait()
		time.Sleep(time.Second)
		ageInRange(t, oldestAge(m, "q"), 3*time.Second, "paused with a consumer")
		require.NoError(t, m.ResumeQueue("q"))
		synctest.Wait()
		assert.Zero(t, oldestAge(m, "q"))
	})
}

func TestOldestAgePausedQueueGivesBackABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		hold := make(chan struct{})
		for _, d := range []string{"a", "b", "c"} {
			require.NoError(t, m.Publish("ev", d))
		}
		time.Sleep(2 * time.Second)
		consumeHoldingA(t, m, hold)
		synctest.Wait()
		require.NoError(t, m.PauseQueue("q"))
		time.Sleep(time.Second)
		qs := m.Stats().Queues["q"]
		require.Equal(t, 2, qs.Ready)
		ageInRange(t, qs.OldestAge, 3*time.Second, "b given back")
		close(hold)
		synctest.Wait()
		ageInRange(t, oldestAge(m, "q"), 3*time.Second, "still paused")
	})
}

func TestOldestAgeDropHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t, tinymq.WithMaxLen(2, tinymq.DropHead))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "a"))
		time.Sleep(time.Second)
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(time.Second)
		require.NoError(t, m.Publish("ev", "c")) // evicts a
		time.Sleep(time.Second)
		qs := m.Stats().Queues["q"]
		require.Equal(t, uint64(1), qs.Overflowed)
		ageInRange(t, qs.OldestAge, 2*time.Second, "b is the head now")
	})
}

func TestOldestAgePurgeAndDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		hold := make(chan struct{})
		_, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { <-hold; return nil }, 1)
		require.NoError(t, err)
		for range 5 {
			require.NoError(t, m.Publish("ev", "x"))
		}
		require.NoError(t, m.Publish("ev", "d", tinymq.WithDelay(time.Hour)))
		synctest.Wait()
		time.Sleep(time.Second)
		assert.NotZero(t, oldestAge(m, "q"))
		_, err = m.PurgeQueue("q")
		require.NoError(t, err)
		qs := m.Stats().Queues["q"]
		assert.Zero(t, qs.Ready)
		assert.Zero(t, qs.OldestAge, "purged (batch included)")
		require.NoError(t, m.Publish("ev", "y"))
		time.Sleep(time.Second)
		ageInRange(t, oldestAge(m, "q"), time.Second, "after the purge")
		close(hold)
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "z"))
		require.NoError(t, m.PauseQueue("q"))
		require.NoError(t, m.Publish("ev", "z2"))
		time.Sleep(time.Second)
		_, err = m.DeleteQueue("q")
		require.NoError(t, err)
		s := m.Stats()
		assert.NotContains(t, s.Queues, "q")
		assert.Zero(t, s.Deleted.OldestAge, "a deleted queue's age is not summed")
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		assert.Zero(t, oldestAge(m, "q"), "declared again: empty")
	})
}

func TestOldestAgeCancelGivesBackBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		for _, d := range []string{"a", "b", "c", "d"} {
			require.NoError(t, m.Publish("ev", d))
		}
		time.Sleep(2 * time.Second)
		hold := make(chan struct{})
		sub := consumeHoldingA(t, m, hold)
		synctest.Wait()
		qs := m.Stats().Queues["q"]
		require.Equal(t, 3, qs.Ready)
		ageInRange(t, qs.OldestAge, 2*time.Second, "b..d in the batch")
		go func() { _ = sub.Cancel(context.Background()) }()
		synctest.Wait()
		time.Sleep(time.Second)
		qs = m.Stats().Queues["q"]
		require.Equal(t, 3, qs.Ready)
		ageInRange(t, qs.OldestAge, 3*time.Second, "given back to buf")
		msgs, err := m.Peek("q", 10)
		require.NoError(t, err)
		require.Len(t, msgs, 3)
		ageInRange(t, oldestAge(m, "q"), 3*time.Second, "Peek changes nothing")
		close(hold)
		synctest.Wait()
		ageInRange(t, oldestAge(m, "q"), 3*time.Second, "no consumer left")
	})
}

func TestOldestAgePeekGivesBackStolenBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		for i := range 40 {
			require.NoError(t, m.Publish("ev", i))
			time.Sleep(100 * time.Millisecond)
		}
		hold := make(chan struct{})
		_, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error { <-hold; return nil }, 4)
		require.NoError(t, err)
		synctest.Wait()
		time.Sleep(time.Second)
		qs := m.Stats().Queues["q"]
		require.Equal(t, 4, qs.InFlight)
		// The oldest ready is message 4 at the latest (0..3 are in the consumers),
		// whichever 4 were taken; published at 0.4s at the latest, now 5s.
		assert.GreaterOrEqual(t, qs.OldestAge, 5*time.Second-400*time.Millisecond)
		before := qs.OldestAge
		_, err = m.Peek("q", 3)
		require.NoError(t, err)
		assert.Equal(t, before, oldestAge(m, "q"), "Peek moves nothing")
		close(hold)
		synctest.Wait()
		assert.Zero(t, oldestAge(m, "q"))
	})
}

func TestOldestAgeDeadLetterQueueAndReplay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout))
		var fail atomic.Bool
		fail.Store(true)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			if fail.Load() {
				return tinymq.ErrPermanent
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "a"))
		time.Sleep(time.Second)
		require.NoError(t, m.Publish("ev", "b"))
		synctest.Wait()
		time.Sleep(2 * time.Second)
		require.Equal(t, 2, m.Stats().Queues["dlq"].Ready)
		ageInRange(t, oldestAge(m, "dlq"), 3*time.Second, "a dead-lettered 3s ago")
		assert.Zero(t, oldestAge(m, "q"))
		// Replay into the DLQ's own origin: the dead letters go back to q.
		require.NoError(t, m.PauseQueue("q"))
		n, err := m.ReplayDeadLetters("dlq", 1)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		time.Sleep(500 * time.Millisecond)
		ageInRange(t, oldestAge(m, "dlq"), 2500*time.Millisecond, "b remains in the DLQ")
		ageInRange(t, oldestAge(m, "q"), 500*time.Millisecond, "a replayed into q 0.5s ago")
		fail.Store(false)
		require.NoError(t, m.ResumeQueue("q"))
		synctest.Wait()
		assert.Zero(t, oldestAge(m, "q"))
	})
}

func TestOldestAgeDelayedPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "a", tinymq.WithDelay(3*time.Second)))
		time.Sleep(2 * time.Second)
		assert.Zero(t, oldestAge(m, "q"), "delayed: not ready")
		require.NoError(t, m.Publish("ev", "b", tinymq.WithDelay(500*time.Millisecond)))
		time.Sleep(3 * time.Second)
		// b ready at 2.5s, a at 3s; now 5s.
		ageInRange(t, oldestAge(m, "q"), 2500*time.Millisecond, "b's delay ended 2.5s ago")
		// a delay ending long after the clock stopped
		_, err := m.PurgeQueue("q")
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", "c", tinymq.WithDelay(7*time.Second)))
		time.Sleep(8 * time.Second)
		ageInRange(t, oldestAge(m, "q"), time.Second, "c's delay ended 1s ago")
	})
}

func TestOldestAgeTTLExpiredHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t, tinymq.WithMessageTTL(2*time.Second))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "a"))
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(time.Second) // a expired at 2s
		qs := m.Stats().Queues["q"]
		require.Equal(t, uint64(1), qs.Expired)
		ageInRange(t, qs.OldestAge, time.Second, "b")
		time.Sleep(2 * time.Second)
		assert.Zero(t, oldestAge(m, "q"), "all expired")
	})
}

func TestOldestAgeRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil },
			2, tinymq.WithQueueName("q"), tinymq.WithRateLimit(1, 1)))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		for range 3 {
			require.NoError(t, m.Publish("ev", "x"))
		}
		time.Sleep(500 * time.Millisecond)
		ageInRange(t, oldestAge(m, "q"), 500*time.Millisecond, "two wait for tokens")
		time.Sleep(time.Second) // one more taken at 1s
		qs := m.Stats().Queues["q"]
		require.Equal(t, 1, qs.Ready)
		ageInRange(t, qs.OldestAge, 1500*time.Millisecond, "the third")
		time.Sleep(time.Second)
		assert.Zero(t, oldestAge(m, "q"))
	})
}

func TestOldestAgeDeliveryTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		hold := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			if msg.Data == "a" {
				<-hold
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(2*time.Second),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 3 * time.Second})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(time.Second)
		ageInRange(t, oldestAge(m, "q"), time.Second, "b behind the hanging a")
		time.Sleep(1500 * time.Millisecond) // a timed out at 2s; b delivered
		synctest.Wait()
		assert.Zero(t, oldestAge(m, "q"), "a backing off, b done")
		time.Sleep(3 * time.Second) // a's retry back at 5s, hangs again
		synctest.Wait()
		assert.Zero(t, oldestAge(m, "q"))
		close(hold)
		m.Stop()
	})
}

func TestOldestAgePublishBeforeStartAndAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		require.NoError(t, m.Publish("ev", "a"))
		time.Sleep(2 * time.Second)
		ageInRange(t, oldestAge(m, "q"), 2*time.Second, "before Start")
		require.NoError(t, m.Start(context.Background()))
		time.Sleep(time.Second)
		ageInRange(t, oldestAge(m, "q"), 3*time.Second, "after Start")
		m.Stop()
		qs := m.Stats().Queues["q"]
		if qs.Ready == 0 {
			assert.Zero(t, qs.OldestAge, "after Stop, nothing ready: no age")
		}
		var walked tinymq.QueueStats
		m.WalkStats(nil, func(name string, qs *tinymq.QueueStats) bool { walked = *qs; return true })
		assert.Equal(t, qs.OldestAge, walked.OldestAge)
	})
}

func TestOldestAgeClockStopBoundary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := startedQueue(t)
		defer m.Stop()
		// Publish at every offset around the clock's one-second run, and
		// just after it stopped; each message alone in the queue.
		for off := time.Duration(0); off < 2200*time.Millisecond; off += 7 * time.Millisecond {
			require.NoError(t, m.Publish("ev", "x"))
			time.Sleep(3 * time.Millisecond)
			ageInRange(t, oldestAge(m, "q"), 3*time.Millisecond, "alone")
			_, err := m.PurgeQueue("q")
			require.NoError(t, err)
			time.Sleep(4 * time.Millisecond)
		}
		for _, gap := range []time.Duration{time.Second, 1010 * time.Millisecond, 995 * time.Millisecond, 5 * time.Second} {
			require.NoError(t, m.Publish("ev", "start"))
			time.Sleep(gap)
			_, err := m.PurgeQueue("q")
			require.NoError(t, err)
			require.NoError(t, m.Publish("ev", "y"))
			time.Sleep(time.Millisecond)
			ageInRange(t, oldestAge(m, "q"), time.Millisecond, gap.String())
			_, err = m.PurgeQueue("q")
			require.NoError(t, err)
		}
	})
}

func TestOldestAgeRestoredStillDelayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a", tinymq.WithDelay(10*time.Second)))
		time.Sleep(2 * time.Second)
		m.Stop()
		time.Sleep(3 * time.Second)
		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		assert.Zero(t, oldestAge(m, "q"), "still delayed")
		time.Sleep(7 * time.Second) // due at 10s, now 12s
		ageInRange(t, oldestAge(m, "q"), 2*time.Second, "delay ended 2s ago, after the restart")
	})
}

func goroutineID() int64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	id, _ := strconv.ParseInt(string(s[:bytes.IndexByte(s, ' ')]), 10, 64)
	return id
}

// The true age, conservatively: message i is surely ready during a sample
// [S0, S1] when its Publish returned before S0 (pubAfter < S0: it was in the
// queue by then) and the worker that later ran it was still inside its
// previous consumer call after S1 (prevEnd > S1: a worker claims its next
// message only after its previous call returned, and only the worker's own
// goroutine calls the consumer). Its age at the sample is then at least
// S0 - pubAfter, and OldestAge (read at some instant <= S1, from a stamp <=
// the enqueue) must be at least that.
func TestOldestAgeRealTimeNeverLessThanTruth(t *testing.T) {
	const pubs, per, conc = 4, 250, 3
	const n = pubs * per
	m := tinymq.New()
	pubAfter := make([]atomic.Int64, n)
	pubBefore := make([]atomic.Int64, n)
	prevEnd := make([]atomic.Int64, n)
	consStart := make([]atomic.Int64, n)
	var lastEnd sync.Map // goroutine id -> end of its previous call
	var done sync.WaitGroup
	done.Add(n)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		i := msg.Data.(int)
		consStart[i].Store(time.Now().UnixNano())
		g := goroutineID()
		if v, ok := lastEnd.Load(g); ok {
			prevEnd[i].Store(v.(int64))
		}
		time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
		lastEnd.Store(g, time.Now().UnixNano())
		done.Done()
		return nil
	}, conc, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()

	type sample struct {
		s0, s1 int64
		age    time.Duration
	}
	var samples []sample
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			s0 := time.Now().UnixNano()
			var age time.Duration
			if len(samples)%2 == 0 {
				age = m.Stats().Queues["q"].OldestAge
			} else {
				m.WalkStats(nil, func(_ string, qs *tinymq.QueueStats) bool { age = qs.OldestAge; return true })
			}
			samples = append(samples, sample{s0, time.Now().UnixNano(), age})
			time.Sleep(300 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	for p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range per {
				i := p*per + k
				pubBefore[i].Store(time.Now().UnixNano())
				if err := m.Publish("ev", i); err != nil {
					t.Error(err)
					return
				}
				pubAfter[i].Store(time.Now().UnixNano())
				if rand.IntN(3) == 0 {
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	done.Wait()
	close(stop)
	<-sampled

	checked, violations := 0, 0
	var worst time.Duration
	over, overWorst := 0, time.Duration(0)
	const slack = 25 * time.Millisecond // a tick, and the scheduler's lateness on a loaded machine
	for _, s := range samples {
		// Upper bound: a message ready at the sample was claimed after S0
		// (consStart > S0) and entered the queue after its Publish began.
		var oldestBegin int64
		for i := range n {
			pb, cs := pubBefore[i].Load(), consStart[i].Load()
			if pb != 0 && pb < s.s1 && cs > s.s0 && (oldestBegin == 0 || pb < oldestBegin) {
				oldestBegin = pb
			}
		}
		if oldestBegin != 0 {
			if limit := time.Duration(s.s1-oldestBegin) + slack; s.age > limit {
				over++
				overWorst = max(overWorst, s.age-limit)
			}
		} else if s.age > slack {
			over++
			overWorst = max(overWorst, s.age-slack)
		}
		var truth time.Duration
		for i := range n {
			pa, pe := pubAfter[i].Load(), prevEnd[i].Load()
			if pa != 0 && pa < s.s0 && pe > s.s1 {
				truth = max(truth, time.Duration(s.s0-pa))
			}
		}
		if truth == 0 {
			continue
		}
		checked++
		if s.age < truth {
			violations++
			worst = max(worst, truth-s.age)
		}
	}
	t.Logf("%d samples, %d with a surely-ready message, %d below the truth (worst by %v)", len(samples), checked, violations, worst)
	t.Logf("%d samples more than the truth + %v (worst by %v beyond that)", over, slack, overWorst)
	assert.Positive(t, checked)
	assert.Zero(t, violations, "OldestAge below the true age of a surely-ready message")
}

// After a restart, a durable queue that this process has not registered yet
// shows its messages as Ready in Stats, and the age of the oldest.
func TestOldestAgeUnregisteredDurableQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a"))
		time.Sleep(2 * time.Second)
		m.Stop()
		time.Sleep(3 * time.Second)

		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.DeclareQueue("other", "ev2", tinymq.Fanout, tinymq.WithDurable())) // opens the log
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		qs := m.Stats().Queues["q"]
		require.True(t, qs.Unregistered)
		require.Equal(t, 1, qs.Ready, "one message ready in the log")
		assert.GreaterOrEqual(t, qs.OldestAge, 5*time.Second, "it has waited 5s (Ready %d)", qs.Ready)
	})
}

// Stats and WalkStats racing publishes, steals, a Cancel, a Purge and Stop
// (run under -race): no race, and OldestAge is zero whenever nothing is ready.
func TestOldestAgeRacesStop(t *testing.T) {
	for range 5 {
		m := tinymq.New()
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		require.NoError(t, m.Start(context.Background()))
		sub, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { time.Sleep(50 * time.Microsecond); return nil }, 4)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for p := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range 300 {
					if m.Publish("ev", k, tinymq.WithDelay(time.Duration(p*k%3)*time.Millisecond)) != nil {
						return
					}
				}
			}()
		}
		quit := make(chan struct{})
		var sw sync.WaitGroup
		sw.Add(1)
		go func() {
			defer sw.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				qs := m.Stats().Queues["q"]
				if qs.Ready == 0 && qs.OldestAge != 0 {
					// not atomic with Ready? both are read under q.mu
					t.Errorf("Ready 0 but OldestAge %v", qs.OldestAge)
				}
				m.WalkStats(nil, func(string, *tinymq.QueueStats) bool { return true })
			}
		}()
		time.Sleep(5 * time.Millisecond)
		_, _ = m.PurgeQueue("q")
		_ = sub.Cancel(context.Background())
		_, _ = m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 2)
		wg.Wait()
		m.Stop()
		close(quit)
		sw.Wait()
		qs := m.Stats().Queues["q"]
		if qs.Ready == 0 {
			assert.Zero(t, qs.OldestAge)
		}
	}
}

// A message's stamp is the clock's reading when it arrived, never that of
// an earlier message of the same tick: when the scheduler reads the clock
// between two ticks (here a delayed message that becomes its earliest
// item), OldestAge is still at most a tick over the truth.
func TestOldestAgeIsAtMostATickOverWhenTheClockIsReadBetweenTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithQueueName("q"), tinymq.WithMaxLen(2, tinymq.DropHead)))
		require.NoError(t, m.DeclareQueue("later", "later", tinymq.Fanout, tinymq.WithQueueName("later")))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		time.Sleep(2 * time.Second) // the clock stops: the next stamp reads the time itself
		require.NoError(t, m.Publish("ev", "a"))
		synctest.Wait()
		time.Sleep(9 * time.Millisecond)
		require.NoError(t, m.Publish("later", "x", tinymq.WithDelay(time.Hour))) // a reading at a+9ms
		synctest.Wait()
		time.Sleep(9*time.Millisecond + 900*time.Microsecond)
		require.NoError(t, m.Publish("ev", "b")) // at a+18.9ms, stamped a+9ms
		bAt := time.Now()
		require.NoError(t, m.Publish("ev", "c")) // evicts a: b is the oldest
		time.Sleep(time.Millisecond)
		qs := m.Stats().Queues["q"]
		require.Equal(t, uint64(1), qs.Overflowed)
		ageInRange(t, qs.OldestAge, time.Since(bAt), "b")
	})
}

// A message that ReplayDeadLetters takes and puts back goes before the
// others as it was, and an older one behind it still counts: here a
// group's next message, which joined behind a newer one with the stamp it
// got in its group's backlog.
func TestOldestAgeCountsAnOlderMessageBehindOneAReplayPutBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		hold := make(chan struct{})
		consumeHoldingA(t, m, hold)
		require.NoError(t, m.Publish("ev", "a", tinymq.WithMessageGroup("g"))) // its group's message out
		require.NoError(t, m.Publish("ev", "b", tinymq.WithMessageGroup("g"))) // waits behind a
		bAt := time.Now()
		synctest.Wait()
		time.Sleep(time.Second)
		require.NoError(t, m.PauseQueue("q"))
		require.NoError(t, m.Publish("ev", "x"))
		close(hold) // a ends: b joins behind x, with its older stamp
		synctest.Wait()
		time.Sleep(time.Millisecond)
		qs := m.Stats().Queues["q"]
		require.Equal(t, 2, qs.Ready)
		ageInRange(t, qs.OldestAge, time.Since(bAt), "b, behind x")

		_, err := m.ReplayDeadLetters("q", 10) // takes x and b, which have no death, and puts them back
		require.ErrorIs(t, err, tinymq.ErrNoDeath)
		qs = m.Stats().Queues["q"]
		require.Equal(t, 2, qs.Ready)
		ageInRange(t, qs.OldestAge, time.Since(bAt), "b, behind x put back")
	})
}
