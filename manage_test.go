package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// keepAll is a filter that keeps every message: a package-level function,
// so that declaring a queue again with it is the same setting.
func keepAll(*tinymq.Msg) bool { return true }

// bindings returns the bindings of exchange ex in t, as queue names with
// their keys, for comparing topologies.
func bindings(tp tinymq.Topology, ex string) []tinymq.BindingSpec {
	for _, e := range tp.Exchanges {
		if e.Name == ex {
			return e.Bindings
		}
	}
	return nil
}

func hasExchange(tp tinymq.Topology, ex string) bool {
	return slices.ContainsFunc(tp.Exchanges, func(e tinymq.ExchangeInfo) bool { return e.Name == ex })
}

func queueInfo(tp tinymq.Topology, q string) (tinymq.QueueInfo, bool) {
	i := slices.IndexFunc(tp.Queues, func(qi tinymq.QueueInfo) bool { return qi.Name == q })
	if i < 0 {
		return tinymq.QueueInfo{}, false
	}
	return tp.Queues[i], true
}

// A declared queue has no consumer: its messages wait, and its TTL, length
// limit and head expiry apply as for any queue; Stop counts what still waits
// as undelivered.
func TestDeclaredQueueKeepsMessagesUnderItsLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.DeclareQueue("ttl", "t", tinymq.Fanout, tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.DeclareQueue("reject", "r", tinymq.Fanout, tinymq.WithMaxLen(2, tinymq.RejectPublish)))
		require.NoError(t, m.DeclareQueue("drophead", "d", tinymq.Fanout, tinymq.WithMaxLen(2, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.DeclareQueue("plain", "p", tinymq.Fanout))
		require.NoError(t, m.Start(context.Background()))

		for i := range 3 {
			require.NoError(t, m.Publish("t", i))
			require.NoError(t, m.Publish("d", i))
			require.NoError(t, m.Publish("p", i))
			if i < 2 {
				require.NoError(t, m.Publish("r", i))
			} else {
				require.ErrorIs(t, m.Publish("r", i), tinymq.ErrQueueFull)
			}
		}
		st := m.Stats().Queues
		assert.Equal(t, 3, st["ttl"].Depth)
		assert.Equal(t, 2, st["reject"].Depth)
		assert.Equal(t, uint64(1), st["reject"].Rejected)
		assert.Equal(t, 2, st["drophead"].Depth)
		assert.Equal(t, uint64(1), st["drophead"].Overflowed)
		evicted := recv(t, dead, 1)[0]
		assert.Equal(t, tinymq.ReasonMaxLen, evicted.Deaths[0].Reason)
		assert.Equal(t, 0, evicted.Data)

		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Zero(t, m.Stats().Queues["ttl"].Depth, "head expiry applies to a queue with no consumer")
		for _, d := range recv(t, dead, 3) {
			assert.Equal(t, tinymq.ReasonExpired, d.Deaths[0].Reason)
			assert.Equal(t, "ttl", d.Deaths[0].Queue)
		}
		m.Stop()
		st = m.Stats().Queues
		for _, q := range []string{"ttl", "reject", "drophead", "plain"} {
			assertLedger(t, q, st[q])
		}
		assert.Equal(t, uint64(3), st["ttl"].Expired)
		assert.Equal(t, uint64(3), st["plain"].Undelivered, "Stop leaves what waits in a queue with no consumer undelivered")
		assert.Equal(t, uint64(2), st["reject"].Undelivered)
		assert.Equal(t, uint64(2), st["drophead"].Undelivered)
	})
}

// DeclareQueue again with the same settings changes nothing but adding the
// binding, if it is new; with other settings it returns ErrDuplicateQueue
// and changes nothing at all.
func TestDeclareQueueAgain(t *testing.T) {
	m := started(t)
	opts := []tinymq.QueueOption{
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}),
		tinymq.WithMessageTTL(time.Hour), tinymq.WithFilter(keepAll), tinymq.WithDeadLetter("dlx", "k"),
		tinymq.WithQueueExpiry(time.Hour),
	}
	require.NoError(t, m.DeclareQueue("q", "a", tinymq.Fanout, opts...))
	require.NoError(t, m.Publish("a", 1))
	before := m.Topology()
	require.NoError(t, m.DeclareQueue("q", "a", tinymq.Fanout, opts...), "the same settings")
	assert.Equal(t, before, m.Topology(), "declaring again with the same binding changes nothing")
	assert.Equal(t, 1, m.Stats().Queues["q"].Depth, "nor empties the queue")

	require.NoError(t, m.DeclareQueue("q", "b", tinymq.Fanout, opts...), "the same settings, a new binding")
	require.NoError(t, m.Publish("b", 2), "the new binding routes")
	assert.Equal(t, 2, m.Stats().Queues["q"].Depth)
	before = m.Topology()

	for _, c := range []struct {
		name string
		opts []tinymq.QueueOption
	}{
		{"another TTL", append(slices.Clone(opts[:1]), tinymq.WithMessageTTL(2*time.Hour), opts[2], opts[3], opts[4])},
		{"no TTL", []tinymq.QueueOption{opts[0], opts[2], opts[3], opts[4]}},
		{"another retry", append([]tinymq.QueueOption{tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond})}, opts[1:]...)},
		{"another filter", append(slices.Clone(opts[:2]), tinymq.WithFilter(func(*tinymq.Msg) bool { return false }), opts[3], opts[4])},
		{"another dead-letter key", append(slices.Clone(opts[:3]), tinymq.WithDeadLetter("dlx", "other"), opts[4])},
		{"another expiry", append(slices.Clone(opts[:4]), tinymq.WithQueueExpiry(time.Minute))},
		{"a length limit", append(slices.Clone(opts), tinymq.WithMaxLen(10, tinymq.DropHead))},
	} {
		for _, ex := range []string{"a", "c"} {
			err := m.DeclareQueue("q", ex, tinymq.Fanout, c.opts...)
			assert.ErrorIs(t, err, tinymq.ErrDuplicateQueue, "%s on %s", c.name, ex)
		}
	}
	assert.Equal(t, before, m.Topology(), "a refused declare changes nothing: no binding, no exchange")
	assert.False(t, hasExchange(m.Topology(), "c"))
	assert.Equal(t, 2, m.Stats().Queues["q"].Depth)

	// Direct: a new key is a new binding; a known one is not.
	require.NoError(t, m.DeclareQueue("dq", "dx", tinymq.Direct, tinymq.WithBindingKey("k1")))
	require.NoError(t, m.DeclareQueue("dq", "dx", tinymq.Direct, tinymq.WithBindingKey("k2")))
	require.NoError(t, m.DeclareQueue("dq", "dx", tinymq.Direct, tinymq.WithBindingKey("k1")))
	require.NoError(t, m.Publish("dx", 1, tinymq.WithRoutingKey("k1")))
	require.NoError(t, m.Publish("dx", 2, tinymq.WithRoutingKey("k2")))
	require.ErrorIs(t, m.Publish("dx", 3, tinymq.WithRoutingKey("k3")), tinymq.ErrNoRoute)
	assert.Len(t, bindings(m.Topology(), "dx"), 2)
	assert.Equal(t, 2, m.Stats().Queues["dq"].Depth)

	// Headers: a binding with no arguments matches every message; it is new
	// beside one that has arguments.
	require.NoError(t, m.DeclareQueue("hq", "hx", tinymq.Headers, tinymq.WithBindingArgs(map[string]any{"kind": "a"})))
	require.ErrorIs(t, m.Publish("hx", 1), tinymq.ErrNoRoute)
	require.NoError(t, m.DeclareQueue("hq", "hx", tinymq.Headers))
	require.NoError(t, m.Publish("hx", 2), "the binding with no arguments was added")
	assert.Len(t, bindings(m.Topology(), "hx"), 2)

	// Declare's own refusals.
	assert.ErrorIs(t, m.DeclareQueue("q", "a", tinymq.Fanout, append(slices.Clone(opts), tinymq.WithQueueName("other"))...), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, m.DeclareQueue("q", "a", tinymq.Direct, opts...), tinymq.ErrInvalidBinding, "a direct binding needs a key")
	assert.ErrorIs(t, m.DeclareQueue("q", "a", tinymq.Topic, append(slices.Clone(opts), tinymq.WithBindingKey("x"))...), tinymq.ErrExchangeMismatch)
	assert.ErrorIs(t, m.RegisterQueue("a", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		append(slices.Clone(opts), tinymq.WithQueueName("q"))...), tinymq.ErrDuplicateQueue, "RegisterQueue does not take over a declared queue")
	assert.Equal(t, before.Queues[0], m.Topology().Queues[0])

	// A queue that RegisterQueue made can be declared with its settings.
	require.NoError(t, m.RegisterQueue("r", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2, tinymq.WithQueueName("rq")))
	require.NoError(t, m.DeclareQueue("rq", "r", tinymq.Fanout))
	assert.ErrorIs(t, m.DeclareQueue("rq", "r", tinymq.Fanout, tinymq.WithMessageTTL(time.Second)), tinymq.ErrDuplicateQueue)
	qi, _ := queueInfo(m.Topology(), "rq")
	assert.Equal(t, 1, qi.Consumers, "RegisterQueue is a declare and one consumer")
	assert.Equal(t, 2, qi.Concurrency)
}

// DeleteQueue removes the queue, its bindings and the messages waiting in
// it (those its workers had taken and not begun included), counts them and
// returns how many; deliveries in flight finish, a success counted, a
// failure removed (no retry, no dead letter).
func TestDeleteQueueRemovesItsMessagesAndCountsThem(t *testing.T) {
	t.Run("waiting, taken and in flight", func(t *testing.T) {
		m := tinymq.New(quiet())
		declareQ(t, m, "q")
		declareQ(t, m, "other")
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i))
		}
		g := newGate()
		t.Cleanup(g.open)
		s, err := m.Consume("q", g.consume, 1)
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		defer stopWithin(t, m)
		assert.Equal(t, 0, recv(t, g.in, 1)[0]) // its worker took all ten in one batch and began the first

		n, err := m.DeleteQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 9, n, "the nine its worker had taken and not begun are removed")
		s0 := m.Stats()
		assert.NotContains(t, s0.Queues, "q")
		assert.Equal(t, uint64(1), s0.DeletedQueues)
		assert.Zero(t, s0.ExpiredQueues)
		assert.Equal(t, uint64(9), s0.Deleted.Removed)
		assert.Equal(t, 1, s0.Deleted.InFlight)
		_, ok := queueInfo(m.Topology(), "q")
		assert.False(t, ok)
		assert.Len(t, bindings(m.Topology(), "ev"), 1, "its binding went with it")
		require.NoError(t, m.Publish("ev", 10))
		assert.Equal(t, uint64(11), m.Stats().Queues["other"].Accepted)

		g.open()
		cancelWithin(t, s) // cancelled by the delete: returns once its delivery finished
		s1 := m.Stats().Deleted
		assert.Equal(t, uint64(1), s1.Succeeded, "the delivery in flight finished and counted")
		assert.Equal(t, uint64(10), s1.Accepted)
		assertLedger(t, "deleted", s1)
		assert.Empty(t, g.in, "nothing more was delivered")

		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		assert.Zero(t, m.Stats().Queues["q"].Accepted, "declared again, it starts empty")
		_, err = m.DeleteQueue("nope")
		assert.ErrorIs(t, err, tinymq.ErrUnknownQueue)
	})

	t.Run("a failure in flight is removed, not retried or dead-lettered", func(t *testing.T) {
		m := started(t, quiet())
		dead := deadLetters(t, m)
		declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}),
			tinymq.WithDeadLetter("dlx", ""))
		in := make(chan struct{}, 1)
		release := make(chan struct{})
		_, err := m.Consume("q", func(context.Context, *tinymq.Msg) error {
			in <- struct{}{}
			<-release
			return errors.New("fails after the delete")
		}, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", 1))
		recv(t, in, 1)
		n, err := m.DeleteQueue("q")
		require.NoError(t, err)
		assert.Zero(t, n, "nothing waited")
		close(release)
		require.Eventually(t, func() bool { return m.Stats().Deleted.Removed == 1 }, wait, time.Millisecond)
		stopWithin(t, m)
		d := m.Stats().Deleted
		assertLedger(t, "deleted", d)
		assert.Equal(t, uint64(1), d.Failed)
		assert.Zero(t, d.Retried)
		assert.Zero(t, d.DeadLettered+d.Dropped)
		assert.Empty(t, dead)
	})

	t.Run("delayed messages and retries backing off are removed", func(t *testing.T) {
		m := started(t, quiet())
		declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour}))
		failed := make(chan struct{}, 1)
		s, err := m.Consume("q", func(context.Context, *tinymq.Msg) error {
			failed <- struct{}{}
			return errors.New("retry in an hour")
		}, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", 1))
		recv(t, failed, 1)
		require.NoError(t, m.Publish("ev", 2, tinymq.WithDelay(time.Hour)))
		require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 2 }, wait, time.Millisecond)
		n, err := m.DeleteQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		cancelWithin(t, s)
		stopWithin(t, m)
		d := m.Stats().Deleted
		assertLedger(t, "deleted", d)
		assert.Equal(t, uint64(2), d.Removed)
	})

	t.Run("IfUnused and IfEmpty refuse and change nothing", func(t *testing.T) {
		m := started(t, quiet())
		got := make(chan int, 10)
		require.NoError(t, m.RegisterQueue("r", tinymq.Fanout, ints(got), 1, tinymq.WithQueueName("reg")))
		_, err := m.DeleteQueue("reg", tinymq.IfUnused())
		assert.ErrorIs(t, err, tinymq.ErrInUse, "RegisterQueue's consumer uses it")
		require.NoError(t, m.Publish("r", 1))
		assert.Equal(t, 1, recv(t, got, 1)[0], "the refused delete changed nothing")

		declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour}))
		require.NoError(t, m.Publish("ev", 1))
		_, err = m.DeleteQueue("q", tinymq.IfEmpty())
		assert.ErrorIs(t, err, tinymq.ErrNotEmpty, "a message waits")
		n, err := m.DeleteQueue("q", tinymq.IfUnused())
		require.NoError(t, err, "no consumer: unused")
		assert.Equal(t, 1, n)

		declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour}))
		in := make(chan struct{}, 1)
		release := make(chan struct{})
		s, err := m.Consume("q", func(context.Context, *tinymq.Msg) error {
			in <- struct{}{}
			<-release
			return errors.New("retry in an hour")
		}, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", 1))
		recv(t, in, 1)
		_, err = m.DeleteQueue("q", tinymq.IfEmpty())
		assert.ErrorIs(t, err, tinymq.ErrNotEmpty, "a message is in the consumer")
		_, err = m.DeleteQueue("q", tinymq.IfUnused(), tinymq.IfEmpty())
		assert.ErrorIs(t, err, tinymq.ErrInUse)
		close(release)
		require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, wait, time.Millisecond)
		cancelWithin(t, s)
		_, err = m.DeleteQueue("q", tinymq.IfEmpty())
		assert.ErrorIs(t, err, tinymq.ErrNotEmpty, "a retry backs off")
		assert.Equal(t, 1, m.Stats().Queues["q"].Scheduled, "still there")
		assert.Equal(t, uint64(1), m.Stats().DeletedQueues, "the first q only")

		n, err = m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		n, err = m.DeleteQueue("q", tinymq.IfUnused(), tinymq.IfEmpty())
		require.NoError(t, err, "unused and empty")
		assert.Zero(t, n)

		n, err = m.DeleteQueue("reg")
		require.NoError(t, err, "without IfUnused, a queue with a consumer is deleted")
		assert.Zero(t, n)
		assert.ErrorIs(t, m.Publish("r", 2), tinymq.ErrNoRoute)
		_, err = m.DeleteQueue("reg")
		assert.ErrorIs(t, err, tinymq.ErrUnknownQueue, "deleted once")
		stopWithin(t, m)
		assertLedger(t, "deleted", m.Stats().Deleted)
	})
}

// A publisher blocked on a full queue (WithMaxLen and Block) is released by
// a purge of the queue, which makes room, and by its delete, after which the
// publish goes on without it: to the other queues, or nowhere (ErrNoRoute).
// A paused queue is deleted with what waits in it.
func TestPurgeOrDeleteReleasesPublishersBlockedOnTheQueue(t *testing.T) {
	m := started(t)
	declareQ(t, m, "full", tinymq.WithMaxLen(1, tinymq.Block))
	require.NoError(t, m.Publish("ev", 0))
	blocked := make(chan error, 2)
	go func() { blocked <- m.Publish("ev", 1) }()
	select {
	case err := <-blocked:
		t.Fatalf("a publish to a full Block queue returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	n, err := m.PurgeQueue("full")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.NoError(t, recv(t, blocked, 1)[0], "the purge made room")
	assert.Equal(t, 1, m.Stats().Queues["full"].Depth)

	go func() { blocked <- m.Publish("ev", 2) }()
	select {
	case err := <-blocked:
		t.Fatalf("a publish to a full Block queue returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, m.PauseQueue("full"))
	n, err = m.DeleteQueue("full")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "a paused queue's waiting message")
	assert.ErrorIs(t, recv(t, blocked, 1)[0], tinymq.ErrNoRoute, "the queue it waited for is gone")
	d := m.Stats().Deleted
	assert.Equal(t, uint64(2), d.Accepted)
	assertLedger(t, "deleted", d)

	declareQ(t, m, "full", tinymq.WithMaxLen(1, tinymq.Block))
	declareQ(t, m, "other")
	require.NoError(t, m.Publish("ev", 3))
	go func() { blocked <- m.Publish("ev", 4) }()
	select {
	case err := <-blocked:
		t.Fatalf("a publish to a full Block queue returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	_, err = m.DeleteQueue("full")
	require.NoError(t, err)
	require.NoError(t, recv(t, blocked, 1)[0], "the other queue takes it")
	assert.Equal(t, uint64(2), m.Stats().Queues["other"].Accepted)
	assert.Equal(t, uint64(3), m.Stats().Deleted.Accepted, "the deleted queue never got it")
}

// Stats.Deleted counts what a deleted queue's messages did after the
// delete, however late: here the dead letter of a message that expired
// just before it, held up meanwhile in the dead-letter queue's filter while
// another delete summed up the deleted queues.
func TestDeletedQueueCountsWhatEndsAfterItsDelete(t *testing.T) {
	m := started(t, quiet())
	in, release := make(chan struct{}, 1), make(chan struct{})
	var once, opened sync.Once
	t.Cleanup(func() { opened.Do(func() { close(release) }) })
	require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
		once.Do(func() {
			in <- struct{}{}
			<-release
		})
		return true
	})))
	declareQ(t, m, "x", tinymq.WithMessageTTL(time.Millisecond), tinymq.WithDeadLetter("dlx", ""))
	declareQ(t, m, "y")
	require.NoError(t, m.Publish("ev", 1))
	recv(t, in, 1) // x's message expired; its dead letter is in the filter
	n, err := m.DeleteQueue("x")
	require.NoError(t, err)
	assert.Zero(t, n, "the expired message had left the queue")
	n, err = m.DeleteQueue("y")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	opened.Do(func() { close(release) })
	require.Eventually(t, func() bool { return m.Stats().Queues["dead"].Accepted == 1 }, wait, time.Millisecond)
	stopWithin(t, m)
	d := m.Stats().Deleted
	assert.Equal(t, uint64(1), d.DeadLettered, "the dead letter of x, after its delete")
	assert.Equal(t, uint64(1), d.Expired)
	assertLedger(t, "deleted", d)
}

// PurgeQueue removes what waits (ready, delayed, backing off for a retry,
// taken by a worker and not begun), not what is in a consumer, and returns
// how many; they are counted as Purged and never delivered.
func TestPurgeQueueRemovesWhatWaitsNotWhatIsInAConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Minute}))
		calls := make(chan int, 100)
		release := make(chan struct{})
		_, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error {
			v := msg.Data.(int)
			calls <- v
			if v == 0 {
				<-release
			}
			if v == 100 {
				return errors.New("retry in a minute")
			}
			return nil
		}, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", 100))
		require.NoError(t, m.Start(context.Background()))
		synctest.Wait()
		assert.Equal(t, 100, <-calls)
		assert.Equal(t, 1, m.Stats().Queues["q"].Scheduled)
		require.NoError(t, m.PauseQueue("q"))
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i))
		}
		require.NoError(t, m.Publish("ev", 50, tinymq.WithDelay(time.Hour)))
		require.NoError(t, m.ResumeQueue("q"))
		synctest.Wait()
		assert.Equal(t, 0, <-calls) // its worker took 0..9 in one batch and is inside 0
		n, err := m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 11, n, "9 taken and not begun, one delayed, one retry")
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Depth)
		assert.Equal(t, 1, st.InFlight, "the message in the consumer stays")
		assert.Equal(t, uint64(11), st.Purged)
		n, err = m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Zero(t, n)
		close(release)
		time.Sleep(2 * time.Hour) // past the retry's backoff and the delay
		synctest.Wait()
		assert.Empty(t, calls, "nothing purged is delivered")
		m.Stop()
		st = m.Stats().Queues["q"]
		assertLedger(t, "q", st)
		assert.Equal(t, uint64(1), st.Succeeded)
		_, err = m.PurgeQueue("nope")
		assert.ErrorIs(t, err, tinymq.ErrStopped)
	})
	m := tinymq.New()
	_, err := m.PurgeQueue("nope")
	assert.ErrorIs(t, err, tinymq.ErrUnknownQueue)
}

// TestPurgeRacingRetriesAndDelaysLeavesNoneBehind: a retry or a delayed
// message scheduled while a purge runs is purged or delivered, never left
// counted in the queue with nothing to release it (which held Stop for
// good: the queue never looked idle).
func TestPurgeRacingRetriesAndDelaysLeavesNoneBehind(t *testing.T) {
	m := tinymq.New(quiet())
	declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 50 * time.Microsecond, MaxBackoff: 50 * time.Microsecond}))
	_, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error {
		if msg.Attempt == 1 {
			return errors.New("again")
		}
		return nil
	}, 2)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		for m.Stats().Queues["q"].Retried < 5000 {
			_, _ = m.PurgeQueue("q")
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-purged:
		default:
			var opts []tinymq.PublishOption
			if i%4 == 0 {
				opts = append(opts, tinymq.WithDelay(50*time.Microsecond))
			}
			require.NoError(t, m.Publish("ev", i, opts...))
			continue
		}
		break
	}
	deadline := time.Now().Add(wait)
	for st := m.Stats().Queues["q"]; st.Depth > 0 || st.InFlight > 0; st = m.Stats().Queues["q"] {
		if time.Now().After(deadline) {
			t.Fatalf("messages stay counted with nothing to release them: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	stopWithin(t, m)
	assertLedger(t, "q", m.Stats().Queues["q"])
}

// Unbind removes the one binding its options name; the queue keeps its
// messages and other bindings, and a binding that does not exist is not an
// error.
func TestUnbindRemovesThatBindingOnly(t *testing.T) {
	m := started(t)
	require.NoError(t, m.DeclareQueue("q", "a", tinymq.Fanout))
	require.NoError(t, m.DeclareQueue("q", "b", tinymq.Fanout))
	require.NoError(t, m.Publish("a", 1))
	require.NoError(t, m.Unbind("q", "a"))
	assert.ErrorIs(t, m.Publish("a", 2), tinymq.ErrNoRoute)
	require.NoError(t, m.Publish("b", 3))
	assert.Equal(t, 2, m.Stats().Queues["q"].Depth, "the queue keeps its messages")
	assert.Empty(t, bindings(m.Topology(), "a"))
	require.NoError(t, m.Unbind("q", "a"), "a missing binding is not an error")

	require.NoError(t, m.DeclareQueue("d", "dx", tinymq.Direct, tinymq.WithBindingKey("x"), tinymq.WithBindingKey("y")))
	require.NoError(t, m.Unbind("d", "dx", tinymq.WithBindingKey("x")))
	assert.ErrorIs(t, m.Publish("dx", 1, tinymq.WithRoutingKey("x")), tinymq.ErrNoRoute)
	require.NoError(t, m.Publish("dx", 1, tinymq.WithRoutingKey("y")))
	require.NoError(t, m.Unbind("d", "dx", tinymq.WithBindingKey("z")), "a key never bound")
	require.NoError(t, m.Publish("dx", 1, tinymq.WithRoutingKey("y")))

	require.NoError(t, m.DeclareQueue("t", "tx", tinymq.Topic, tinymq.WithBindingKey("a.*")))
	require.NoError(t, m.DeclareQueue("t", "tx", tinymq.Topic, tinymq.WithBindingKey("#")))
	require.NoError(t, m.DeclareQueue("t2", "tx", tinymq.Topic, tinymq.WithBindingKey("a.*")))
	require.NoError(t, m.Unbind("t", "tx", tinymq.WithBindingKey("a.*")))
	require.NoError(t, m.Publish("tx", 1, tinymq.WithRoutingKey("a.b")))
	assert.Equal(t, 1, m.Stats().Queues["t"].Depth, "still bound with #")
	assert.Equal(t, 1, m.Stats().Queues["t2"].Depth, "another queue's binding with the same key stays")
	require.NoError(t, m.Unbind("t", "tx", tinymq.WithBindingKey("#")))
	require.NoError(t, m.Publish("tx", 2, tinymq.WithRoutingKey("a.b")))
	require.ErrorIs(t, m.Publish("tx", 3, tinymq.WithRoutingKey("c")), tinymq.ErrNoRoute)
	assert.Equal(t, 1, m.Stats().Queues["t"].Depth)
	assert.Equal(t, 2, m.Stats().Queues["t2"].Depth)

	one, two := map[string]any{"k": 1}, map[string]any{"k": 2}
	require.NoError(t, m.DeclareQueue("h", "hx", tinymq.Headers, tinymq.WithBindingArgs(one), tinymq.WithBindingArgs(two)))
	require.NoError(t, m.Unbind("h", "hx", tinymq.WithBindingArgs(map[string]any{"k": 1})))
	assert.ErrorIs(t, m.Publish("hx", 1, tinymq.WithHeaders(one)), tinymq.ErrNoRoute)
	require.NoError(t, m.Publish("hx", 1, tinymq.WithHeaders(two)))

	assert.ErrorIs(t, m.Unbind("nope", "a"), tinymq.ErrUnknownQueue)
	assert.ErrorIs(t, m.Unbind("q", "nope"), tinymq.ErrUnknownExchange)
	assert.ErrorIs(t, m.Unbind("q", "b", tinymq.WithBindingKey("k")), tinymq.ErrInvalidBinding)
	assert.ErrorIs(t, m.Unbind("d", "dx"), tinymq.ErrInvalidBinding, "a direct binding is named by its key")
	assert.ErrorIs(t, m.Unbind("q", "b", nil), tinymq.ErrInvalidOption)
	require.NoError(t, m.Publish("b", 4), "the refused unbinds changed nothing")
}

// DeleteExchange removes the exchange and its bindings; the queues stay.
// IfUnused refuses an exchange with bindings. An exchange declared again
// goes on with the old one's IDs.
func TestDeleteExchangeRemovesItAndItsBindings(t *testing.T) {
	m := started(t, quiet())
	require.NoError(t, m.DeclareQueue("q1", "ex", tinymq.Fanout))
	require.NoError(t, m.DeclareQueue("q1", "other", tinymq.Fanout))
	require.NoError(t, m.DeclareQueue("q2", "ex", tinymq.Fanout, tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Publish("ex", 1))
	assert.ErrorIs(t, m.DeleteExchange("ex", tinymq.IfUnused()), tinymq.ErrInUse)
	require.NoError(t, m.Publish("ex", 2), "the refused delete changed nothing")
	require.NoError(t, m.DeleteExchange("ex"))
	assert.ErrorIs(t, m.Publish("ex", 3), tinymq.ErrUnknownExchange)
	tp := m.Topology()
	assert.False(t, hasExchange(tp, "ex"))
	_, ok := queueInfo(tp, "q2")
	assert.True(t, ok, "the queues stay")
	assert.Equal(t, 2, m.Stats().Queues["q2"].Depth, "with their messages")
	require.NoError(t, m.Publish("other", 3), "the queue's other bindings stay")
	assert.NotContains(t, m.Stats().Exchanges, "ex")

	// Declared again, it is a new exchange with no bindings, and IDs go on.
	require.NoError(t, m.DeclareExchange("ex", tinymq.Direct))
	assert.ErrorIs(t, m.Publish("ex", 4, tinymq.WithRoutingKey("k")), tinymq.ErrNoRoute)
	require.NoError(t, m.DeclareQueue("q3", "ex", tinymq.Direct, tinymq.WithBindingKey("k")))
	require.NoError(t, m.Publish("ex", 5, tinymq.WithRoutingKey("k")))
	got := make(chan *tinymq.Msg, 10)
	for _, q := range []string{"q2", "q3"} {
		_, err := m.Consume(q, sink(got), 1)
		require.NoError(t, err)
	}
	ids := map[uint64]bool{}
	for _, msg := range recv(t, got, 3) {
		assert.False(t, ids[msg.ID], "ID %d given twice by the exchange and its successor", msg.ID)
		ids[msg.ID] = true
	}
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ex"].Published, "Published counts the new exchange's")

	require.NoError(t, m.DeclareExchange("empty", tinymq.Topic))
	require.NoError(t, m.DeleteExchange("empty", tinymq.IfUnused()), "an exchange with no bindings is unused")
	assert.ErrorIs(t, m.DeleteExchange("empty"), tinymq.ErrUnknownExchange)
	assert.ErrorIs(t, m.DeleteExchange("other", tinymq.IfEmpty()), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, m.DeleteExchange("other", nil), tinymq.ErrInvalidOption)

	// A deleted dead-letter exchange routes nothing: the dead message is
	// dropped. A deleted alternate exchange takes nothing.
	require.NoError(t, m.DeclareQueue("dl", "dlx", tinymq.Fanout))
	require.NoError(t, m.DeleteExchange("dlx"))
	require.NoError(t, m.DeclareQueue("f", "fx", tinymq.Fanout, tinymq.WithDeadLetter("dlx", "")))
	_, err := m.Consume("f", failing, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("fx", 1))
	require.Eventually(t, func() bool { return m.Stats().Queues["f"].Dropped == 1 }, wait, time.Millisecond)
	assert.Zero(t, m.Stats().Queues["dl"].Accepted)

	require.NoError(t, m.DeclareExchange("main", tinymq.Direct, tinymq.WithAlternateExchange("alt")))
	require.NoError(t, m.DeclareQueue("aq", "alt", tinymq.Fanout))
	require.NoError(t, m.Publish("main", 1, tinymq.WithRoutingKey("none")), "the alternate takes it")
	require.NoError(t, m.DeleteExchange("alt"))
	assert.ErrorIs(t, m.Publish("main", 2, tinymq.WithRoutingKey("none")), tinymq.ErrNoRoute)
	assert.Equal(t, uint64(1), m.Stats().Queues["aq"].Accepted)
}

// A paused queue accepts messages but hands none to its consumers; the
// delivery in flight finishes, what its workers had taken goes back in
// order, and ResumeQueue delivers the rest in publish order.
func TestPauseQueueHoldsMessagesUntilResumed(t *testing.T) {
	m := tinymq.New()
	declareQ(t, m, "q")
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i))
	}
	in := make(chan int, 100)
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	_, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error {
		v := msg.Data.(int)
		in <- v
		if v == 0 {
			<-release
		}
		return nil
	}, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	assert.Equal(t, 0, recv(t, in, 1)[0]) // its worker holds 0..9, inside 0

	require.NoError(t, m.PauseQueue("q"))
	require.NoError(t, m.PauseQueue("q"), "pausing a paused queue does nothing")
	for i := 10; i < 15; i++ {
		require.NoError(t, m.Publish("ev", i), "a paused queue accepts messages")
	}
	st := m.Stats().Queues["q"]
	assert.True(t, st.Paused)
	assert.Equal(t, 14, st.Ready)
	qi, _ := queueInfo(m.Topology(), "q")
	assert.True(t, qi.Paused)
	close(release)
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].InFlight == 0 }, wait, time.Millisecond)
	assert.Equal(t, uint64(1), m.Stats().Queues["q"].Succeeded, "the delivery in flight finished")
	select {
	case v := <-in:
		t.Fatalf("a paused queue delivered %d", v)
	case <-time.After(20 * time.Millisecond):
	}

	require.NoError(t, m.ResumeQueue("q"))
	require.NoError(t, m.ResumeQueue("q"), "resuming a running queue does nothing")
	got := recv(t, in, 14)
	for i, v := range got {
		require.Equal(t, i+1, v, "delivered in publish order after the resume: %v", got)
	}
	assert.False(t, m.Stats().Queues["q"].Paused)
	assert.ErrorIs(t, m.PauseQueue("nope"), tinymq.ErrUnknownQueue)
	assert.ErrorIs(t, m.ResumeQueue("nope"), tinymq.ErrUnknownQueue)
}

// Resuming a running queue and pausing a paused one change nothing: the
// queue's parked workers still wake for the next message.
func TestPauseOrResumeThatChangesNothingLeavesTheWorkersAwake(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	got := make(chan int, 10)
	_, err := m.Consume("q", ints(got), 2)
	require.NoError(t, err)
	for i := range 20 {
		require.NoError(t, m.Publish("ev", -1))
		assert.Equal(t, -1, recv(t, got, 1)[0])
		require.Eventually(t, func() bool { return m.Stats().Queues["q"].InFlight == 0 }, wait, time.Millisecond)
		require.NoError(t, m.ResumeQueue("q"), "not paused: nothing to do")
		require.NoError(t, m.Publish("ev", i))
		select {
		case v := <-got:
			assert.Equal(t, i, v)
		case <-time.After(settleWait):
			_ = m.PauseQueue("q") // a change wakes them all, so that the cleanup's Stop ends
			_ = m.ResumeQueue("q")
			t.Fatalf("round %d: the message published after a resume that changed nothing waits with every worker parked", i)
		}
	}
	require.NoError(t, m.PauseQueue("q"))
	require.NoError(t, m.PauseQueue("q"), "paused: nothing to do")
	require.NoError(t, m.Publish("ev", 100))
	require.NoError(t, m.ResumeQueue("q"))
	assert.Equal(t, 100, recv(t, got, 1)[0])
}

// Stop does not wait for a paused queue: the delivery in flight finishes,
// and what waits is counted undelivered. TTLs apply while paused.
func TestStopLeavesAPausedQueuesMessagesUndelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		declareQ(t, m, "q")
		declareQ(t, m, "ttl", tinymq.WithMessageTTL(time.Second), tinymq.WithDeadLetter("dlx", ""))
		var done atomic.Int64
		for _, q := range []string{"q", "ttl"} {
			_, err := m.Consume(q, func(context.Context, *tinymq.Msg) error {
				time.Sleep(time.Minute)
				done.Add(1)
				return nil
			}, 1)
			require.NoError(t, err)
		}
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 0))
		synctest.Wait() // both consumers are inside message 0
		require.NoError(t, m.PauseQueue("q"))
		require.NoError(t, m.PauseQueue("ttl"))
		for i := 1; i <= 3; i++ {
			require.NoError(t, m.Publish("ev", i))
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Len(t, recv(t, dead, 3), 3, "the TTL passes at the head of a paused queue")
		m.Stop()
		assert.Equal(t, int64(2), done.Load(), "the deliveries in flight finished")
		st := m.Stats().Queues
		assertLedger(t, "q", st["q"])
		assertLedger(t, "ttl", st["ttl"])
		assert.Equal(t, uint64(3), st["q"].Undelivered)
		assert.Equal(t, uint64(3), st["ttl"].DeadLettered)
	})
}

// Stop ends while publishers race it into a queue that no consumer takes:
// what they got in is counted undelivered, the rest refused. With a data
// directory a publish writes the log without the MQ's lock, and Stop waits
// for it; its arrival leaves the queue with nothing to wait for.
func TestStopRacingPublishersIntoAQueueWithNoConsumerEnds(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(map[bool]string{false: "in memory", true: "durable"}[durable], func(t *testing.T) {
			for range 10 {
				var mopts []tinymq.Option
				var qopts []tinymq.QueueOption
				if durable {
					mopts = append(mopts, tinymq.WithDataDir(t.TempDir()))
					qopts = append(qopts, tinymq.WithDurable())
				}
				m := tinymq.New(append(mopts, quiet())...)
				require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, qopts...))
				require.NoError(t, m.Start(context.Background()))
				var ok atomic.Uint64
				var wg sync.WaitGroup
				flowing := make(chan struct{}, 4)
				for range 4 {
					wg.Go(func() {
						for i := 0; ; i++ {
							if err := m.Publish("ev", i); err != nil {
								assert.ErrorIs(t, err, tinymq.ErrStopped)
								return
							}
							ok.Add(1)
							if i == 3 {
								flowing <- struct{}{}
							}
						}
					})
				}
				recv(t, flowing, 4)
				stopWithin(t, m)
				wg.Wait()
				st := m.Stats().Queues["q"]
				assertLedger(t, "q", st)
				assert.Equal(t, ok.Load(), st.Undelivered)
			}
		})
	}
}

// Stop ends when the message it waits for expires at the head of its queue
// before the worker woken for it gets there: the worker finds nothing, and
// the queue says it is done.
func TestStopEndsWhenTheLastMessageExpiresAtTheHead(t *testing.T) {
	for range 200 {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		_, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 1)
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		for range 3 {
			require.NoError(t, m.Publish("ev", 1, tinymq.WithExpiration(time.Nanosecond)))
		}
		stopWithin(t, m)
		assertLedger(t, "q", m.Stats().Queues["q"])
	}
}

// WithQueueExpiry deletes a queue once it has been unused for its expiry:
// no consumer, no Consume, no declare again (publishing is no use). Its
// messages are removed and counted, not dead-lettered.
func TestQueueExpiryDeletesAnUnusedQueue(t *testing.T) {
	exists := func(m *tinymq.MQ, q string) bool {
		_, ok := m.Stats().Queues[q]
		return ok
	}
	t.Run("unused, with messages", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := tinymq.New(quiet())
			dead := deadLetters(t, m)
			require.NoError(t, m.Start(context.Background()))
			declareQ(t, m, "q", tinymq.WithQueueExpiry(time.Second), tinymq.WithDeadLetter("dlx", ""))
			for range 3 {
				time.Sleep(300 * time.Millisecond)
				require.NoError(t, m.Publish("ev", 1), "publishing is no use")
			}
			time.Sleep(99 * time.Millisecond)
			synctest.Wait()
			require.True(t, exists(m, "q"), "unused for 999ms")
			time.Sleep(2 * time.Millisecond)
			synctest.Wait()
			require.False(t, exists(m, "q"), "unused for 1s")
			s := m.Stats()
			assert.Equal(t, uint64(1), s.ExpiredQueues)
			assert.Equal(t, uint64(1), s.DeletedQueues)
			assert.Equal(t, uint64(3), s.Deleted.Removed)
			assert.Zero(t, s.Deleted.DeadLettered+s.Deleted.Dropped)
			assert.Empty(t, dead, "its messages are not dead-lettered")
			assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrNoRoute)
			m.Stop()
			assertLedger(t, "deleted", m.Stats().Deleted)
		})
	})
	t.Run("declaring again is a use", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := tinymq.New(quiet())
			require.NoError(t, m.Start(context.Background()))
			declareQ(t, m, "q", tinymq.WithQueueExpiry(time.Second))
			time.Sleep(800 * time.Millisecond)
			declareQ(t, m, "q", tinymq.WithQueueExpiry(time.Second))
			time.Sleep(900 * time.Millisecond)
			synctest.Wait()
			assert.True(t, exists(m, "q"), "1.7s after the declare, 0.9s after the second")
			time.Sleep(101 * time.Millisecond)
			synctest.Wait()
			assert.False(t, exists(m, "q"))
			m.Stop()
		})
	})
	t.Run("a consumer is a use until it is cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := tinymq.New(quiet())
			require.NoError(t, m.Start(context.Background()))
			declareQ(t, m, "q", tinymq.WithQueueExpiry(time.Second))
			time.Sleep(500 * time.Millisecond)
			a, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 1)
			require.NoError(t, err)
			b, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 1)
			require.NoError(t, err)
			time.Sleep(time.Hour)
			synctest.Wait()
			assert.True(t, exists(m, "q"), "a queue with a consumer never expires")
			require.NoError(t, a.Cancel(context.Background()))
			time.Sleep(time.Hour)
			synctest.Wait()
			assert.True(t, exists(m, "q"), "it has another")
			require.NoError(t, b.Cancel(context.Background()))
			time.Sleep(999 * time.Millisecond)
			synctest.Wait()
			assert.True(t, exists(m, "q"), "the clock starts at the last Cancel")
			time.Sleep(2 * time.Millisecond)
			synctest.Wait()
			assert.False(t, exists(m, "q"))
			m.Stop()
		})
	})
	t.Run("only while the MQ runs", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := tinymq.New(quiet())
			declareQ(t, m, "q", tinymq.WithQueueExpiry(time.Second))
			time.Sleep(time.Hour)
			synctest.Wait()
			assert.True(t, exists(m, "q"), "not started: nothing expires")
			require.NoError(t, m.Start(context.Background()))
			synctest.Wait()
			assert.False(t, exists(m, "q"), "unused for an hour once it runs")
			declareQ(t, m, "stays", tinymq.WithQueueExpiry(time.Second))
			require.NoError(t, m.Publish("ev", 1))
			m.Stop()
			time.Sleep(time.Hour)
			synctest.Wait()
			s := m.Stats()
			assert.Contains(t, s.Queues, "stays", "nothing expires after Stop")
			assert.Equal(t, uint64(1), s.Queues["stays"].Undelivered)
			assert.Equal(t, uint64(1), s.ExpiredQueues)
		})
	})
	t.Run("no goroutine per idle queue", func(t *testing.T) {
		m := started(t)
		base := runtime.NumGoroutine()
		for i := range 1000 {
			declareQ(t, m, fmt.Sprint("q", i), tinymq.WithQueueExpiry(time.Hour))
		}
		assert.Less(t, runtime.NumGoroutine(), base+10, "1000 expiring queues run no goroutine of their own")
	})
}

// Stats and Topology show each queue's consumers, whether it is paused and
// its expiry; Stats sums up what deleted queues did.
func TestStatsAndTopologyShowConsumersPausesAndDeletes(t *testing.T) {
	m := started(t, quiet())
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, nop, 2, tinymq.WithQueueName("q")))
	a, err := m.Consume("q", nop, 3)
	require.NoError(t, err)
	_, err = m.Consume("q", nop, 1)
	require.NoError(t, err)
	declareQ(t, m, "idle", tinymq.WithQueueExpiry(time.Hour))
	require.NoError(t, m.PauseQueue("idle"))

	s, tp := m.Stats(), m.Topology()
	assert.Equal(t, 3, s.Queues["q"].Consumers)
	assert.False(t, s.Queues["q"].Paused)
	assert.Zero(t, s.Queues["idle"].Consumers)
	assert.True(t, s.Queues["idle"].Paused)
	q, _ := queueInfo(tp, "q")
	assert.Equal(t, 3, q.Consumers)
	assert.Equal(t, 6, q.Concurrency, "the workers of every consumer")
	idle, _ := queueInfo(tp, "idle")
	assert.Equal(t, time.Hour, idle.Expiry)
	assert.True(t, idle.Paused)
	assert.Zero(t, idle.Concurrency)

	cancelWithin(t, a)
	q, _ = queueInfo(m.Topology(), "q")
	assert.Equal(t, 2, q.Consumers)
	assert.Equal(t, 3, q.Concurrency)
	assert.Equal(t, 2, m.Stats().Queues["q"].Consumers)

	for i := range 3 {
		declareQ(t, m, fmt.Sprint("d", i))
	}
	for i := range 4 {
		require.NoError(t, m.Publish("ev", i))
	}
	n, err := m.PurgeQueue("d2")
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, uint64(4), m.Stats().Queues["d2"].Purged)
	for i := range 3 {
		_, err := m.DeleteQueue(fmt.Sprint("d", i))
		require.NoError(t, err)
	}
	s = m.Stats()
	assert.Equal(t, uint64(3), s.DeletedQueues)
	assert.Equal(t, uint64(12), s.Deleted.Accepted)
	assert.Equal(t, uint64(8), s.Deleted.Removed)
	assert.Equal(t, uint64(4), s.Deleted.Purged, "what a queue did before its delete stays counted")
	assertLedger(t, "deleted", s.Deleted)
}

// Every topology call refuses input that could never work with a sentinel
// error, and changes nothing.
func TestTopologyCallsRefuseBadInput(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	before := m.Topology()
	for _, c := range []struct {
		name string
		call func() error
		want error
	}{
		{"declare: empty queue name", func() error { return m.DeclareQueue("", "ev", tinymq.Fanout) }, tinymq.ErrEmptyName},
		{"declare: empty exchange name", func() error { return m.DeclareQueue("x", "", tinymq.Fanout) }, tinymq.ErrEmptyName},
		{"declare again: empty exchange name", func() error { return m.DeclareQueue("q", "", tinymq.Fanout) }, tinymq.ErrEmptyName},
		{"declare: zero kind", func() error { return m.DeclareQueue("x", "new", 0) }, tinymq.ErrInvalidKind},
		{"declare: unknown kind", func() error { return m.DeclareQueue("x", "new", tinymq.ExchangeType(99)) }, tinymq.ErrInvalidKind},
		{"declare: other kind", func() error { return m.DeclareQueue("x", "ev", tinymq.Topic, tinymq.WithBindingKey("k")) }, tinymq.ErrExchangeMismatch},
		{"declare: nil option", func() error { return m.DeclareQueue("x", "ev", tinymq.Fanout, nil) }, tinymq.ErrInvalidOption},
		{"declare: zero expiry", func() error { return m.DeclareQueue("x", "ev", tinymq.Fanout, tinymq.WithQueueExpiry(0)) }, tinymq.ErrInvalidOption},
		{"declare: negative expiry", func() error { return m.DeclareQueue("x", "ev", tinymq.Fanout, tinymq.WithQueueExpiry(-time.Second)) }, tinymq.ErrInvalidOption},
		{"declare: another name", func() error {
			return m.DeclareQueue("x", "ev", tinymq.Fanout, tinymq.WithQueueName("y"))
		}, tinymq.ErrInvalidOption},
		{"declare: a key on fanout", func() error { return m.DeclareQueue("x", "ev", tinymq.Fanout, tinymq.WithBindingKey("k")) }, tinymq.ErrInvalidBinding},
		{"declare: durable without a data directory", func() error { return m.DeclareQueue("x", "ev", tinymq.Fanout, tinymq.WithDurable()) }, tinymq.ErrInvalidOption},
		{"delete: unknown", func() error { _, err := m.DeleteQueue("nope"); return err }, tinymq.ErrUnknownQueue},
		{"delete: nil option", func() error { _, err := m.DeleteQueue("q", nil); return err }, tinymq.ErrInvalidOption},
		{"purge: unknown", func() error { _, err := m.PurgeQueue("nope"); return err }, tinymq.ErrUnknownQueue},
		{"pause: unknown", func() error { return m.PauseQueue("nope") }, tinymq.ErrUnknownQueue},
		{"resume: unknown", func() error { return m.ResumeQueue("") }, tinymq.ErrUnknownQueue},
		{"unbind: unknown queue", func() error { return m.Unbind("nope", "ev") }, tinymq.ErrUnknownQueue},
		{"unbind: unknown exchange", func() error { return m.Unbind("q", "nope") }, tinymq.ErrUnknownExchange},
		{"unbind: nil option", func() error { return m.Unbind("q", "ev", nil) }, tinymq.ErrInvalidOption},
		{"delete exchange: unknown", func() error { return m.DeleteExchange("nope") }, tinymq.ErrUnknownExchange},
		{"delete exchange: IfEmpty", func() error { return m.DeleteExchange("ev", tinymq.IfEmpty()) }, tinymq.ErrInvalidOption},
		{"delete exchange: nil option", func() error { return m.DeleteExchange("ev", nil) }, tinymq.ErrInvalidOption},
	} {
		assert.ErrorIs(t, c.call(), c.want, c.name)
	}
	assert.Equal(t, before, m.Topology(), "no refused call changed anything")
	assert.Zero(t, m.Stats().DeletedQueues)
}

// Once Stop has begun, every topology call returns ErrStopped; Stats and
// Topology still work.
func TestTopologyCallsAfterStopReturnErrStopped(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	stopWithin(t, m)
	for name, call := range map[string]func() error{
		"DeclareQueue":       func() error { return m.DeclareQueue("x", "ev", tinymq.Fanout) },
		"DeclareQueue again": func() error { return m.DeclareQueue("q", "ev", tinymq.Fanout) },
		"DeleteQueue":        func() error { _, err := m.DeleteQueue("q"); return err },
		"PurgeQueue":         func() error { _, err := m.PurgeQueue("q"); return err },
		"PauseQueue":         func() error { return m.PauseQueue("q") },
		"ResumeQueue":        func() error { return m.ResumeQueue("q") },
		"Unbind":             func() error { return m.Unbind("q", "ev") },
		"DeleteExchange":     func() error { return m.DeleteExchange("ev") },
		"Consume": func() error {
			_, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 1)
			return err
		},
	} {
		assert.ErrorIs(t, call(), tinymq.ErrStopped, name)
	}
	assert.Contains(t, m.Stats().Queues, "q")
	assert.Len(t, m.Topology().Queues, 1)
}

// topologyCalls calls every topology operation on the queue name (which
// may be the caller's own) and on one of its own making, so that user code
// that runs inside the MQ does all of it.
func topologyCalls(m *tinymq.MQ, own string, n int64) {
	side := fmt.Sprint("side-", n)
	_ = m.DeclareQueue(side, "side", tinymq.Fanout)
	_ = m.DeclareQueue(own, "side", tinymq.Fanout)
	_, _ = m.PurgeQueue(own)
	_ = m.PauseQueue(own)
	_ = m.ResumeQueue(own)
	_ = m.Unbind(own, "side")
	if s, err := m.Consume(side, func(context.Context, *tinymq.Msg) error { return nil }, 1); err == nil {
		_ = s.Cancel(context.Background())
	}
	_, _ = m.DeleteQueue(side)
	_ = m.DeclareExchange(fmt.Sprint("x-", n), tinymq.Fanout)
	_ = m.DeleteExchange(fmt.Sprint("x-", n))
	_ = m.Stats()
	_ = m.Topology()
}

// A consumer, a filter or a logger may call every topology operation, on
// its own queue too (deleting it, cancelling its own subscription), and
// nothing deadlocks.
func TestTopologyCallsFromUserCodeNeverDeadlock(t *testing.T) {
	t.Run("consumer", func(t *testing.T) {
		m := started(t, quiet())
		declareQ(t, m, "q")
		var sub atomic.Pointer[tinymq.Subscription]
		var calls atomic.Int64
		seen := make(chan struct{}, 100)
		s, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error {
			topologyCalls(m, "q", calls.Add(1)) // purges its own queue, too
			if msg.Data == "last" {
				assert.NoError(t, sub.Load().Cancel(context.Background()), "its own subscription")
				_, err := m.DeleteQueue("q")
				assert.NoError(t, err, "its own queue")
			}
			seen <- struct{}{}
			return nil
		}, 2)
		require.NoError(t, err)
		sub.Store(s)
		for range 20 {
			require.NoError(t, m.Publish("ev", 1))
			recv(t, seen, 1)
		}
		require.NoError(t, m.Publish("ev", "last"))
		recv(t, seen, 1)
		cancelWithin(t, s)
		assert.Equal(t, uint64(1), m.Stats().DeletedQueues-uint64(calls.Load()), "the consumer deleted its own queue")
		stopWithin(t, m)
		assertLedger(t, "deleted", m.Stats().Deleted)
	})
	t.Run("filter", func(t *testing.T) {
		m := started(t, quiet())
		var n atomic.Int64
		var deleteOwn atomic.Bool
		require.NoError(t, m.DeclareQueue("f", "ev", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
			k := n.Add(1)
			topologyCalls(m, "f", k)
			if deleteOwn.Load() {
				_, _ = m.DeleteQueue("f")
				_ = m.DeleteExchange("ev")
			}
			return true
		})))
		declareQ(t, m, "plain")
		published := make(chan error, 100)
		go func() {
			for range 20 {
				published <- m.Publish("ev", 1)
			}
			deleteOwn.Store(true)
			published <- m.Publish("ev", "last")
		}()
		for _, err := range recv(t, published, 20) {
			assert.NoError(t, err)
		}
		assert.ErrorIs(t, recv(t, published, 1)[0], tinymq.ErrUnknownExchange, "the filter deleted the exchange under the publish")
		stopWithin(t, m)
		s := m.Stats()
		assertLedger(t, "deleted", s.Deleted)
		assertLedger(t, "plain", s.Queues["plain"])
	})
	t.Run("logger", func(t *testing.T) {
		var m *tinymq.MQ
		var n atomic.Int64
		m = tinymq.New(tinymq.WithLogger(slog.New(&callbackHandler{fn: func() {
			if k := n.Add(1); k <= 200 { // bounded: the calls log too
				topologyCalls(m, "q", k)
				_, _ = m.DeleteQueue("q")
			}
		}})))
		require.NoError(t, m.Start(context.Background()))
		for range 5 {
			_ = m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithQueueExpiry(time.Millisecond))
			_ = m.Publish("ev", 1)
			_, _ = m.DeleteQueue("q") // logs what it removed
		}
		require.Eventually(t, func() bool { return n.Load() > 0 }, wait, time.Millisecond)
		stopWithin(t, m)
		assertLedger(t, "deleted", m.Stats().Deleted)
	})
}

// A publish racing a delete or an unbind of one of its queues is all or
// nothing there: it reaches the queue before the change, and is counted in
// what a delete removed, or does not reach it; the other queues get it
// either way. This holds on every path a publish takes: the plain fanout,
// a routing key, a TTL, a delay, a length limit and a filter (which runs
// without the MQ's lock).
func TestPublishRacingDeleteOrUnbindIsAllOrNothing(t *testing.T) {
	t.Run("a filter holding the publish across the delete", func(t *testing.T) {
		for _, change := range []string{"DeleteQueue", "Unbind"} {
			m := started(t)
			in, release := make(chan struct{}, 1), make(chan struct{})
			var once sync.Once
			require.NoError(t, m.DeclareQueue("f", "ev", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
				once.Do(func() {
					in <- struct{}{}
					<-release
				})
				return true
			})))
			declareQ(t, m, "other")
			published := make(chan error, 1)
			go func() { published <- m.Publish("ev", 1) }()
			recv(t, in, 1) // the filter kept the message, without the lock
			if change == "DeleteQueue" {
				n, err := m.DeleteQueue("f")
				require.NoError(t, err)
				assert.Zero(t, n)
			} else {
				require.NoError(t, m.Unbind("f", "ev"))
			}
			close(release)
			require.NoError(t, recv(t, published, 1)[0])
			s := m.Stats()
			assert.Equal(t, uint64(1), s.Queues["other"].Accepted, change)
			assert.Zero(t, s.Deleted.Accepted+s.Queues["f"].Accepted, "%s came first: the queue did not get the message", change)
			stopWithin(t, m)
		}
	})

	paths := []struct {
		name string
		kind tinymq.ExchangeType
		opts []tinymq.QueueOption
		pub  []tinymq.PublishOption
	}{
		{name: "plain fanout", kind: tinymq.Fanout},
		{name: "routing key", kind: tinymq.Direct, opts: []tinymq.QueueOption{tinymq.WithBindingKey("k")}, pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k")}},
		{name: "TTL", kind: tinymq.Fanout, pub: []tinymq.PublishOption{tinymq.WithExpiration(time.Hour)}},
		{name: "delay", kind: tinymq.Fanout, pub: []tinymq.PublishOption{tinymq.WithDelay(time.Hour)}},
		{name: "length limit", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithMaxLen(1<<20, tinymq.RejectPublish)}},
		{name: "filter", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithFilter(keepAll)}},
	}
	for _, p := range paths {
		for _, change := range []string{"DeleteQueue", "Unbind"} {
			t.Run(p.name+" racing "+change, func(t *testing.T) {
				m := started(t, quiet())
				require.NoError(t, m.DeclareQueue("victim", "ev", p.kind, p.opts...))
				require.NoError(t, m.DeclareQueue("stays", "ev", p.kind, p.opts...))
				const pubs, after = 4, 100
				var ok atomic.Uint64
				var wg sync.WaitGroup
				flowing := make(chan struct{}, pubs)
				changed := make(chan struct{})
				for range pubs {
					wg.Go(func() {
						for i, left := 0, after; left > 0; i++ {
							if err := m.Publish("ev", i, p.pub...); err != nil {
								t.Errorf("Publish: %v", err)
								return
							}
							ok.Add(1)
							if i == 100 {
								flowing <- struct{}{}
							}
							select {
							case <-changed:
								left-- // a few more once the change is made
							default:
							}
						}
					})
				}
				recv(t, flowing, pubs)
				var reached uint64
				if change == "DeleteQueue" {
					n, err := m.DeleteQueue("victim")
					require.NoError(t, err)
					reached = uint64(n)
				} else {
					var ub []tinymq.BindingOption
					if p.kind == tinymq.Direct {
						ub = append(ub, tinymq.WithBindingKey("k"))
					}
					require.NoError(t, m.Unbind("victim", "ev", ub...))
					reached = m.Stats().Queues["victim"].Accepted
				}
				close(changed)
				wg.Wait()
				s := m.Stats()
				assert.Equal(t, ok.Load(), s.Queues["stays"].Accepted, "every accepted publish reached the queue that stayed")
				assert.Equal(t, ok.Load(), s.Exchanges["ev"].Published)
				victim := s.Queues["victim"]
				if change == "DeleteQueue" {
					victim = s.Deleted
					assert.Equal(t, reached, victim.Removed, "the delete counted every message it removed")
				}
				assert.Equal(t, reached, victim.Accepted, "nothing reached the queue after the %s", change)
				assert.Less(t, reached, ok.Load())
				assert.Equal(t, victim.Depth, int(victim.Accepted-victim.Removed), "the queue holds what reached it")
				stopWithin(t, m)
			})
		}
	}
}

// 10,000 queues declared and deleted in a loop, with messages, consumers
// and expiries, leave the goroutines and the heap where they were.
func TestDeclareDeleteLoopReturnsMemoryAndGoroutines(t *testing.T) {
	m := started(t, quiet())
	require.NoError(t, m.DeclareQueue("keep", "ev", tinymq.Fanout))
	const n = 10_000
	round := func(i int) {
		name := fmt.Sprint("q-", i)
		var opts []tinymq.QueueOption
		if i%3 == 0 {
			opts = append(opts, tinymq.WithQueueExpiry(time.Hour))
		}
		if i%5 == 0 {
			opts = append(opts, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour}))
		}
		require.NoError(t, m.DeclareQueue(name, "ev", tinymq.Fanout, opts...))
		require.NoError(t, m.DeclareQueue(name, "t", tinymq.Topic, append(opts, tinymq.WithBindingKey(name+".#"))...))
		require.NoError(t, m.Publish("ev", i))
		require.NoError(t, m.Publish("ev", i, tinymq.WithDelay(time.Hour)))
		if i%10 == 0 {
			s, err := m.Consume(name, func(context.Context, *tinymq.Msg) error { return nil }, 2)
			require.NoError(t, err)
			if i%20 == 0 {
				cancelWithin(t, s)
			}
		}
		_, err := m.DeleteQueue(name)
		require.NoError(t, err)
	}
	for i := range 100 { // warm up: pools, maps at their size
		round(-i - 1)
	}
	_, err := m.PurgeQueue("keep")
	require.NoError(t, err)
	runtime.GC()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	for i := range n {
		round(i)
		if i%1000 == 999 {
			_, err := m.PurgeQueue("keep")
			require.NoError(t, err)
		}
	}
	for deadline := time.After(wait); runtime.NumGoroutine() > goroutines; {
		select {
		case <-deadline:
			t.Fatalf("goroutines: %d before, %d after %d queues declared and deleted", goroutines, runtime.NumGoroutine(), n)
		case <-time.After(time.Millisecond): // the deleted queues' workers are leaving
		}
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap: %d KiB before, %d KiB after %d queues declared and deleted", before.HeapAlloc>>10, after.HeapAlloc>>10, n)
	assert.Less(t, grown, int64(4<<20), "the heap grew by %d KiB", grown>>10)
	s := m.Stats()
	assert.Equal(t, []string{"keep"}, slices.Collect(maps.Keys(s.Queues)))
	assert.Equal(t, uint64(n+100), s.DeletedQueues)
	assert.Len(t, bindings(m.Topology(), "t"), 0)
	assert.Len(t, bindings(m.Topology(), "ev"), 1)
}

// Shutdown's deadline bounds the stop even when the only consumer still
// running is one of a deleted queue: it reports the delivery as in a
// consumer instead of waiting for it.
func TestShutdownDeadlineBoundsADeletedQueuesConsumer(t *testing.T) {
	m := started(t, quiet())
	declareQ(t, m, "q")
	g := newGate()
	_, err := m.Consume("q", g.consume, 1)
	require.NoError(t, err)
	t.Cleanup(g.open) // before the Stop of started's cleanup
	require.NoError(t, m.Publish("ev", 1))
	recv(t, g.in, 1)
	_, err = m.DeleteQueue("q")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Shutdown(ctx) }()
	err = recv(t, done, 1)[0]
	assert.ErrorIs(t, err, tinymq.ErrUndelivered, "one delivery was still in a consumer")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	g.open()
	stopWithin(t, m)
	assertLedger(t, "deleted", m.Stats().Deleted)
}

// TestTopologyTortureKeepsTheLedger changes the topology at random (declare,
// bind through a declare, delete, purge, unbind, delete an exchange,
// consume, cancel, pause, resume) under concurrent publishers and hostile
// consumers (errors, panics, Goexit, topology calls of their own), and stops
// in the middle of it. Then every queue, live or deleted, has accounted for
// every message it accepted, and the consumers' own count of successes is
// what Stats says.
func TestTopologyTortureKeepsTheLedger(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { topologyTorture(t, seed) })
	}
}

func topologyTorture(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x70b0))
	m := tinymq.New(quiet())
	var succeeded, published atomic.Uint64
	var subsMu sync.Mutex
	subs := map[string][]*tinymq.Subscription{}

	names := make([]string, 5)
	opts := make([][]tinymq.QueueOption, len(names))
	for i := range names {
		names[i] = fmt.Sprint("q", i)
		o := []tinymq.QueueOption{tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1 + rng.IntN(3), InitialBackoff: 100 * time.Microsecond, MaxBackoff: time.Millisecond})}
		if rng.IntN(3) == 0 {
			o = append(o, tinymq.WithMaxLen(20+rng.IntN(100), tinymq.DropHead))
		}
		if rng.IntN(3) == 0 {
			o = append(o, tinymq.WithMessageTTL(time.Duration(1+rng.IntN(10))*time.Millisecond))
		}
		if rng.IntN(3) == 0 {
			o = append(o, tinymq.WithFilter(keepAll))
		}
		if rng.IntN(4) == 0 {
			o = append(o, tinymq.WithQueueExpiry(time.Duration(1+rng.IntN(5))*time.Millisecond))
		}
		opts[i] = o
	}
	consumer := func(queue string) tinymq.ConsumerFunc {
		return func(_ context.Context, msg *tinymq.Msg) error {
			switch rand.IntN(20) {
			case 0:
				return errors.New("fail")
			case 1:
				panic("boom")
			case 2:
				runtime.Goexit()
			case 3:
				if m.Publish("ev", msg.ID) == nil { // re-entrant; ErrStopped once stopping
					published.Add(1)
				}
			case 4:
				_, _ = m.PurgeQueue(queue)
			case 5:
				subsMu.Lock()
				var s *tinymq.Subscription
				if l := subs[queue]; len(l) > 0 {
					s = l[rand.IntN(len(l))]
				}
				subsMu.Unlock()
				if s != nil {
					_ = s.Cancel(context.Background()) // perhaps its own: returns at once
				}
			case 6:
				_ = m.PauseQueue(queue)
				_ = m.ResumeQueue(queue)
			}
			succeeded.Add(1)
			return nil
		}
	}
	require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout))
	_, err := m.Consume("dead", func(context.Context, *tinymq.Msg) error {
		succeeded.Add(1)
		return nil
	}, 2)
	require.NoError(t, err)
	for i, name := range names {
		require.NoError(t, m.DeclareQueue(name, "ev", tinymq.Fanout, opts[i]...))
	}
	require.NoError(t, m.Start(context.Background()))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				var err error
				if i%3 == 0 {
					err = m.Publish("tp", i, tinymq.WithRoutingKey(names[(p+i)%len(names)]+".x"))
				} else {
					err = m.Publish("ev", i)
					if err == nil {
						published.Add(1)
					}
				}
				switch {
				case err == nil, errors.Is(err, tinymq.ErrNoRoute), errors.Is(err, tinymq.ErrUnknownExchange):
				case errors.Is(err, tinymq.ErrStopped):
					return
				default:
					t.Errorf("Publish: %v", err)
					return
				}
			}
		})
	}
	var ops atomic.Int64
	for o := range 2 {
		orng := rand.New(rand.NewPCG(seed, uint64(o)))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ops.Add(1)
				i := orng.IntN(len(names))
				name := names[i]
				var err error
				switch orng.IntN(11) {
				case 0:
					err = m.DeclareQueue(name, "ev", tinymq.Fanout, opts[i]...)
				case 1:
					err = m.DeclareQueue(name, "tp", tinymq.Topic, append(slices.Clone(opts[i]), tinymq.WithBindingKey(name+".*"))...)
				case 2:
					_, err = m.DeleteQueue(name)
				case 3:
					_, err = m.PurgeQueue(name)
				case 4:
					err = m.Unbind(name, "ev")
				case 5:
					err = m.DeleteExchange("tp")
				case 6, 7:
					var s *tinymq.Subscription
					s, err = m.Consume(name, consumer(name), 1+orng.IntN(3))
					if err == nil {
						subsMu.Lock()
						subs[name] = append(subs[name], s)
						subsMu.Unlock()
					}
				case 8:
					subsMu.Lock()
					var s *tinymq.Subscription
					if l := subs[name]; len(l) > 0 {
						k := orng.IntN(len(l))
						s = l[k]
						subs[name] = slices.Delete(l, k, k+1)
					}
					subsMu.Unlock()
					if s != nil {
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(orng.IntN(2))*time.Millisecond)
						err = s.Cancel(ctx)
						cancel()
						if errors.Is(err, context.DeadlineExceeded) {
							err = nil
						}
					}
				case 9:
					if orng.IntN(4) == 0 {
						name = "dead" // dead letters then wait, and may be there at the Stop
					}
					err = m.PauseQueue(name)
				case 10:
					if orng.IntN(4) == 0 {
						name = "dead"
					}
					err = m.ResumeQueue(name)
				}
				switch {
				case err == nil, errors.Is(err, tinymq.ErrUnknownQueue), errors.Is(err, tinymq.ErrUnknownExchange):
				case errors.Is(err, tinymq.ErrStopped):
					return
				default:
					t.Errorf("topology call: %v", err)
					return
				}
			}
		})
	}
	require.Eventually(t, func() bool { return published.Load() > 2000 && ops.Load() > 500 }, wait, time.Millisecond)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		m.Stop()
	}()
	select {
	case <-stopped:
	case <-time.After(wait):
		for n, q := range m.Stats().Queues {
			t.Logf("queue %s when Stop hung: %+v", n, q)
		}
		buf := make([]byte, 1<<20)
		t.Fatalf("Stop under a changing topology did not end in time; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(stop)
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	closedWithin(t, finished, "the publishers and the topology calls after Stop")
	subsMu.Lock()
	for _, l := range subs {
		for _, s := range l {
			cancelWithin(t, s)
		}
	}
	subsMu.Unlock()

	s := m.Stats()
	var total uint64
	for name, st := range s.Queues {
		assertLedger(t, name, st)
		total += st.Succeeded
	}
	assertLedger(t, "deleted", s.Deleted)
	total += s.Deleted.Succeeded
	assert.Equal(t, succeeded.Load(), total, "the consumers' count of successes is what Stats says")
	assert.Equal(t, published.Load(), s.Exchanges["ev"].Published, "every accepted publish was counted")
	var dead uint64
	for name, st := range s.Queues {
		if name != "dead" {
			dead += st.DeadLettered
		}
	}
	dead += s.Deleted.DeadLettered
	assert.Equal(t, dead, s.Queues["dead"].Accepted, "every dead letter reached the dead-letter queue")
	t.Logf("seed %d: %d publishes to ev, %d topology calls, %d queues deleted (%d expired), %d successes",
		seed, published.Load(), ops.Load(), s.DeletedQueues, s.ExpiredQueues, total)
}

// Shutdown before Start drops what was published to a grouped, rate-limited
// queue with a delivery timeout, through a deduplicating exchange: every
// message is counted undelivered, Shutdown says so, and a duplicate of an
// accepted ID still returns nil afterwards.
func TestShutdownBeforeStartCountsGroupedPacedAndDeduplicatedMessages(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2,
		tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithRateLimit(1, 1), tinymq.WithDeliveryTimeout(time.Second)))
	for i := range 5 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithMessageGroup("g"), tinymq.WithDeduplicationID(fmt.Sprint(i))))
	}
	require.ErrorIs(t, m.Shutdown(context.Background()), tinymq.ErrUndelivered)
	st := m.Stats().Queues["q"]
	assert.Equal(t, uint64(5), st.Undelivered)
	assertLedger(t, "q", st)
	require.NoError(t, m.Publish("ev", 0, tinymq.WithDeduplicationID("0")), "a duplicate after the stop")
	assert.ErrorIs(t, m.Publish("ev", 5, tinymq.WithDeduplicationID("5")), tinymq.ErrStopped)
}
