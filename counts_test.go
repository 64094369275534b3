package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// Depth counts every message that waits, those a worker has taken in a batch
// but not begun included; a message in the consumer does not count (as
// RabbitMQ counts ready messages, not unacknowledged ones).
func TestDepthCountsMessagesTakenInABatch(t *testing.T) {
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
	}, 1, tinymq.WithQueueName("q")))
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i)) // before Start: the worker will take a batch
	}
	require.NoError(t, m.Start(context.Background()))
	recv(t, entered, 1)
	st := m.Stats().Queues["q"]
	assert.Equal(t, 9, st.Depth, "nine wait behind the one in the consumer")
	assert.Equal(t, 9, st.Ready)
	assert.Equal(t, 1, st.InFlight)
	close(release)
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

// With concurrency 4, a slow message never holds back the messages a worker
// took with it while other workers are idle: they steal them.
func TestSlowMessageDoesNotHoldItsBatch(t *testing.T) {
	release := make(chan struct{})
	var done atomic.Int32
	all := make(chan struct{})
	const n = 200
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if msg.Data.(int) == 0 {
			<-release // stuck until every other message is done
		}
		if done.Add(1) == n-1 {
			close(all)
		}
		return nil
	}, 4, tinymq.WithQueueName("q")))
	for i := range n {
		require.NoError(t, m.Publish("ev", i)) // before Start: each worker takes a fair share
	}
	require.NoError(t, m.Start(context.Background()))
	closedWithin(t, all, "the other messages being delivered while one is stuck")
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

// After a Shutdown deadline, delayed and retrying messages are counted
// undelivered once, and leave Depth and Scheduled.
func TestShutdownDeadlineClearsScheduledMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "retrying"))
		require.NoError(t, m.Publish("ev", "delayed", tinymq.WithDelay(time.Hour)))
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Depth)
		assert.Zero(t, st.Scheduled)
		assert.Equal(t, uint64(2), st.Undelivered)
		assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped+st.Undelivered)
	})
}

// Shutdown with a context that has already ended, on an MQ with nothing to
// do, reports nothing undelivered: every time, not only when a race goes its
// way.
func TestShutdownOfAnIdleMQWithAnEndedContextIsClean(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 200 {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Shutdown(ctx), "run %d", i)
	}
}

// A dead letter that a closed queue refuses is not counted as published.
func TestPublishedCountsOnlyAcceptedDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			time.Sleep(time.Hour)
			return nil
		}, 1, tinymq.WithQueueName("dead")))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			<-ctx.Done() // fails when the deadline cancels it, after the queues were aborted
			return ctx.Err()
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("dlx", "keeps dead busy"))
		require.NoError(t, m.Publish("ev", "dies after the deadline"))
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()
		st := m.Stats()
		assert.Equal(t, uint64(1), st.Exchanges["dlx"].Published, "the refused dead letter is not counted")
		assert.Equal(t, uint64(1), st.Queues["q"].Dropped)
		q := st.Queues["q"]
		assert.Equal(t, q.Accepted, q.Succeeded+q.DeadLettered+q.Dropped+q.Undelivered, fmt.Sprintf("%+v", q))
	})
}
