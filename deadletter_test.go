package tinymq_test

// Where these tests need time (backoffs, TTLs, delays), they run in a
// synctest bubble: it passes on a fake clock, exactly and at once.

import (
	"context"
	"errors"
	"fmt"
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

// parked is an MQ whose queue "work" (exchange "jobs", direct, key "job")
// fails every message while broken is set, dead-lettering it to "dlx" and
// its consumer-less queue "dlq"; done receives what "work" handled.
func parked(t *testing.T, broken *atomic.Bool, opts ...tinymq.Option) (m *tinymq.MQ, done chan *tinymq.Msg) {
	t.Helper()
	m = tinymq.New(append([]tinymq.Option{quiet()}, opts...)...)
	done = make(chan *tinymq.Msg, 100)
	require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout))
	require.NoError(t, m.RegisterQueue("jobs", tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
		if broken.Load() {
			return tinymq.Permanent(errors.New("bug"))
		}
		done <- msg
		return nil
	}, 1, tinymq.WithQueueName("work"), tinymq.WithBindingKey("job"), tinymq.WithDeadLetter("dlx", "")))
	return m, done
}

func TestReplayMovesDeadLettersBackToWhereTheyDied(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	m, done := parked(t, &broken)
	require.NoError(t, m.Start(context.Background()))
	for i := range 4 {
		require.NoError(t, m.Publish("jobs", i, tinymq.WithRoutingKey("job"), tinymq.WithHeaders(map[string]any{"n": int64(i)})))
	}
	require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == 4 }, wait, time.Millisecond)

	broken.Store(false) // the bug is fixed
	n, err := m.ReplayDeadLetters("dlq", 3)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	for i, msg := range recv(t, done, 3) {
		assert.Equal(t, i, msg.Data, "in order")
		assert.Equal(t, "job", msg.RoutingKey, "the routing key it died with")
		assert.Equal(t, int64(i), msg.Headers["n"])
		require.Len(t, msg.Deaths, 1, "its death records come along")
		assert.Equal(t, "work", msg.Deaths[0].Queue)
	}
	dlq := m.Stats().Queues["dlq"]
	assert.Equal(t, 1, dlq.Depth, "one stays")
	assert.Equal(t, uint64(3), dlq.Replayed)
	n, err = m.ReplayDeadLetters("dlq", 10)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	recv(t, done, 1)
	stopWithin(t, m)
	st := m.Stats()
	assertLedger(t, "dlq", st.Queues["dlq"])
	assertLedger(t, "work", st.Queues["work"])
	assert.Equal(t, uint64(4), st.Queues["work"].Succeeded)
	assert.Equal(t, uint64(4), st.Queues["dlq"].Replayed)
}

func TestReplayLeavesWhatCannotMove(t *testing.T) {
	var broken atomic.Bool
	broken.Store(true)
	m, done := parked(t, &broken)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("dlx", "no death record"))
	require.NoError(t, m.Publish("jobs", 1, tinymq.WithRoutingKey("job")))
	require.NoError(t, m.Publish("jobs", 2, tinymq.WithRoutingKey("job")))
	require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == 3 }, wait, time.Millisecond)

	broken.Store(false)
	require.NoError(t, m.DeleteExchange("jobs")) // nowhere to go back to, for now
	n, err := m.ReplayDeadLetters("dlq", 10)
	assert.Zero(t, n)
	assert.ErrorIs(t, err, tinymq.ErrUnknownExchange, "the first dead letter cannot move")
	assert.ErrorIs(t, err, tinymq.ErrNoDeath, "and the message without a death record is reported")
	peeked, err := m.Peek("dlq", 10)
	require.NoError(t, err)
	require.Len(t, peeked, 3, "nothing moved, nothing lost")
	assert.Equal(t, "no death record", peeked[0].Data, "in their order")
	assert.Equal(t, 1, peeked[1].Data)

	require.NoError(t, m.DeclareExchange("jobs", tinymq.Direct))
	require.NoError(t, m.Bind("work", "jobs", tinymq.Direct, tinymq.WithBindingKey("job")))
	n, err = m.ReplayDeadLetters("dlq", 10)
	assert.Equal(t, 2, n, "past the message with no death record")
	assert.ErrorIs(t, err, tinymq.ErrNoDeath)
	recv(t, done, 2)
	peeked, err = m.Peek("dlq", 10)
	require.NoError(t, err)
	require.Len(t, peeked, 1)
	assert.Equal(t, "no death record", peeked[0].Data, "it stays where it is")
	stopWithin(t, m)
}

func TestReplayRefusesBadInput(t *testing.T) {
	m := tinymq.New(quiet())
	_, err := m.ReplayDeadLetters("nope", 1)
	assert.ErrorIs(t, err, tinymq.ErrUnknownQueue)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	_, err = m.ReplayDeadLetters("q", -1)
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	n, err := m.ReplayDeadLetters("q", 5)
	assert.NoError(t, err, "an empty queue has nothing to move")
	assert.Zero(t, n)
	m.Stop()
	_, err = m.ReplayDeadLetters("q", 1)
	assert.ErrorIs(t, err, tinymq.ErrStopped)
}

func TestReplayOfADurableDeadLetterIsOneMove(t *testing.T) {
	dir := t.TempDir()
	var broken atomic.Bool
	broken.Store(true)
	durable := func(m *tinymq.MQ) {
		require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.DeclareQueue("work", "jobs", tinymq.Direct, tinymq.WithDurable(), tinymq.WithBindingKey("job"),
			tinymq.WithDeadLetter("dlx", "")))
	}
	m := tinymq.New(quiet(), tinymq.WithDataDir(dir))
	durable(m)
	_, err := m.Consume("work", func(context.Context, *tinymq.Msg) error { return tinymq.Permanent(errors.New("bug")) }, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("jobs", 7, tinymq.WithRoutingKey("job")))
	require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == 1 }, wait, time.Millisecond)
	stopWithin(t, m)

	// After a restart, with no consumer on "work": the replay moves the
	// message from one durable queue to the other.
	m = tinymq.New(quiet(), tinymq.WithDataDir(dir))
	durable(m)
	n, err := m.ReplayDeadLetters("dlq", 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	stopWithin(t, m)

	m = tinymq.New(quiet(), tinymq.WithDataDir(dir))
	durable(m)
	st := m.Stats().Queues
	assert.Equal(t, 0, st["dlq"].Depth, "gone from the dead-letter queue")
	assert.Equal(t, 1, st["work"].Depth, "and in its queue again, once")
	got, err := m.Peek("work", 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Len(t, got[0].Deaths, 1)
	assert.Equal(t, tinymq.ReasonRejected, got[0].Deaths[0].Reason)
	stopWithin(t, m)
}

// A dead letter keeps its message group, and so does its replay: a queue
// with group ordering behind the dead-letter exchange, and the queue it is
// replayed to, keep each group's order.
func TestDeadLettersAndTheirReplayKeepTheMessageGroup(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprint("durable=", durable), func(t *testing.T) {
			var opts []tinymq.Option
			var qopts []tinymq.QueueOption
			if durable {
				opts = append(opts, tinymq.WithDataDir(t.TempDir()))
				qopts = append(qopts, tinymq.WithDurable())
			}
			var broken atomic.Bool
			broken.Store(true)
			m := tinymq.New(append(opts, quiet())...)
			done := make(chan *tinymq.Msg, 100)
			require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout, append(qopts, tinymq.WithGroupOrdering())...))
			require.NoError(t, m.RegisterQueue("jobs", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
				if broken.Load() {
					return tinymq.Permanent(errors.New("bug"))
				}
				done <- msg
				return nil
			}, 2, append(qopts, tinymq.WithQueueName("work"), tinymq.WithDeadLetter("dlx", ""), tinymq.WithGroupOrdering())...))
			require.NoError(t, m.Start(context.Background()))
			for i := range 6 {
				require.NoError(t, m.Publish("jobs", i, tinymq.WithMessageGroup(fmt.Sprint("g", i%2))))
			}
			require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == 6 }, wait, time.Millisecond)
			peeked, err := m.Peek("dlq", 10)
			require.NoError(t, err)
			require.Len(t, peeked, 6)
			for _, p := range peeked {
				assert.Equal(t, fmt.Sprint("g", dataInt(t, p.Data)%2), p.Group(), "a dead letter keeps its group")
			}

			broken.Store(false)
			n, err := m.ReplayDeadLetters("dlq", 6)
			require.NoError(t, err)
			require.Equal(t, 6, n)
			last := map[string]int{}
			for _, msg := range recv(t, done, 6) {
				i := dataInt(t, msg.Data)
				g := fmt.Sprint("g", i%2)
				assert.Equal(t, g, msg.Group(), "a replayed message keeps its group")
				if prev, ok := last[g]; ok {
					assert.Less(t, prev, i, "group %s in order", g)
				}
				last[g] = i
			}
			stopWithin(t, m)
		})
	}
}

// A replay is a publish: a typed queue refuses data of another type, and the
// message stays where it is.
func TestReplayToATypedQueueRefusesAnotherType(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout))
	require.NoError(t, m.DeclareQueue("work", "jobs", tinymq.Fanout, tinymq.WithDeadLetter("dlx", "")))
	sub, err := m.Consume("work", func(context.Context, *tinymq.Msg) error { return tinymq.Permanent(errors.New("bug")) }, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("jobs", "a string"))
	require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == 1 }, wait, time.Millisecond)
	require.NoError(t, sub.Cancel(context.Background()))

	got := make(chan int, 1)
	_, err = tinymq.ConsumeHandler(m, "work", func(_ context.Context, v int) error { got <- v; return nil }, 1)
	require.NoError(t, err)
	n, err := m.ReplayDeadLetters("dlq", 1)
	assert.Zero(t, n)
	require.ErrorIs(t, err, tinymq.ErrPayloadType)
	peeked, err := m.Peek("dlq", 1)
	require.NoError(t, err)
	require.Len(t, peeked, 1, "the message stays")
	assert.Equal(t, "a string", peeked[0].Data)
	stopWithin(t, m)
	assert.Empty(t, got)
}

// dataInt is a test payload as an int, in memory (int) or decoded from the
// log (an Encoded of JSON).
func dataInt(t *testing.T, data any) int {
	t.Helper()
	switch d := data.(type) {
	case int:
		return d
	case tinymq.Encoded:
		var v int
		require.NoError(t, d.Decode(&v))
		return v
	}
	t.Fatalf("payload %T", data)
	return 0
}
