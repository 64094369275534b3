package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

func TestStatsAreExactUnderConcurrentLoad(t *testing.T) {
	const pubs, per = 4, 250
	for _, f := range consumerForms() {
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			dead := hDeadQueue(t, m, pubs*per)
			var okCount atomic.Int64
			fn := flaky(&okCount, true)
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, fn, 8, tinymq.WithQueueName("q"),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
				tinymq.WithDeadLetter("dlx", "")))
			require.NoError(t, m.Start(context.Background()))
			publishAll(t, m, pubs, per)
			var want hCounts
			var deadN int
			for n := range pubs * per {
				switch {
				case n%5 == 0:
					want.Delivered += 2
					want.Failed += 2
					want.Retried++
					want.DeadLettered++
					deadN++
				case n%7 == 0 || n%11 == 0 || n%13 == 0:
					want.Delivered += 2
					want.Failed++
					want.Retried++
					want.Succeeded++
				default:
					want.Delivered++
					want.Succeeded++
				}
			}
			recv(t, dead, deadN)
			stopWithin(t, m)
			st := m.Stats()
			s := st.Queues["q"]
			assert.Equal(t, want, hCountsOf(s))
			assert.Equal(t, uint64(pubs*per), s.Accepted)
			assert.Equal(t, uint64(pubs*per), st.Exchanges["ev"].Published)
			assert.Equal(t, int64(want.Succeeded), okCount.Load())
			assertLedger(t, "q", s)
			assert.Equal(t, uint64(deadN), st.Queues["dead"].Accepted)
			assertLedger(t, "dead", st.Queues["dead"])
		})
	}
}

// With every worker blocked, right after a long run of fast messages, the
// counters are exact: InFlight = concurrency, Depth = Ready = the rest.
// Then a Shutdown deadline: the error says how many waited and how many
// were in a consumer, and the ledger balances.
func TestStatsWhileEveryWorkerIsBlocked(t *testing.T) {
	const conc, fast, slow = 4, 3000, 50
	for _, f := range consumerForms() {
		for _, end := range []string{"release", "shutdown"} {
			t.Run(f.name+"/"+end, func(t *testing.T) {
				m := tinymq.New()
				fastDone := make(chan struct{}, fast)
				entered := make(chan struct{}, slow)
				gate := make(chan struct{})
				require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(ctx context.Context, c formCall) error {
					if c.N < fast {
						fastDone <- struct{}{}
						return nil
					}
					entered <- struct{}{}
					select {
					case <-gate:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(wait):
						return errors.New("gate never opened")
					}
				}, conc, tinymq.WithQueueName("q")))
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				for n := range fast {
					require.NoError(t, m.Publish("ev", &numbered{N: n}))
				}
				recv(t, fastDone, fast)
				for n := range slow {
					require.NoError(t, m.Publish("ev", &numbered{N: fast + n}))
				}
				recv(t, entered, conc)
				s := m.Stats().Queues["q"]
				assert.Equal(t, conc, s.InFlight, "InFlight with every worker in the consumer")
				assert.Equal(t, slow-conc, s.Depth, "Depth")
				assert.Equal(t, slow-conc, s.Ready, "Ready")
				assert.Equal(t, uint64(fast+conc), s.Delivered)
				assert.Equal(t, uint64(fast), s.Succeeded)
				assert.Equal(t, uint64(fast+slow), s.Accepted)
				if end == "release" {
					close(gate)
					recv(t, entered, slow-conc)
					stopWithin(t, m)
					s = m.Stats().Queues["q"]
					assert.Equal(t, hCounts{Delivered: fast + slow, Succeeded: fast + slow}, hCountsOf(s))
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
					err := m.Shutdown(ctx)
					cancel()
					require.ErrorIs(t, err, tinymq.ErrUndelivered)
					require.ErrorIs(t, err, context.DeadlineExceeded)
					assert.Contains(t, err.Error(), fmt.Sprint(slow-conc), "how many never reached a consumer")
					assert.Contains(t, err.Error(), fmt.Sprint(conc), "how many were in one")
					stopWithin(t, m)
					s = m.Stats().Queues["q"]
					assert.Equal(t, uint64(slow-conc), s.Undelivered)
					assert.Equal(t, uint64(fast), s.Succeeded)
					assert.Equal(t, uint64(fast+conc), s.Delivered)
				}
				assertLedger(t, "q", s)
			})
		}
	}
}

// Stats snapshots taken while four workers consume, fail, panic, Goexit and
// retry under two publishers: counters only grow, InFlight stays within the
// worker count, Depth is Ready plus Scheduled, and every accepted message is
// counted once (ended, waiting or in a consumer).
func TestStatsSnapshotsStayConsistentWhileMessagesMove(t *testing.T) {
	const conc, pubs, per = 4, 2, 1000
	for _, f := range consumerForms() {
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			var ok atomic.Int64
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, flaky(&ok, false), conc, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			stopPoll := make(chan struct{})
			pollDone := make(chan []string)
			var polls, unbalanced int
			var examples []string
			go func() {
				var problems []string
				var prev tinymq.QueueStats
				add := func(format string, args ...any) {
					if len(problems) < 10 {
						problems = append(problems, fmt.Sprintf(format, args...))
					}
				}
				for {
					select {
					case <-stopPoll:
						pollDone <- problems
						return
					default:
					}
					s := m.Stats().Queues["q"]
					if s.InFlight < 0 || s.InFlight > conc {
						add("InFlight %d", s.InFlight)
					}
					if s.Depth != s.Ready+s.Scheduled || s.Depth < 0 {
						add("Depth %d Ready %d Scheduled %d", s.Depth, s.Ready, s.Scheduled)
					}
					if s.Accepted < prev.Accepted || s.Delivered < prev.Delivered || s.Succeeded < prev.Succeeded ||
						s.Failed < prev.Failed || s.Retried < prev.Retried || s.Dropped < prev.Dropped {
						add("a counter went down: %+v after %+v", hCountsOf(s), hCountsOf(prev))
					}
					if s.Succeeded+s.Failed > s.Delivered {
						add("Succeeded %d + Failed %d > Delivered %d", s.Succeeded, s.Failed, s.Delivered)
					}
					ended := s.Succeeded + s.DeadLettered + s.Dropped + s.Undelivered
					if ended+uint64(s.Depth)+uint64(s.InFlight) != s.Accepted {
						unbalanced++
						if len(examples) < 3 {
							examples = append(examples, fmt.Sprintf("Accepted %d != ended %d + Depth %d + InFlight %d",
								s.Accepted, ended, s.Depth, s.InFlight))
						}
					}
					polls++
					prev = s
				}
			}()
			publishAll(t, m, pubs, per)
			stopWithin(t, m)
			close(stopPoll)
			var problems []string
			select {
			case problems = <-pollDone:
			case <-time.After(wait):
				t.Fatal("poller stuck")
			}
			assert.Empty(t, problems, "inconsistent snapshots")
			// QueueStats: the sums hold exactly once the queue is idle; while it
			// is busy they may be off by the messages that moved during the read.
			t.Logf("%d of %d busy snapshots off, e.g. %v", unbalanced, polls, examples)
			s := m.Stats().Queues["q"]
			assert.Equal(t, uint64(pubs*per), s.Accepted)
			assert.Equal(t, uint64(ok.Load()), s.Succeeded)
			assertLedger(t, "q", s)
		})
	}
}

// InFlight is "how many messages are in the consumer now": never more than
// the queue's workers, in any snapshot, also while consumers call
// runtime.Goexit and workers are replaced.
func TestInFlightNeverExceedsConcurrency(t *testing.T) {
	const conc = 4
	deadline := time.Now().Add(3 * time.Second)
	var polls, worst int
	var example string
	for run := 0; run < 400 && time.Now().Before(deadline) && example == ""; run++ {
		m := tinymq.New()
		require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[int]) error {
			if d.Data%5 == 0 && d.Attempt == 1 {
				runtime.Goexit()
			}
			return nil
		}, conc, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
		require.NoError(t, m.Start(context.Background()))
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				s := m.Stats().Queues["q"]
				polls++
				if s.InFlight > conc && s.InFlight > worst {
					worst = s.InFlight
					example = fmt.Sprintf("InFlight %d with %d workers: %+v", s.InFlight, conc, s)
				}
			}
		}()
		var wg sync.WaitGroup
		for p := range 2 {
			wg.Go(func() {
				for i := range 2000 {
					if err := m.Publish("ev", p*2000+i); err != nil {
						t.Errorf("Publish: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		stopWithin(t, m)
		close(stop)
		closedWithin(t, done, "the poller")
		assertLedger(t, "q", m.Stats().Queues["q"])
	}
	assert.Empty(t, example, "after %d snapshots", polls)
}

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

// ConsumerTime times every call of a queue that is not busy: each message
// is alone in the queue when its worker takes it.
func TestConsumerTimeTimesEveryCallOfAQueueThatIsNotBusy(t *testing.T) {
	for _, form := range []string{"msg", "handler"} {
		t.Run(form, func(t *testing.T) {
			const n = 40
			done := make(chan struct{})
			m := tinymq.New(quiet())
			if form == "msg" {
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
					done <- struct{}{}
					return nil
				}, 1, tinymq.WithQueueName("q")))
			} else {
				require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, []byte) error {
					done <- struct{}{}
					return nil
				}, 1, tinymq.WithQueueName("q")))
			}
			require.NoError(t, m.Start(context.Background()))
			defer m.Stop()
			for range n {
				require.NoError(t, m.Publish("ev", []byte("x")))
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("the message was not delivered within 10s")
				}
			}
			m.Stop()
			assert.Equal(t, uint64(n), m.Stats().Queues["q"].ConsumerTime.Samples,
				"each of the %d messages found the queue idle, so each call is timed", n)
		})
	}
}

// QueueStats.Abandoned is bounded per subscription, each at most as many
// abandoned calls as it has workers; a cancelled subscription's abandoned
// calls stay counted until they return, so that the queue's count may
// exceed the concurrency it has now.
func TestAbandonedIsBoundedPerSubscription(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		release := make(chan struct{})
		hold := func(context.Context, *tinymq.Msg) error { <-release; return nil } // ignores ctx
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDeliveryTimeout(d)))
		sub1, err := m.Consume("q", hold, 2)
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		require.NoError(t, m.Publish("ev", 2))
		time.Sleep(d + d/2)
		synctest.Wait()
		require.Equal(t, 2, m.Stats().Queues["q"].Abandoned, "both of sub1's workers abandoned a call")
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		assert.ErrorIs(t, sub1.Cancel(ctx), context.DeadlineExceeded, "Cancel waits for the abandoned calls")
		cancel()
		assert.Equal(t, 2, m.Stats().Queues["q"].Abandoned, "the cancelled subscription's calls stay counted")

		_, err = m.Consume("q", hold, 1)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", 3))
		time.Sleep(d + d/2)
		synctest.Wait()
		require.NoError(t, m.Publish("ev", 4)) // past the new subscription's bound: its worker waits
		time.Sleep(d + d/2)
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(4), st.TimedOut)
		assert.Equal(t, 3, st.Abandoned, "two of the cancelled subscription's, one of the new one's")
		info, ok := queueInfo(m.Topology(), "q")
		require.True(t, ok)
		assert.Equal(t, 1, info.Concurrency, "the queue's concurrency now")

		close(release)
		synctest.Wait()
		assert.Zero(t, m.Stats().Queues["q"].Abandoned)
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// clockSlack is how much older than the truth OldestAge may say a message is
// (the MQ's coarse clock ticks every 10 ms); in a synctest bubble the tick
// is exact, so the slack is one tick.
const clockSlack = 10 * time.Millisecond

func TestOldestAgeIsHowLongTheOldestReadyMessageWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		synctest.Wait() // the scheduler, which keeps the clock, runs
		age := func() time.Duration { return m.Stats().Queues["q"].OldestAge }
		assert.Zero(t, age(), "nothing waits")

		require.NoError(t, m.Publish("ev", "a"))
		time.Sleep(500 * time.Millisecond) // the clock ticks meanwhile
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(3 * time.Second) // the clock stops ticking after a second
		require.NoError(t, m.Publish("ev", "c"))
		time.Sleep(2 * time.Second)
		got := age()
		assert.GreaterOrEqual(t, got, 5500*time.Millisecond, "a waited 5.5s")
		assert.LessOrEqual(t, got, 5500*time.Millisecond+clockSlack)

		// One worker takes a and b in one batch: a is in the consumer, b
		// waits in the batch, c in the queue.
		release := make(chan struct{})
		sub := consumeHoldingA(t, m, release)
		synctest.Wait()
		require.Equal(t, 1, m.Stats().Queues["q"].InFlight)
		got = age()
		assert.GreaterOrEqual(t, got, 5*time.Second, "b waited 5s (a is in the consumer, not ready)")
		assert.LessOrEqual(t, got, 5*time.Second+clockSlack)

		close(release)
		synctest.Wait()
		assert.Zero(t, age(), "drained")
		require.NoError(t, sub.Cancel(context.Background()))

		// A message published after the clock stopped is stamped exactly.
		time.Sleep(5 * time.Second)
		require.NoError(t, m.Publish("ev", "d"))
		time.Sleep(1234 * time.Millisecond)
		got = age()
		assert.GreaterOrEqual(t, got, 1234*time.Millisecond)
		assert.LessOrEqual(t, got, 1234*time.Millisecond+clockSlack)
	})
}

func TestOldestAgeCountsFromTheEndOfARetryBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		var calls atomic.Int32
		hold := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			switch calls.Add(1) {
			case 1:
				return errors.New("fail once")
			case 2:
				<-hold // the retry; "b" waits behind it
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Second})))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "a"))
		synctest.Wait()
		qs := m.Stats().Queues["q"]
		require.Equal(t, 1, qs.Scheduled)
		assert.Zero(t, qs.OldestAge, "a retry backing off is not ready")

		time.Sleep(10 * time.Second) // a is back, in the consumer
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "b"))
		time.Sleep(3 * time.Second)
		got := m.Stats().Queues["q"].OldestAge
		assert.GreaterOrEqual(t, got, 3*time.Second, "b, not the retried a that the consumer holds")
		assert.LessOrEqual(t, got, 3*time.Second+clockSlack)
		close(hold)
	})
}

func TestOldestAgeSeesGroupBacklogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		hold := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			if msg.Data == "g1" {
				<-hold
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "g1", tinymq.WithMessageGroup("g")))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "g2", tinymq.WithMessageGroup("g")))
		time.Sleep(4 * time.Second)
		require.NoError(t, m.Publish("ev", "other")) // delivered at once by the free worker
		synctest.Wait()
		qs := m.Stats().Queues["q"]
		require.Equal(t, 1, qs.Ready, "g2 waits behind g1")
		assert.GreaterOrEqual(t, qs.OldestAge, 4*time.Second)
		assert.LessOrEqual(t, qs.OldestAge, 4*time.Second+clockSlack)
		close(hold)
		synctest.Wait()
		assert.Zero(t, m.Stats().Queues["q"].OldestAge)
	})
}

func TestOldestAgeOfARestoredMessageCountsFromBeforeTheRestart(t *testing.T) {
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
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		got := m.Stats().Queues["q"].OldestAge
		assert.GreaterOrEqual(t, got, 5*time.Second, "published 5s ago, before the restart")
		assert.LessOrEqual(t, got, 5*time.Second+clockSlack)
	})
}
