package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

func TestConcurrencyNRunsNConsumersSideBySide(t *testing.T) {
	variants := []struct {
		name    string
		kind    tinymq.ExchangeType
		opts    []tinymq.QueueOption
		pub     []tinymq.PublishOption
		durable bool
		retry   bool
	}{
		{name: "plain", kind: tinymq.Fanout},
		{name: "keyed", kind: tinymq.Direct, opts: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"h": 1})}},
		{name: "durable", kind: tinymq.Fanout, durable: true},
		{name: "retried first", kind: tinymq.Fanout, retry: true,
			opts: []tinymq.QueueOption{tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})}},
	}
	for _, f := range consumerForms() {
		for _, v := range variants {
			for _, conc := range []int{2, 4} {
				for _, layout := range []string{"after", "sandwich"} {
					t.Run(fmt.Sprintf("%s/%s/conc%d/%s", f.name, v.name, conc, layout), func(t *testing.T) {
						var mopts []tinymq.Option
						opts := append([]tinymq.QueueOption{tinymq.WithQueueName("q")}, v.opts...)
						fast := 2000
						if v.durable {
							mopts = append(mopts, tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Millisecond))
							opts = append(opts, tinymq.WithDurable())
							fast = 500
						}
						m := tinymq.New(mopts...)
						bar := newBarrier(conc)
						var calls, seenN callCounts
						fastDone := make(chan struct{}, fast)
						require.NoError(t, f.register(m, "ev", v.kind, func(ctx context.Context, c formCall) error {
							seenN.inc(c.N)
							if c.N < fast {
								fastDone <- struct{}{}
								return nil
							}
							if v.retry && calls.inc(c.N) == 1 {
								return errors.New("first attempt")
							}
							return bar.arrive(ctx)
						}, conc, opts...))
						require.NoError(t, m.Start(context.Background()))
						defer stopWithin(t, m)
						// A long run of fast messages, then at once the ones
						// that need every worker at the same time ("after"), or
						// those in the middle of the run, a few apart, in what
						// one worker may take as a batch ("sandwich").
						var order []int
						if layout == "after" {
							for n := range fast + conc {
								order = append(order, n)
							}
						} else {
							next := 0
							for range fast / 2 {
								order = append(order, next)
								next++
							}
							for k := range conc {
								order = append(order, fast+k)
								for range 5 {
									order = append(order, next)
									next++
								}
							}
							for next < fast {
								order = append(order, next)
								next++
							}
						}
						for _, n := range order {
							require.NoError(t, m.Publish("ev", &numbered{N: n}, v.pub...))
						}
						recv(t, fastDone, fast)
						expectBarrier(t, bar, m, "q")
						stopWithin(t, m)
						s := m.Stats().Queues["q"]
						assert.Equal(t, uint64(fast+conc), s.Succeeded)
						assertLedger(t, "q", s)
						var twice, never []int
						for _, n := range order {
							want := 1
							if v.retry && n >= fast {
								want = 2
							}
							switch got := seenN.n[n]; {
							case got == 0:
								never = append(never, n)
							case got != want:
								twice = append(twice, n)
							}
						}
						assert.Empty(t, never, "messages never delivered")
						assert.Empty(t, twice, "messages delivered more often than they should")
					})
				}
			}
		}
		// A waits until B is being consumed; between them a long run of
		// fast messages that one worker may take in a batch with A.
		t.Run(f.name+"/A waits for B", func(t *testing.T) {
			m := tinymq.New()
			const fast = 300
			bStarted := make(chan struct{})
			result := make(chan error, 2)
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(ctx context.Context, c formCall) error {
				switch c.N {
				case -10:
					var err error
					select {
					case <-bStarted:
					case <-ctx.Done():
						err = ctx.Err()
					case <-time.After(5 * time.Second):
						err = errors.New("B never ran beside A")
					}
					result <- err
					return err
				case -20:
					close(bStarted)
					result <- nil
				}
				return nil
			}, 2, tinymq.WithQueueName("q")))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			require.NoError(t, m.Publish("ev", &numbered{N: -10}))
			for n := range fast {
				require.NoError(t, m.Publish("ev", &numbered{N: n}))
			}
			require.NoError(t, m.Publish("ev", &numbered{N: -20}))
			for _, err := range recv(t, result, 2) {
				assert.NoError(t, err)
			}
		})
	}
}

// With every worker idle after a long run of fast messages, messages that
// arrive one at a time, each published only once the previous one is in its
// consumer (or all at once from several goroutines), still reach every
// worker: N consumers run side by side.
func TestIdleWorkersWakeForMessagesThatArrive(t *testing.T) {
	for _, f := range consumerForms() {
		for _, durable := range []bool{false, true} {
			for _, conc := range []int{2, 4} {
				for _, pattern := range []string{"chain", "goroutines"} {
					t.Run(fmt.Sprintf("%s/durable=%v/conc%d/%s", f.name, durable, conc, pattern), func(t *testing.T) {
						var mopts []tinymq.Option
						opts := []tinymq.QueueOption{tinymq.WithQueueName("q")}
						fast := 2000
						if durable {
							mopts = append(mopts, tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Millisecond))
							opts = append(opts, tinymq.WithDurable())
							fast = 300
						}
						m := tinymq.New(mopts...)
						bar := newBarrier(conc)
						entered := make(chan struct{}, conc)
						fastDone := make(chan struct{}, fast)
						require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(ctx context.Context, c formCall) error {
							if c.N < fast {
								fastDone <- struct{}{}
								return nil
							}
							entered <- struct{}{}
							return bar.arrive(ctx)
						}, conc, opts...))
						require.NoError(t, m.Start(context.Background()))
						defer stopWithin(t, m)
						for n := range fast {
							require.NoError(t, m.Publish("ev", &numbered{N: n}))
						}
						recv(t, fastDone, fast)
						if pattern == "chain" {
							for k := range conc {
								require.NoError(t, m.Publish("ev", &numbered{N: fast + k}))
								recv(t, entered, 1)
							}
						} else {
							var wg sync.WaitGroup
							for k := range conc {
								wg.Go(func() {
									if err := m.Publish("ev", &numbered{N: fast + k}); err != nil {
										t.Errorf("Publish: %v", err)
									}
								})
							}
							wg.Wait()
						}
						expectBarrier(t, bar, m, "q")
					})
				}
			}
		}
	}
}

// A minimal form of the "sandwich" failure of TestConcurrencyNRunsNConsumersSideBySide:
// four workers, a run of fast messages with four blocking messages a few
// apart in the middle. Once the fast ones are done, the four blocking ones
// must all be in consumers (README: "a worker with nothing to do takes the
// messages another worker has not begun"). Each run that finds one held
// back reports the queue's Stats at that moment.
func TestBlockedBatchIsTakenByIdleWorkers(t *testing.T) {
	for _, conc := range []int{2, 3, 4, 8} {
		t.Run(fmt.Sprintf("conc%d", conc), func(t *testing.T) { blockedBatch(t, conc) })
	}
}

func blockedBatch(t *testing.T, conc int) {
	const fast = 2000
	deadline := time.Now().Add(4 * time.Second)
	for run := 0; run < 40 && time.Now().Before(deadline); run++ {
		m := tinymq.New()
		release := make(chan struct{})
		inside := make(chan int, conc)
		fastDone := make(chan struct{}, fast)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			n := msg.Data.(*numbered).N
			if n < fast {
				fastDone <- struct{}{}
				return nil
			}
			inside <- n
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}, conc, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		next := 0
		pub := func(n int) { require.NoError(t, m.Publish("ev", &numbered{N: n})) }
		for range fast / 2 {
			pub(next)
			next++
		}
		for k := range conc {
			pub(fast + k)
			for range 5 {
				pub(next)
				next++
			}
		}
		for next < fast {
			pub(next)
			next++
		}
		// Progress is possible until all four blocking messages are in
		// consumers; give it a second.
		var in []int
		done := 0
		timeout := time.After(time.Second)
	collect:
		for len(in) < conc {
			select {
			case n := <-inside:
				in = append(in, n)
			case <-fastDone:
				done++
			case <-timeout:
				break collect
			}
		}
		if len(in) < conc {
			s := m.Stats().Queues["q"]
			t.Errorf("run %d: after 1s only %v of the %d blocking messages are in consumers, %d fast ones done; "+
				"Stats: Depth %d Ready %d InFlight %d Delivered %d Succeeded %d", run, in, conc, done,
				s.Depth, s.Ready, s.InFlight, s.Delivered, s.Succeeded)
		}
		close(release)
		recv(t, inside, conc-len(in))
		recv(t, fastDone, fast-done)
		stopWithin(t, m)
		if t.Failed() {
			return
		}
	}
}

// A *PanicError returned inside an error chain is still found: its stack is
// logged with the failure.
// A worker keeps no message it has consumed alive: while the last message
// of its batch is in a long call, the ones before it can be collected.
func TestALongCallKeepsNoConsumedMessageAlive(t *testing.T) {
	type payload struct {
		last bool
		_    [256]byte
	}
	var freed atomic.Int64
	inside, release := make(chan struct{}, 1), make(chan struct{})
	m := tinymq.New(quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if msg.Data.(*payload).last {
			inside <- struct{}{}
			<-release
		}
		return nil
	}, 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	defer close(release)
	require.NoError(t, m.PauseQueue("q")) // so that the worker takes them as one batch
	const n = 64
	for i := range n {
		p := &payload{last: i == n-1}
		runtime.AddCleanup(p, func(*atomic.Int64) { freed.Add(1) }, &freed)
		require.NoError(t, m.Publish("ev", p))
	}
	require.NoError(t, m.ResumeQueue("q"))
	select {
	case <-inside:
	case <-time.After(settleWait):
		t.Fatal("the last message was not delivered")
	}
	for deadline := time.Now().Add(settleWait); freed.Load() < n-1 && time.Now().Before(deadline); {
		runtime.GC()
		time.Sleep(time.Millisecond) // a cleanup runs on a goroutine of its own after the GC
	}
	assert.Equal(t, int64(n-1), freed.Load(), "payloads consumed before the long call, collected while it runs")
}

func TestPanicErrorInAnErrorChainIsLoggedWithItsStack(t *testing.T) {
	for name, wrap := range map[string]func(error) error{
		"%w":     func(e error) error { return fmt.Errorf("ctx: %w", e) },
		"joined": func(e error) error { return errors.Join(errors.New("x"), e) },
		"multi":  func(e error) error { return multiErr{errors.New("x"), fmt.Errorf("y: %w", e)} },
	} {
		t.Run(name, func(t *testing.T) {
			logger, records := logRecords()
			m := tinymq.New(tinymq.WithLogger(logger))
			var calls atomic.Int32
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				calls.Add(1)
				return wrap(&tinymq.PanicError{Value: "boom", Stack: []byte("R2STACKMARK")})
			}, 1, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1})))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", 1))
			waitSettled(t, m, "q", 1)
			stopWithin(t, m)
			found := false
			for _, r := range records(t) {
				if s, ok := r["stack"].(string); ok && strings.Contains(s, "R2STACKMARK") {
					found = true
				}
			}
			assert.True(t, found, "the *PanicError's stack was not logged")
		})
	}
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

// Parked workers wake for every message that arrives, however the queue's
// topology changed while they parked or were about to: a pause and resume, a
// subscription that comes and goes, each of which wakes every parked worker
// at once. A wake counted for a worker that was in fact awake would leave
// the next message waiting with every worker parked.
func TestParkedWorkersWakeAfterEveryTopologyChange(t *testing.T) {
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	m := tinymq.New(quiet())
	var delivered atomic.Int64
	count := func(context.Context, *tinymq.Msg) error {
		delivered.Add(1)
		return nil
	}
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	_, err := m.Consume("q", count, 2)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)

	published := int64(0)
	publish := func(n int) {
		for range n {
			require.NoError(t, m.Publish("ev", published))
			published++
		}
	}
	settled := func(round int, what string) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for delivered.Load() != published {
			if time.Now().After(deadline) {
				t.Fatalf("round %d, after %s: %d of %d messages delivered, the rest wait with the workers parked: %+v",
					round, what, delivered.Load(), published, m.Stats().Queues["q"])
			}
			time.Sleep(50 * time.Microsecond) // polling a count, bounded by the deadline
		}
	}
	var extra *tinymq.Subscription
	for round := range rounds {
		publish(8) // the workers are busy, and park as they run out
		var what string
		switch round % 4 {
		case 0:
			what = "a pause and resume"
			require.NoError(t, m.PauseQueue("q"))
			require.NoError(t, m.ResumeQueue("q"))
		case 1:
			what = "a subscription that came while messages waited"
			extra, err = m.Consume("q", count, 2)
			require.NoError(t, err)
		case 2:
			what = "a subscription that went"
			require.NoError(t, extra.Cancel(context.Background()))
		case 3:
			what = "a purge"
			n, err := m.PurgeQueue("q")
			require.NoError(t, err)
			published -= int64(n)
		}
		publish(3) // while the workers may still be busy: a wake for none of them
		settled(round, what)
		publish(1) // to workers that are all parked
		settled(round, what+" and a single message")
	}
}
