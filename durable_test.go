package tinymq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/wal"
)

type order struct {
	ID    int
	Items []string
}

// A durable queue's messages that no consumer acknowledged are delivered
// after a restart, with Redelivered set, and a Handler gets the same T.
//
// Publishes that returned nil survive: Stop before Start, and a Shutdown
// deadline with messages queued and in a consumer; after a restart every one
// of them is delivered, with Redelivered, and nothing acknowledged comes back.
func TestDurableMessagesSurviveARestart(t *testing.T) {
	t.Run("delivered again", func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("orders", tinymq.Fanout, failing, 1,
			tinymq.WithQueueName("billing"), tinymq.WithDurable()))
		for i := range 5 {
			require.NoError(t, m.Publish("orders", order{ID: i, Items: []string{"book"}}, tinymq.WithHeaders(map[string]any{"n": int32(i)})))
		}
		// Stopped before Start: nothing was delivered, everything is on disk.
		require.ErrorIs(t, m.Shutdown(context.Background()), tinymq.ErrUndelivered)

		got := make(chan order, 10)
		var mu sync.Mutex
		var msgs []*tinymq.Msg
		m = tinymq.New(tinymq.WithDataDir(dir))
		h := tinymq.Handler(func(_ context.Context, o order) error {
			got <- o
			return nil
		})
		require.NoError(t, m.RegisterQueue("orders", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			msgs = append(msgs, msg)
			mu.Unlock()
			return h(ctx, msg)
		}, 1, tinymq.WithQueueName("billing"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		for i, o := range recv(t, got, 5) {
			assert.Equal(t, order{ID: i, Items: []string{"book"}}, o, "in publish order, the same T")
		}
		m.Stop()
		for i, msg := range msgs {
			assert.True(t, msg.Redelivered)
			assert.Equal(t, uint64(i+1), msg.ID)
			assert.Equal(t, int32(i), msg.Headers["n"], "headers keep their Go types")
			assert.IsType(t, tinymq.Encoded{}, msg.Data)
		}

		// All acknowledged: a third run gets nothing.
		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("orders", tinymq.Fanout, failing, 1, tinymq.WithQueueName("billing"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		assert.Zero(t, m.Stats().Queues["billing"].Depth)
		require.NoError(t, m.Publish("orders", order{ID: 9}))
		m.Stop()
		assert.Equal(t, uint64(1), m.Stats().Exchanges["orders"].Published, "counts this run's")
	})
	t.Run("every accepted publish", func(t *testing.T) {
		for _, how := range []string{"stop before start", "shutdown deadline"} {
			t.Run(how, func(t *testing.T) {
				dir := t.TempDir()
				f := consumerForms()[3]
				m := tinymq.New(tinymq.WithDataDir(dir))
				acked := make(chan int, 100)
				entered := make(chan struct{}, 100)
				registerDurable(t, m, f, "ev", "q", func(ctx context.Context, c formCall) error {
					if c.N < 10 {
						acked <- c.N
						return nil
					}
					entered <- struct{}{}
					<-ctx.Done()
					return ctx.Err()
				})
				if how == "shutdown deadline" {
					require.NoError(t, m.Start(context.Background()))
				}
				for n := range 30 {
					require.NoError(t, m.Publish("ev", &numbered{N: n}))
				}
				if how == "stop before start" {
					stopWithin(t, m)
				} else {
					recv(t, acked, 10)
					recv(t, entered, 1)
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
					require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
					cancel()
					stopWithin(t, m)
				}

				m = tinymq.New(tinymq.WithDataDir(dir))
				got := make(chan formCall, 100)
				registerDurable(t, m, f, "ev", "q", func(_ context.Context, c formCall) error {
					got <- c
					return nil
				})
				require.NoError(t, m.Start(context.Background()))
				require.NoError(t, m.Publish("ev", &numbered{N: 1000}))
				first := 0
				if how == "shutdown deadline" {
					first = 10
				}
				var ns []int
				for _, c := range recv(t, got, 30-first+1) {
					ns = append(ns, c.N)
					assert.Equal(t, c.N != 1000, c.Redelivered, "message %d", c.N)
				}
				want := []int{}
				for n := first; n < 30; n++ {
					want = append(want, n)
				}
				want = append(want, 1000)
				assert.Equal(t, want, ns, "unacknowledged messages, in order, then the new one")
				stopWithin(t, m)
				assert.Zero(t, m.Stats().Queues["q"].Depth)
			})
		}
	})
}

// A consumer of a durable queue gets Data as an Encoded before a restart
// too: what it receives cannot depend on a crash. In-memory queues of the
// same publish get the value itself.
func TestDurableDataIsEncodedEveryTime(t *testing.T) {
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()))
	durable := make(chan *tinymq.Msg, 1)
	memory := make(chan *tinymq.Msg, 1)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(durable), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(memory), 1, tinymq.WithQueueName("m")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", order{ID: 1}))
	d, mem := recv(t, durable, 1)[0], recv(t, memory, 1)[0]
	m.Stop()
	assert.Equal(t, order{ID: 1}, mem.Data)
	var o order
	require.NoError(t, d.Data.(tinymq.Encoded).Decode(&o))
	assert.Equal(t, order{ID: 1}, o)
	assert.False(t, d.Redelivered)
	assert.Equal(t, mem.ID, d.ID)
}

// Acknowledged messages are not delivered again; unacknowledged ones are.
//
// Two durable queues get the same messages; one acknowledges, the other does
// not (blocked until the Shutdown deadline) or drops them (failure without
// retry or dead-letter exchange: acknowledged). After a restart only the
// unacknowledged ones come back, to their queue only.
//
// A message routed to two durable queues comes back only to the queue that
// had not acknowledged it, after a restart, in publish order; once both have,
// a third start finds nothing.
func TestOnlyUnacknowledgedMessagesComeBack(t *testing.T) {
	t.Run("one queue", func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			var n int
			require.NoError(t, msg.Data.(tinymq.Encoded).Decode(&n))
			if n < 5 {
				return nil
			}
			<-ctx.Done() // stuck until Shutdown's deadline
			return ctx.Err()
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()

		got := make(chan int, 10)
		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, n int) error {
			got <- n
			return nil
		}), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		// Message 5 failed when the deadline cancelled its context: a durable
		// message stays in the log then, as a broker requeues it.
		assert.Equal(t, []int{5, 6, 7, 8, 9}, recv(t, got, 5))
		m.Stop()
	})
	t.Run("only the queue that did not acknowledge", func(t *testing.T) {
		for _, bMode := range []string{"blocked", "dropped"} {
			for _, keyed := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/keyed=%v", bMode, keyed), func(t *testing.T) {
					dir := t.TempDir()
					kind := tinymq.Fanout
					var bind []tinymq.QueueOption
					var pub []tinymq.PublishOption
					if keyed {
						kind = tinymq.Direct
						bind = []tinymq.QueueOption{tinymq.WithBindingKey("k")}
						pub = []tinymq.PublishOption{tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"h": "v"})}
					}
					reg := func(m *tinymq.MQ, name string, fn tinymq.ConsumerFunc) {
						opts := append([]tinymq.QueueOption{tinymq.WithQueueName(name), tinymq.WithDurable()}, bind...)
						require.NoError(t, m.RegisterQueue("ev", kind, fn, 1, opts...))
					}
					const n = 20
					m := tinymq.New(tinymq.WithDataDir(dir))
					aDone := make(chan struct{}, n)
					bIn := make(chan struct{}, n)
					reg(m, "a", func(context.Context, *tinymq.Msg) error {
						aDone <- struct{}{}
						return nil
					})
					reg(m, "b", func(ctx context.Context, _ *tinymq.Msg) error {
						bIn <- struct{}{}
						if bMode == "dropped" {
							return errors.New("no")
						}
						<-ctx.Done()
						return ctx.Err()
					})
					require.NoError(t, m.Start(context.Background()))
					for i := range n {
						require.NoError(t, m.Publish("ev", &numbered{N: i}, pub...))
					}
					recv(t, aDone, n)
					if bMode == "dropped" {
						recv(t, bIn, n)
						stopWithin(t, m)
						assert.Equal(t, uint64(n), m.Stats().Queues["b"].Dropped)
					} else {
						recv(t, bIn, 1)
						ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
						require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
						cancel()
						stopWithin(t, m)
					}

					for run := range 2 {
						m = tinymq.New(tinymq.WithDataDir(dir))
						ga := make(chan *tinymq.Msg, n+1)
						gb := make(chan *tinymq.Msg, n+1)
						reg(m, "a", sink(ga))
						reg(m, "b", sink(gb))
						require.NoError(t, m.Start(context.Background()))
						require.NoError(t, m.Publish("ev", &numbered{N: 1000 + run}, pub...))
						gotA, _ := numberOf(recv(t, ga, 1)[0].Data)
						assert.Equal(t, 1000+run, gotA, "run %d: queue a redelivered an acknowledged message", run)
						want := 0
						if bMode == "blocked" && run == 0 {
							want = n
						}
						for i, msg := range recv(t, gb, want+1) {
							got, _ := numberOf(msg.Data)
							if i < want {
								assert.Equal(t, i, got)
								assert.True(t, msg.Redelivered)
								if keyed {
									assert.Equal(t, "k", msg.RoutingKey)
									assert.Equal(t, "v", msg.Headers["h"])
								}
							} else {
								assert.Equal(t, 1000+run, got, "run %d: queue b redelivered something it should not", run)
							}
						}
						stopWithin(t, m)
						st := m.Stats()
						assert.Zero(t, st.Queues["a"].Depth)
						assert.Zero(t, st.Queues["b"].Depth)
					}
				})
			}
		}
	})
	t.Run("acknowledgements of a shared message", func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		fast := make(chan int, 10)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, n int) error {
			fast <- n
			return nil
		}), 1, tinymq.WithQueueName("fast"), tinymq.WithDurable()))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			<-ctx.Done() // stuck until Shutdown's deadline
			return ctx.Err()
		}, 1, tinymq.WithQueueName("slow"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		for i := range 6 {
			require.NoError(t, m.Publish("ev", i))
		}
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, recv(t, fast, 6))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()

		for range 2 { // the second restart finds what the first one acknowledged gone
			m = tinymq.New(tinymq.WithDataDir(dir))
			got := make(chan int, 10)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				t.Error("fast had acknowledged every message")
				return nil
			}, 1, tinymq.WithQueueName("fast"), tinymq.WithDurable()))
			slow := m.Stats().Queues["slow"]
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, n int) error {
				got <- n
				return nil
			}), 1, tinymq.WithQueueName("slow"), tinymq.WithDurable()))
			require.Zero(t, m.Stats().Queues["fast"].Depth, "fast acknowledged everything")
			if slow.Depth == 0 {
				m.Stop()
				return
			}
			require.NoError(t, m.Start(context.Background()))
			assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, recv(t, got, 6), "slow gets all six, in publish order")
			m.Stop()
		}
		t.Fatal("slow's messages came back after it acknowledged them")
	})
}

func TestDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	a := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, a.Start(context.Background()))
	b := tinymq.New(tinymq.WithDataDir(dir))
	assert.ErrorIs(t, b.Start(context.Background()), tinymq.ErrLocked)
	assert.ErrorIs(t, b.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()), tinymq.ErrLocked)
	b.Stop()
	a.Stop()
	c := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, c.Start(context.Background()), "Stop releases the directory")
	c.Stop()
}

// A refused open changes nothing: the MQ that was refused does not hold the
// directory, declared neither the exchange nor the queue, stays startable
// after a refused Start, and its retry succeeds once the owner has stopped
// (it used to return the first ErrLocked forever while holding the lock).
func TestRefusedOpenKeepsNothingAndARetrySucceeds(t *testing.T) {
	dir := t.TempDir()
	a := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, a.Start(context.Background()))
	b := tinymq.New(tinymq.WithDataDir(dir))
	durable := []tinymq.QueueOption{tinymq.WithQueueName("q"), tinymq.WithDurable()}
	err := b.RegisterQueue("ev", tinymq.Fanout, failing, 1, durable...)
	require.ErrorIs(t, err, tinymq.ErrLocked)
	assert.Contains(t, err.Error(), fmt.Sprint(os.Getpid()), "the error names the holder")
	require.ErrorIs(t, b.RegisterQueue("ev", tinymq.Fanout, failing, 1, durable...), tinymq.ErrLocked, "still held")
	assert.Empty(t, b.Topology().Exchanges, "a refused register declared its exchange")
	assert.Empty(t, b.Topology().Queues, "a refused register added its queue")
	assert.Empty(t, b.Stats().Queues)
	require.ErrorIs(t, b.Start(context.Background()), tinymq.ErrLocked, "Start opens the log too")
	a.Stop()

	got := make(chan *tinymq.Msg, 1)
	require.NoError(t, b.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, durable...), "the retry succeeds once the owner stopped")
	require.NoError(t, b.Start(context.Background()), "a refused Start leaves the MQ startable")
	require.NoError(t, b.Publish("ev", "x"))
	recv(t, got, 1)
	c := tinymq.New(tinymq.WithDataDir(dir))
	require.ErrorIs(t, c.Start(context.Background()), tinymq.ErrLocked, "b holds the directory now")
	b.Stop()
	require.NoError(t, c.Start(context.Background()), "and only until it stops")
	c.Stop()
}

// A durable publish does not hold the MQ's lock across its fdatasync: while
// one waits for its sync, RegisterQueue and other publishes go on, and a Stop
// begun meanwhile waits for the publish, whose message is then delivered.
func TestDurablePublishHoldsNoLockAcrossItsSync(t *testing.T) {
	var armed atomic.Bool
	inSync, release := make(chan struct{}, 1), make(chan struct{})
	restore := tinymq.SetWALFaults(&wal.Faults{SyncErr: func(string) error {
		if armed.CompareAndSwap(true, false) {
			inSync <- struct{}{}
			<-release
		}
		return nil
	}})
	defer restore()
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()))
	got := make(chan *tinymq.Msg, 1)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
	mem := make(chan *tinymq.Msg, 1)
	require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, sink(mem), 1))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("mem", "first")) // reserves mem's IDs: later ones need no commit
	recv(t, mem, 1)

	armed.Store(true)
	published := make(chan error, 1)
	go func() { published <- m.Publish("ev", "slow to sync") }()
	recv(t, inSync, 1)

	registered := make(chan struct{})
	go func() {
		assert.NoError(t, m.RegisterQueue("other", tinymq.Fanout, failing, 1))
		assert.NoError(t, m.Publish("mem", "in memory"))
		close(registered)
	}()
	closedWithin(t, registered, "RegisterQueue and a publish while a durable publish waits for its sync")
	recv(t, mem, 1)

	stopped := make(chan struct{})
	go func() { m.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned before the publish it had to wait for")
	case <-time.After(20 * time.Millisecond): // a bound on a negative: Stop must still be waiting
	}
	close(release)
	require.NoError(t, <-published)
	closedWithin(t, stopped, "Stop")
	var body string
	require.NoError(t, json.Unmarshal(recv(t, got, 1)[0].Data.(tinymq.Encoded).Body, &body))
	assert.Equal(t, "slow to sync", body)
	assert.Equal(t, uint64(1), m.Stats().Queues["d"].Succeeded)
}

// A durable queue's backlog stays visible in Stats (Stored, not Depth), and
// on disk, while a queue of its name is registered in memory, runs and is
// published to, and after it stops; a durable queue of that name gets it back.
func TestDurableBacklogUnderAnInMemoryQueueStaysVisible(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	for i := range 3 {
		require.NoError(t, m.Publish("ev", i))
	}
	_ = m.Shutdown(context.Background()) // before Start: they stay on disk

	m = tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2,
		tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	st := m.Stats().Queues["q"]
	assert.Equal(t, 3, st.Stored, "the backlog is shown")
	assert.False(t, st.Durable)
	assert.False(t, st.Unregistered, "a queue of its name is registered")
	assert.Zero(t, st.Depth, "the in-memory queue does not have them")
	for i := range 20 {
		require.NoError(t, m.Publish("ev", i))
	}
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Succeeded == 20 }, wait, time.Millisecond)
	assert.Equal(t, 3, m.Stats().Queues["q"].Stored, "the in-memory queue's own messages leave the backlog alone")
	m.Stop()
	assert.Equal(t, 3, m.Stats().Queues["q"].Stored, "after Stop too")

	m = tinymq.New(tinymq.WithDataDir(dir))
	got := make(chan *tinymq.Msg, 3)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	recv(t, got, 3)
	m.Stop()
}

// A length limit applies to what a durable queue restores, as RabbitMQ
// applies a max-length policy to a queue holding more: DropHead dead-letters
// the oldest beyond it (and they stay gone after another restart);
// RejectPublish keeps them all and refuses publishes, started or not, until
// there is room; Block keeps them all and holds a publish until its context
// ends.
func TestLengthLimitAppliesToRestoredMessages(t *testing.T) {
	backlog := func(t *testing.T) string {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		for i := range 50 {
			require.NoError(t, m.Publish("ev", i))
		}
		_ = m.Shutdown(context.Background()) // before Start: all 50 stay on disk
		return dir
	}
	t.Run("DropHead", func(t *testing.T) {
		dir := backlog(t)
		for run := range 2 {
			m := tinymq.New(tinymq.WithDataDir(dir))
			dead := deadLetters(t, m)
			got := make(chan *tinymq.Msg, 50)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable(),
				tinymq.WithMaxLen(10, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
			if run == 1 {
				assert.Zero(t, m.Stats().Queues["q"].Depth, "the evicted and the delivered stay gone")
				m.Stop()
				continue
			}
			assert.Equal(t, 10, m.Stats().Queues["q"].Depth)
			require.NoError(t, m.Start(context.Background()))
			var ids []int
			for _, d := range recv(t, got, 10) {
				var v int
				require.NoError(t, d.Data.(tinymq.Encoded).Decode(&v))
				ids = append(ids, v)
			}
			assert.Equal(t, []int{40, 41, 42, 43, 44, 45, 46, 47, 48, 49}, ids, "the newest 10 are kept, in order")
			for _, d := range recv(t, dead, 40) {
				assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
			}
			m.Stop()
			st := m.Stats().Queues["q"]
			assert.Equal(t, uint64(40), st.Overflowed)
			assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped+st.Undelivered, "%+v", st)
		}
	})
	t.Run("RejectPublish", func(t *testing.T) {
		dir := backlog(t)
		m := tinymq.New(tinymq.WithDataDir(dir))
		release := make(chan struct{})
		got := make(chan *tinymq.Msg, 51)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			<-release
			got <- msg
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithMaxLen(10, tinymq.RejectPublish)))
		assert.Equal(t, 50, m.Stats().Queues["q"].Depth, "all are kept")
		assert.ErrorIs(t, m.Publish("ev", 50), tinymq.ErrQueueFull)
		require.NoError(t, m.Start(context.Background()))
		assert.ErrorIs(t, m.Publish("ev", 50), tinymq.ErrQueueFull, "still full once started")
		close(release)
		recv(t, got, 50)
		require.Eventually(t, func() bool { return m.Stats().Queues["q"].Depth == 0 }, wait, time.Millisecond)
		require.NoError(t, m.Publish("ev", 50), "room once the backlog is below the limit")
		recv(t, got, 1)
		m.Stop()
		assert.Zero(t, m.Stats().Queues["q"].Overflowed)
	})
	t.Run("Block", func(t *testing.T) {
		dir := backlog(t)
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(),
			tinymq.WithMaxLen(10, tinymq.Block)))
		assert.Equal(t, 50, m.Stats().Queues["q"].Depth, "all are kept")
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := m.PublishContext(ctx, "ev", 50)
		require.ErrorIs(t, err, tinymq.ErrQueueFull, "held until the context ended")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		_ = m.Shutdown(context.Background()) // before Start: all 50 stay on disk

		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		assert.Equal(t, 50, m.Stats().Queues["q"].Depth, "Block kept them all, and added nothing")
		_ = m.Shutdown(context.Background())
	})
}

func TestDurableNeedsANameAndADataDir(t *testing.T) {
	m := tinymq.New()
	assert.ErrorIs(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()), tinymq.ErrInvalidOption)
	m = tinymq.New(tinymq.WithDataDir(t.TempDir()))
	assert.ErrorIs(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithDurable()), tinymq.ErrInvalidOption)
	m.Stop()
}

// Moving a message to a durable dead-letter queue is one log batch: after a
// restart it is in exactly one of the two queues.
func TestDeadLetterMoveIsAtomic(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return tinymq.Permanent(errors.New("bad"))
	}, 1, tinymq.WithQueueName("work"), tinymq.WithDurable(), tinymq.WithDeadLetter("dead", "")))
	busy := make(chan struct{})
	require.NoError(t, m.RegisterQueue("dead", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		close(busy)
		<-ctx.Done()
		return nil // the blocker is acknowledged; the dead letter waits behind it
	}, 1, tinymq.WithQueueName("parked"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("dead", "blocker"))
	closedWithin(t, busy, "the blocker reaching the consumer")
	require.NoError(t, m.Publish("ev", "x"))
	require.Eventually(t, func() bool { return m.Stats().Queues["parked"].Depth == 1 }, wait, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.Shutdown(ctx)
	m.Stop()

	m = tinymq.New(tinymq.WithDataDir(dir))
	got := make(chan *tinymq.Msg, 2)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("work"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("dead", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("parked"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	// The blocker may come back too, if its acknowledgement came after the
	// deadline closed the log.
	var msg *tinymq.Msg
	for msg == nil {
		g := recv(t, got, 1)[0]
		assert.Equal(t, "parked", g.Queue, "nothing is left in work")
		if len(g.Deaths) > 0 {
			msg = g
		}
	}
	m.Stop()
	for len(got) > 0 {
		assert.Empty(t, (<-got).Deaths, "the dead letter is in parked once")
	}
	require.Len(t, msg.Deaths, 1)
	assert.Equal(t, "work", msg.Deaths[0].Queue)
	assert.Equal(t, "bad", msg.Deaths[0].LastError)
}

// Retry attempts survive a restart.
//
// Attempt counts survive several restarts: one failed attempt per process,
// the retry survives each restart, and the fourth attempt dead-letters the
// message into a durable queue, once.
func TestRetryAttemptsSurviveRestarts(t *testing.T) {
	t.Run("one restart", func(t *testing.T) {
		dir := t.TempDir()
		retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour})
		failed := make(chan struct{})
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			close(failed)
			return errors.New("first attempt")
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), retry))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		closedWithin(t, failed, "the first attempt")
		require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, wait, time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = m.Shutdown(ctx)
		m.Stop()

		m = tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), retry))
		require.NoError(t, m.Start(context.Background()))
		st := m.Stats().Queues["q"]
		assert.Equal(t, 1, st.Scheduled, "still backing off: its hour has not passed")
		_ = m.Shutdown(ctx)
		m.Stop()
	})
	t.Run("several restarts", func(t *testing.T) {
		dir := t.TempDir()
		f := consumerForms()[3]
		retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 4, InitialBackoff: 300 * time.Millisecond, MaxBackoff: 300 * time.Millisecond})
		var attempts []int
		var redelivered []bool
		var deadSeen []formCall
		for proc := 1; proc <= 6 && len(deadSeen) == 0; proc++ {
			m := tinymq.New(tinymq.WithDataDir(dir))
			calls := make(chan formCall, 10)
			deadCh := make(chan formCall, 10)
			registerDurable(t, m, f, "ev", "q", func(_ context.Context, c formCall) error {
				calls <- c
				return errors.New("fail")
			}, retry, tinymq.WithDeadLetter("dlx", ""))
			registerDurable(t, m, f, "dlx", "dead", func(_ context.Context, c formCall) error {
				deadCh <- c
				return nil
			})
			require.NoError(t, m.Start(context.Background()))
			if proc == 1 {
				require.NoError(t, m.Publish("ev", &numbered{N: 7}))
			}
			c := recv(t, calls, 1)[0]
			attempts = append(attempts, c.Attempt)
			redelivered = append(redelivered, c.Redelivered)
			if c.Attempt < 4 {
				require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, wait, time.Millisecond)
			} else {
				deadSeen = append(deadSeen, recv(t, deadCh, 1)[0])
				// Wait for the acknowledgement: a message still in its consumer
				// at a Shutdown deadline stays in the log.
				require.Eventually(t, func() bool { return m.Stats().Queues["dead"].Succeeded == 1 }, wait, time.Millisecond)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = m.Shutdown(ctx)
			stopWithin(t, m)
		drain:
			for {
				select {
				case c := <-calls:
					attempts = append(attempts, c.Attempt)
				default:
					break drain
				}
			}
		}
		assert.Equal(t, []int{1, 2, 3, 4}, attempts, "one attempt per process, counted across restarts")
		assert.Equal(t, []bool{false, true, true, true}, redelivered)
		require.Len(t, deadSeen, 1)
		if assert.Len(t, deadSeen[0].Deaths, 1) {
			assert.Equal(t, 4, deadSeen[0].Deaths[0].Attempts)
			assert.Equal(t, "q", deadSeen[0].Deaths[0].Queue)
		}
		// Nothing is left: the dead letter was acknowledged, the source too.
		m := tinymq.New(tinymq.WithDataDir(dir))
		got := make(chan formCall, 10)
		registerDurable(t, m, f, "ev", "q", recordCall(got), retry, tinymq.WithDeadLetter("dlx", ""))
		registerDurable(t, m, f, "dlx", "dead", recordCall(got))
		require.NoError(t, m.Start(context.Background()))
		st := m.Stats()
		assert.Zero(t, st.Queues["q"].Depth)
		assert.Zero(t, st.Queues["dead"].Depth)
		require.NoError(t, m.Publish("dlx", &numbered{N: 99}))
		assert.Equal(t, 99, recv(t, got, 1)[0].N, "the marker comes first: nothing was redelivered")
		stopWithin(t, m)
	})
}

// The log keeps the messages of a durable queue that is not registered
// again; Stats shows them.
func TestUnregisteredDurableQueueIsShownNotDeleted(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("old"), tinymq.WithDurable()))
	require.NoError(t, m.Publish("ev", 1))
	require.NoError(t, m.Publish("ev", 2))
	_ = m.Shutdown(context.Background())

	log, records := logRecords()
	m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(log))
	require.NoError(t, m.Start(context.Background()))
	st := m.Stats().Queues["old"]
	assert.True(t, st.Unregistered)
	assert.Equal(t, 2, st.Depth)
	m.Stop()
	var logged bool
	for _, r := range records(t) {
		logged = logged || (r["queue"] == "old" && r["count"] == float64(2))
	}
	assert.True(t, logged, "Start logs the durable queue that is not registered")

	m = tinymq.New(tinymq.WithDataDir(dir))
	got := make(chan *tinymq.Msg, 2)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("old"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	recv(t, got, 2)
	m.Stop()
}

// A full disk or a failed fsync: Publish returns an error wrapping ErrLog
// and no queue accepted the message; after a failed fsync the log does not
// pretend that later writes are safe; in-memory queues keep working; a
// restart reads what really is on disk.
func TestDiskFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(f *wal.Faults, fail *atomic.Bool)
	}{
		{"full disk", func(f *wal.Faults, fail *atomic.Bool) {
			f.WriteErr = func(string) error {
				if fail.Load() {
					return syscall.ENOSPC
				}
				return nil
			}
		}},
		{"failed fsync", func(f *wal.Faults, fail *atomic.Bool) {
			f.SyncErr = func(string) error {
				if fail.Load() {
					return syscall.EIO
				}
				return nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fail atomic.Bool
			var f wal.Faults
			tc.fault(&f, &fail)
			restore := tinymq.SetWALFaults(&f)
			dir := t.TempDir()
			m := tinymq.New(tinymq.WithDataDir(dir))
			durable := make(chan *tinymq.Msg, 10)
			memory := make(chan *tinymq.Msg, 10)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(durable), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
			require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, sink(memory), 1, tinymq.WithQueueName("m")))
			require.NoError(t, m.Start(context.Background()))
			restore() // the log is open
			require.NoError(t, m.Publish("ev", "before"))
			recv(t, durable, 1)
			require.Eventually(t, func() bool { return m.Stats().Queues["d"].Succeeded == 1 }, wait, time.Millisecond)
			require.NoError(t, m.Publish("ev", "barrier")) // its sync covers the acknowledgement of "before"
			recv(t, durable, 1)

			fail.Store(true)
			err := m.Publish("ev", "during")
			require.ErrorIs(t, err, tinymq.ErrLog)
			assert.Equal(t, uint64(2), m.Stats().Queues["d"].Accepted, "nothing accepted that is not on disk")
			fail.Store(false)
			assert.ErrorIs(t, m.Publish("ev", "after"), tinymq.ErrLog, "a failed log stays failed")
			require.NoError(t, m.Publish("mem", "in memory"), "in-memory queues keep working")
			recv(t, memory, 1)
			m.Stop()

			m = tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(durable), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", "after a restart"))
			var got []string
			for len(got) == 0 || got[len(got)-1] != "after a restart" {
				var s string
				require.NoError(t, recv(t, durable, 1)[0].Data.(tinymq.Encoded).Decode(&s))
				got = append(got, s)
			}
			m.Stop()
			// A publish that failed may still be on disk (the write reached the
			// file, its fsync failed): the caller was told it failed, and may
			// see it delivered, never the other way round.
			assert.Subset(t, []string{"barrier", "during", "after", "after a restart"}, got)
			assert.NotContains(t, got, "before", "the acknowledged message stays acknowledged")
		})
	}
}

// A log damaged before its end is refused with an error naming the file and
// offset, unless the user asks for repair, which keeps a copy of what it cuts.
func TestCorruptLogIsRefusedUnlessRepaired(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	for i := range 20 {
		require.NoError(t, m.Publish("ev", i))
	}
	_ = m.Shutdown(context.Background())
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	b, err := os.ReadFile(segs[0])
	require.NoError(t, err)
	b[100] ^= 0xff // inside an early record, with good ones after it
	require.NoError(t, os.WriteFile(segs[0], b, 0o644))

	m = tinymq.New(tinymq.WithDataDir(dir))
	err = m.Start(context.Background())
	require.ErrorIs(t, err, tinymq.ErrLog)
	assert.Contains(t, err.Error(), filepath.Base(segs[0]))
	m.Stop()

	m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogRepair())
	require.NoError(t, m.Start(context.Background()))
	m.Stop()
	kept, _ := filepath.Glob(filepath.Join(dir, "*.corrupt-*"))
	assert.NotEmpty(t, kept, "what repair cut is kept")
}

// A dead letter of a durable queue reaches a Handler[T] of its dead-letter
// queue as the same T, whichever of the two queues are durable.
func TestDeadLetterOfADurableQueueKeepsItsType(t *testing.T) {
	for _, srcDurable := range []bool{true, false} {
		for _, dlqDurable := range []bool{true, false} {
			t.Run(fmt.Sprintf("source durable %v, dead-letter queue durable %v", srcDurable, dlqDurable), func(t *testing.T) {
				m := tinymq.New(tinymq.WithDataDir(t.TempDir()))
				got := make(chan order, 1)
				dq := []tinymq.QueueOption{tinymq.WithQueueName("dead")}
				if dlqDurable {
					dq = append(dq, tinymq.WithDurable())
				}
				require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, tinymq.Handler(func(_ context.Context, o order) error {
					got <- o
					return nil
				}), 1, dq...))
				sq := []tinymq.QueueOption{tinymq.WithQueueName("src"), tinymq.WithDeadLetter("dlx", "")}
				if srcDurable {
					sq = append(sq, tinymq.WithDurable())
				}
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
					return tinymq.Permanent(errors.New("no"))
				}, 1, sq...))
				require.NoError(t, m.Start(context.Background()))
				require.NoError(t, m.Publish("ev", order{ID: 7, Items: []string{"pen"}}))
				assert.Equal(t, order{ID: 7, Items: []string{"pen"}}, recv(t, got, 1)[0])
				m.Stop()
			})
		}
	}
}

// Once Shutdown returned at its deadline, the data directory is free, even
// while a consumer that ignores its context still runs; that consumer's late
// success does not reach the log the next MQ holds.
func TestShutdownDeadlineReleasesTheDataDir(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	release := make(chan struct{})
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		<-release
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].InFlight == 1 }, wait, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := m.Shutdown(ctx)
	require.ErrorIs(t, err, tinymq.ErrUndelivered)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	got := make(chan *tinymq.Msg, 1)
	err = m2.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable())
	close(release) // the old consumer succeeds now, while m2 holds the log
	m.Stop()
	require.NoError(t, err)
	require.NoError(t, m2.Start(context.Background()))
	assert.True(t, recv(t, got, 1)[0].Redelivered, "its acknowledgement came after the log closed")
	m2.Stop()
	// m2 acknowledged it, and the old consumer's late acknowledgement neither
	// reached nor damaged the log m2 held: a third MQ opens it and finds nothing.
	m3 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m3.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	assert.Zero(t, m3.Stats().Queues["q"].Depth)
	m3.Stop()
}

// A durable message whose consumer gives up when a Shutdown deadline cancels
// it stays in the log, in exactly one queue: not dropped, not half moved to
// a dead-letter queue that is shut.
func TestDurableMessageFailingAfterTheDeadlineStaysInTheLog(t *testing.T) {
	dir := t.TempDir()
	register := func(m *tinymq.MQ, c tinymq.ConsumerFunc, dead chan *tinymq.Msg) {
		require.NoError(t, m.RegisterQueue("in", tinymq.Fanout, c, 1, tinymq.WithQueueName("A"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dead), 1, tinymq.WithQueueName("DLQ"), tinymq.WithDurable()))
	}
	m := tinymq.New(tinymq.WithDataDir(dir))
	register(m, func(ctx context.Context, _ *tinymq.Msg) error {
		<-ctx.Done()
		return tinymq.Permanent(errors.New("gave up"))
	}, make(chan *tinymq.Msg, 1))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("in", "order-1"))
	require.Eventually(t, func() bool { return m.Stats().Queues["A"].InFlight == 1 }, wait, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
	m.Stop()
	a := m.Stats().Queues["A"]
	assert.Equal(t, a.Accepted, a.Succeeded+a.DeadLettered+a.Dropped+a.Undelivered)
	assert.Equal(t, uint64(1), a.Undelivered)

	m = tinymq.New(tinymq.WithDataDir(dir))
	again := make(chan *tinymq.Msg, 1)
	dead := make(chan *tinymq.Msg, 1)
	register(m, sink(again), dead)
	require.NoError(t, m.Start(context.Background()))
	recv(t, again, 1)
	m.Stop()
	assert.Empty(t, dead)
}

// A codec is user code: one that panics or fails makes Publish fail with
// ErrPayloadType; one that calls runtime.Goexit ends the publishing goroutine
// (the codec runs on it, before Publish holds anything). Either way nothing
// is accepted and the MQ goes on.
func TestHostileCodec(t *testing.T) {
	for _, mode := range []string{"panic", "error", "goexit"} {
		t.Run(mode, func(t *testing.T) {
			m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithCodec(hostileCodec(mode)))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
			require.NoError(t, m.Start(context.Background()))
			errc := make(chan error, 1)
			go func() {
				defer close(errc)
				errc <- m.Publish("ev", 1)
			}()
			err, returned := <-errc
			if mode == "goexit" {
				assert.False(t, returned, "Goexit ends the publisher's goroutine")
			} else {
				assert.ErrorIs(t, err, tinymq.ErrPayloadType)
			}
			assert.Zero(t, m.Stats().Queues["q"].Depth, "nothing was accepted")
			done := make(chan struct{})
			go func() { m.Stop(); close(done) }()
			closedWithin(t, done, "Stop")
		})
	}
}

type hostileCodec string

func (c hostileCodec) Marshal(any) ([]byte, error) {
	switch c {
	case "panic":
		panic("marshal")
	case "goexit":
		runtime.Goexit()
	}
	return nil, errors.New("cannot encode")
}
func (hostileCodec) Unmarshal([]byte, any) error { return errors.New("cannot decode") }
func (hostileCodec) ContentType() string         { return "application/x-hostile" }

// Delays and TTL deadlines survive a restart: a delayed message still waits,
// and one whose TTL passed while the process was down expires, dead-lettered.
func TestDelaysAndDeadlinesSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(),
		tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Publish("ev", "later", tinymq.WithDelay(time.Hour)))
	require.NoError(t, m.Publish("ev", "short-lived", tinymq.WithExpiration(50*time.Millisecond)))
	_ = m.Shutdown(context.Background()) // before Start: both stay on disk
	time.Sleep(100 * time.Millisecond)   // the TTL passes while nothing runs

	m = tinymq.New(tinymq.WithDataDir(dir))
	dead := deadLetters(t, m)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(),
		tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	d := recv(t, dead, 1)[0]
	assert.Equal(t, tinymq.ReasonExpired, d.Deaths[0].Reason)
	st := m.Stats().Queues["q"]
	assert.Equal(t, 1, st.Scheduled, "the delayed message still waits for its hour")
	assert.Zero(t, st.Delivered)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered, "the delayed one stays on disk")
	m.Stop()
}

// JSONCodec encodes a []byte without encoding/json's reflection: the bytes
// must be exactly what encoding/json makes, so that a queue's stored
// messages do not depend on which path encoded them.
func TestJSONCodecBytesAsEncodingJSON(t *testing.T) {
	for _, b := range [][]byte{nil, {}, {0}, []byte("hello"), make([]byte, 255), []byte{0xff, 0xfe, '"', '\\', '<'}} {
		want, err := json.Marshal(b)
		require.NoError(t, err)
		got, err := tinymq.JSONCodec{}.Marshal(b)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "%q", b)
		var back []byte
		require.NoError(t, tinymq.JSONCodec{}.Unmarshal(got, &back))
		assert.Equal(t, b, back)
	}
	type named []byte
	want, _ := json.Marshal(named("x"))
	got, err := tinymq.JSONCodec{}.Marshal(named("x"))
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
	raw, err := tinymq.JSONCodec{}.Marshal(json.RawMessage(`{"a":1}`))
	require.NoError(t, err)
	assert.Equal(t, `{"a":1}`, string(raw), "a RawMessage keeps its own MarshalJSON")
}

// A durable publish allocates the few things that outlive it: the encoded
// body (the consumer's Encoded.Body), the queue's Msg with its ext, the
// message's key, the Encoded in Data, and the log's index entry. The batch,
// the record buffer and the request to the log's writer are reused.
func TestDurablePublishAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Hour)) // Publish returns after the write
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	defer m.Stop() // never started: the messages wait
	var payload any = make([]byte, 256)
	got := testing.AllocsPerRun(2000, func() {
		if err := m.Publish("ev", payload); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.2f allocations per durable publish", got)
	assert.LessOrEqual(t, got, 5.0, "a durable publish allocates more than the body, the Msg, the key, the Encoded and the index entry")
}

// A durable publish, its delivery and its acknowledgement allocate only what
// outlives the publish: the encoded body (the consumer's Encoded.Body), the
// queue's Msg with its ext, the message's key (which the log's index keeps
// too, not a copy of it) and the Encoded in Data. The acknowledgement
// allocates nothing: its batch is reused, and so is the request that wakes
// the log's writer for it.
func TestDurablePublishAndItsAcknowledgementAllocateOnlyWhatOutlivesThem(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Hour)) // Publish returns after the write
	done := make(chan struct{}, 1)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		done <- struct{}{}
		return nil // acknowledged once this returns: during the next run, which counts the same
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	var payload any = make([]byte, 256)
	step := func() {
		if err := m.Publish("ev", payload); err != nil {
			t.Fatal(err)
		}
		<-done
	}
	for range 100 { // the log's buffers and index settle
		step()
	}
	got := testing.AllocsPerRun(1000, step)
	t.Logf("%.2f allocations per durable publish, delivery and acknowledgement", got)
	assert.LessOrEqual(t, got, 4.0, "a durable publish and its acknowledgement allocate more than the body, the Msg, the key and the Encoded")
}

// A large []byte published to a durable queue costs one copy of its
// encoding: JSON's base64 is written straight into the log's batch, which
// the consumer's Encoded.Body shares, and the log's writer writes a record
// that large from the batch itself; base64 makes it 4/3 of the payload. It
// was 5.3 times: the codec's copy, a record buffer grown twice, the batch and
// the writer's.
func TestDurablePublishOfLargeBytesAllocatesOneEncodedCopy(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Hour)) // Publish returns after the write
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	defer m.Stop() // never started: the messages wait
	const size, n = 16 << 20, 4
	payload := make([]byte, size)
	require.NoError(t, m.Publish("ev", payload)) // the log's first segment and buffers
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		require.NoError(t, m.Publish("ev", payload))
	}
	runtime.ReadMemStats(&after)
	ratio := float64(after.TotalAlloc-before.TotalAlloc) / (n * size)
	t.Logf("a durable publish of %d MiB allocates %.2f times its size", size>>20, ratio)
	assert.LessOrEqual(t, ratio, 1.5, "a durable publish of a large []byte allocates more than its encoding once")
}

// countingCodec is JSONCodec counting its Marshal calls.
type countingCodec struct {
	tinymq.JSONCodec
	marshals *atomic.Int32
}

func (c countingCodec) Marshal(v any) ([]byte, error) {
	c.marshals.Add(1)
	return c.JSONCodec.Marshal(v)
}

// WithMaxMessageSize bounds what a durable queue stores: Data whose size is
// known ([]byte, string, Encoded) is refused before the codec runs, other
// values once their encoding is over the limit, before it is copied; and a
// []byte within the limit whose JSON encoding is not is refused too. All or
// nothing: an in-memory queue of the same exchange does not get what the
// durable queue refused.
func TestDurableMaxMessageSize(t *testing.T) {
	var marshals atomic.Int32
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithMaxMessageSize(1000),
		tinymq.WithCodec(countingCodec{marshals: &marshals}))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("mem")))
	defer m.Stop() // never started: the messages wait
	type doc struct{ Text string }
	tests := []struct {
		name     string
		data     any
		want     error
		marshals int32 // Marshal calls it costs
	}{
		{"a []byte over the limit", make([]byte, 1001), tinymq.ErrTooLarge, 0},
		{"a string over the limit", string(make([]byte, 1001)), tinymq.ErrTooLarge, 0},
		{"an Encoded over the limit", tinymq.Encoded{Body: make([]byte, 1001)}, tinymq.ErrTooLarge, 0},
		{"a json.RawMessage over the limit", json.RawMessage(`"` + strings.Repeat("r", 999) + `"`), tinymq.ErrTooLarge, 0},
		{"an Encoded at the limit", tinymq.Encoded{Body: []byte(`"` + strings.Repeat("e", 998) + `"`)}, nil, 0},
		{"a value encoded over the limit", doc{Text: string(make([]byte, 1000))}, tinymq.ErrTooLarge, 1},
		{"a value encoded within the limit", doc{Text: "x"}, nil, 1},
		{"a []byte within the limit", make([]byte, 700), nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			marshals.Store(0)
			require.ErrorIs(t, m.Publish("ev", tt.data), tt.want)
			require.Equal(t, tt.marshals, marshals.Load(), "Marshal calls")
		})
	}
	require.Equal(t, 3, m.Stats().Queues["q"].Depth, "the queue holds only the messages accepted")
	require.Equal(t, 3, m.Stats().Queues["mem"].Depth, "all or nothing: the in-memory queue of a refused publish does not get it")

	j := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithMaxMessageSize(1000))
	require.NoError(t, j.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	defer j.Stop()
	require.ErrorIs(t, j.Publish("ev", make([]byte, 900)), tinymq.ErrTooLarge, "JSONCodec encodes 900 bytes in 1202")
	require.NoError(t, j.Publish("ev", make([]byte, 700)), "JSONCodec encodes 700 bytes in 936")
}

// Recovery costs the same per message whatever the backlog: the allocations
// and the bytes allocated per recovered message do not grow from 10k to 100k
// messages (they grew with the index, maps and sorts when each was a copy per
// key). Time is not asserted; BenchmarkRecover measures it.
func TestDurableRecoveryCostPerMessageDoesNotGrow(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	if testing.Short() {
		t.Skip("builds a log of 110k messages")
	}
	type cost struct{ allocs, bytes float64 }
	measure := func(n int) cost {
		dir := t.TempDir()
		buildBacklog(t, dir, n)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(discardLogger))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("q"), tinymq.WithDurable()))
		runtime.ReadMemStats(&after)
		require.Equal(t, n, m.Stats().Queues["q"].Depth)
		m.Stop()
		return cost{float64(after.Mallocs-before.Mallocs) / float64(n), float64(after.TotalAlloc-before.TotalAlloc) / float64(n)}
	}
	small, large := measure(10_000), measure(100_000)
	t.Logf("per message: %.2f allocations, %.0f bytes for 10k; %.2f, %.0f for 100k", small.allocs, small.bytes, large.allocs, large.bytes)
	assert.LessOrEqual(t, large.allocs, small.allocs*1.05, "allocations per recovered message grow with the backlog")
	// Maps and slices grow by doubling, so bytes per message vary with where
	// n falls between two powers of two; more than that is growth.
	assert.LessOrEqual(t, large.bytes, small.bytes*1.5, "bytes allocated per recovered message grow with the backlog")
	// The key (shared with the log's index), the body, the Msg with its ext
	// and its Encoded Data; the rest comes in blocks. It was 12.
	assert.LessOrEqual(t, large.allocs, 5.0, "allocations per recovered message")
}

// registerDurable registers the durable queue name on exchange ex with form f.
func registerDurable(t *testing.T, m *tinymq.MQ, f consumerForm, ex, name string, fn func(context.Context, formCall) error, opts ...tinymq.QueueOption) {
	t.Helper()
	opts = append([]tinymq.QueueOption{tinymq.WithQueueName(name), tinymq.WithDurable()}, opts...)
	require.NoError(t, f.register(m, ex, tinymq.Fanout, fn, 1, opts...))
}

// recordCall records and acknowledges.
func recordCall(ch chan<- formCall) func(context.Context, formCall) error {
	return func(_ context.Context, c formCall) error {
		ch <- c
		return nil
	}
}

// A message of a durable queue that fails (error, panic, Goexit, typed nil),
// is retried and then succeeds leaves nothing behind.
func TestDurableMessageRetriedThenSucceededIsNotRedelivered(t *testing.T) {
	for _, f := range consumerForms() {
		t.Run(f.name, func(t *testing.T) {
			dir := t.TempDir()
			const n = 40
			retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})
			m := tinymq.New(tinymq.WithDataDir(dir))
			var calls callCounts
			ok := make(chan int, n)
			registerDurable(t, m, f, "ev", "q", func(_ context.Context, c formCall) error {
				if calls.inc(c.N) == 1 {
					switch c.N % 4 {
					case 0:
						return errors.New("first")
					case 1:
						panic("first")
					case 2:
						runtime.Goexit()
					case 3:
						var e *nilErr
						return e
					}
				}
				ok <- c.N
				return nil
			}, retry)
			require.NoError(t, m.Start(context.Background()))
			for i := range n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
			}
			recv(t, ok, n)
			stopWithin(t, m)
			s := m.Stats().Queues["q"]
			assert.Equal(t, hCounts{Delivered: 2 * n, Succeeded: n, Failed: n, Retried: n}, hCountsOf(s))
			assertLedger(t, "q", s)

			m = tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.Start(context.Background()))
			assert.Zero(t, m.Stats().Queues["q"].Depth, "after a restart, before registering")
			stopWithin(t, m)

			m = tinymq.New(tinymq.WithDataDir(dir))
			got := make(chan formCall, n+1)
			registerDurable(t, m, f, "ev", "q", recordCall(got), retry)
			require.NoError(t, m.Start(context.Background()))
			assert.Zero(t, m.Stats().Queues["q"].Depth, "after a restart")
			require.NoError(t, m.Publish("ev", &numbered{N: 1000}))
			assert.Equal(t, 1000, recv(t, got, 1)[0].N, "nothing redelivered before the marker")
			stopWithin(t, m)
		})
	}
}

// A publish refused by a full durable queue (RejectPublish) is on no queue,
// not even after a restart; DropHead's evicted messages do not come back;
// a publisher blocked on a full queue and released by Stop leaves nothing.
func TestDurableLengthLimitsKeepTheLogInStep(t *testing.T) {
	for _, ov := range []string{"reject", "drophead", "block"} {
		t.Run(ov, func(t *testing.T) {
			dir := t.TempDir()
			m := tinymq.New(tinymq.WithDataDir(dir))
			overflow := map[string]tinymq.Overflow{"reject": tinymq.RejectPublish, "drophead": tinymq.DropHead, "block": tinymq.Block}[ov]
			reg := func(m *tinymq.MQ, fa, fb tinymq.ConsumerFunc) {
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, fa, 1, tinymq.WithQueueName("a"), tinymq.WithDurable()))
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, fb, 1, tinymq.WithQueueName("b"), tinymq.WithDurable(),
					tinymq.WithMaxLen(2, overflow)))
			}
			reg(m, failing, failing)
			var accepted []int
			switch ov {
			case "reject", "drophead":
				for n := range 5 {
					err := m.Publish("ev", &numbered{N: n})
					if err == nil {
						accepted = append(accepted, n)
					} else {
						require.ErrorIs(t, err, tinymq.ErrQueueFull)
					}
				}
				require.ErrorIs(t, m.Shutdown(context.Background()), tinymq.ErrUndelivered)
			case "block":
				for n := range 2 {
					require.NoError(t, m.Publish("ev", &numbered{N: n}))
					accepted = append(accepted, n)
				}
				blocked := make(chan error, 1)
				go func() { blocked <- m.Publish("ev", &numbered{N: 2}) }()
				require.Eventually(t, func() bool { return m.Stats().Queues["a"].Accepted == 2 }, wait, time.Millisecond)
				select {
				case err := <-blocked:
					t.Fatalf("Publish to a full Block queue returned %v", err)
				case <-time.After(20 * time.Millisecond): // give it time to block (not for sync)
				}
				stopWithin(t, m)
				require.ErrorIs(t, recv(t, blocked, 1)[0], tinymq.ErrStopped)
			}
			m = tinymq.New(tinymq.WithDataDir(dir))
			ga := make(chan *tinymq.Msg, 10)
			gb := make(chan *tinymq.Msg, 10)
			reg(m, sink(ga), sink(gb))
			require.NoError(t, m.Start(context.Background()))
			ns := func(ch <-chan *tinymq.Msg, k int) []int {
				var out []int
				for _, msg := range recv(t, ch, k) {
					n, _ := numberOf(msg.Data)
					out = append(out, n)
				}
				return out
			}
			wantB := append([]int{}, accepted...)
			if ov == "drophead" {
				wantB = accepted[len(accepted)-2:]
			}
			assert.Equal(t, accepted, ns(ga, len(accepted)), "queue a after restart")
			assert.Equal(t, wantB, ns(gb, len(wantB)), "queue b after restart")
			// b is empty now: a marker shows that nothing else was in the log.
			require.Eventually(t, func() bool { return m.Stats().Queues["b"].Depth == 0 }, wait, time.Millisecond)
			require.NoError(t, m.Publish("ev", &numbered{N: 100}))
			assert.Equal(t, []int{100}, ns(ga, 1))
			assert.Equal(t, []int{100}, ns(gb, 1))
			stopWithin(t, m)
		})
	}
}

// A durable message whose consumer fails without retries (error, panic,
// Goexit, typed nil, Permanent) is dropped, which acknowledges it: it does
// not come back after a restart.
func TestDurableFailureWithoutRetryIsAcknowledged(t *testing.T) {
	modes := []string{"error", "panic", "goexit", "typednil", "permanent"}
	for _, f := range consumerForms() {
		for _, mode := range modes {
			t.Run(f.name+"/"+mode, func(t *testing.T) {
				dir := t.TempDir()
				m := tinymq.New(tinymq.WithDataDir(dir))
				in := make(chan struct{}, 10)
				registerDurable(t, m, f, "ev", "q", func(_ context.Context, c formCall) error {
					in <- struct{}{}
					switch mode {
					case "error":
						return errors.New("x")
					case "panic":
						panic("x")
					case "goexit":
						runtime.Goexit()
					case "typednil":
						var e *nilErr
						return e
					}
					return tinymq.Permanent(errors.New("x"))
				})
				require.NoError(t, m.Start(context.Background()))
				for n := range 3 {
					require.NoError(t, m.Publish("ev", &numbered{N: n}))
				}
				recv(t, in, 3)
				stopWithin(t, m)
				s := m.Stats().Queues["q"]
				assert.Equal(t, hCounts{Delivered: 3, Failed: 3, Dropped: 3}, hCountsOf(s))
				assertLedger(t, "q", s)

				m = tinymq.New(tinymq.WithDataDir(dir))
				got := make(chan formCall, 10)
				registerDurable(t, m, f, "ev", "q", recordCall(got))
				require.NoError(t, m.Start(context.Background()))
				assert.Zero(t, m.Stats().Queues["q"].Depth)
				require.NoError(t, m.Publish("ev", &numbered{N: 100}))
				assert.Equal(t, 100, recv(t, got, 1)[0].N, "a dropped durable message came back")
				stopWithin(t, m)
			})
		}
	}
}

// Publishers racing a Shutdown deadline on a durable queue: every message
// whose Publish returned nil either succeeded before the deadline or comes
// back after a restart, never both, never twice.
func TestDurableShutdownDeadlineLosesNothingAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Millisecond))
	var mu sync.Mutex
	done1 := map[int]int{}
	doneAt := map[int]time.Time{}
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		n, _ := numberOf(msg.Data)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Microsecond): // work
		}
		mu.Lock()
		done1[n]++
		doneAt[n] = time.Now()
		mu.Unlock()
		return nil
	}, 2, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	var accepted sync.Map
	var wg sync.WaitGroup
	started := make(chan struct{}, 4)
	for p := range 4 {
		wg.Go(func() {
			for i := 0; i < 100000; i++ {
				n := p*1000000 + i
				err := m.Publish("ev", &numbered{N: n})
				if i == 200 {
					started <- struct{}{}
				}
				if err != nil {
					return
				}
				accepted.Store(n, true)
			}
		})
	}
	recv(t, started, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	deadline, _ := ctx.Deadline()
	shutdownErr := m.Shutdown(ctx)
	shutdownAt := time.Now()
	cancel()
	stopWithin(t, m)
	wg.Wait()
	t.Logf("Shutdown: %v", shutdownErr)
	s1 := m.Stats().Queues["q"]
	assertLedger(t, "q", s1)

	m = tinymq.New(tinymq.WithDataDir(dir))
	done2 := map[int]int{}
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		n, _ := numberOf(msg.Data)
		mu.Lock()
		done2[n]++
		mu.Unlock()
		return nil
	}, 2, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	stopWithin(t, m)
	total, both, lost, twice, lateAcked := 0, 0, 0, 0, 0
	accepted.Range(func(k, _ any) bool {
		n := k.(int)
		total++
		switch {
		case done1[n] > 0 && done2[n] > 0 && doneAt[n].After(deadline):
			// In a consumer at the deadline: README says such a message
			// stays in the log, even if the consumer then returned nil.
			lateAcked++
			t.Logf("message %d acknowledged %v after the deadline (%v after Shutdown returned), delivered again after the restart",
				n, doneAt[n].Sub(deadline), doneAt[n].Sub(shutdownAt))
		case done1[n] > 0 && done2[n] > 0:
			both++
		case done1[n] == 0 && done2[n] == 0:
			lost++
		}
		if done1[n] > 1 || done2[n] > 1 {
			twice++
		}
		return true
	})
	t.Logf("%d accepted; %d before the deadline, %d after the restart; first run %+v", total, len(done1), len(done2), hCountsOf(s1))
	assert.Zero(t, lost, "accepted durable messages lost")
	assert.Zero(t, both, "messages acknowledged before the deadline delivered again after a clean Shutdown")
	assert.LessOrEqual(t, lateAcked, 4, "only those in a consumer at the deadline may come back")
	assert.Zero(t, twice)
	for n := range done2 {
		if _, ok := accepted.Load(n); !ok {
			t.Errorf("message %d redelivered but its Publish failed", n)
		}
	}
}

// One keyed publish to two durable queues that retry it on different
// schedules: after a restart each queue goes on with its own attempt count,
// routing key and headers, and a dead letter keeps its death record.
func TestDurableRetriesStayIsolatedPerQueueAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	f := consumerForms()[3]
	reg := func(m *tinymq.MQ, fn0, fn1, fnDead func(context.Context, formCall) error) {
		require.NoError(t, f.register(m, "ev", tinymq.Direct, fn0, 1, tinymq.WithQueueName("q0"), tinymq.WithDurable(),
			tinymq.WithBindingKey("k"), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 4, InitialBackoff: 5 * time.Millisecond, Multiplier: 100, MaxBackoff: time.Second})))
		require.NoError(t, f.register(m, "ev", tinymq.Direct, fn1, 1, tinymq.WithQueueName("q1"), tinymq.WithDurable(),
			tinymq.WithBindingKey("k"), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 300 * time.Millisecond})))
		require.NoError(t, f.register(m, "dlx", tinymq.Fanout, fnDead, 1, tinymq.WithQueueName("dead"), tinymq.WithDurable()))
	}
	c0 := make(chan formCall, 10)
	c1 := make(chan formCall, 10)
	cd := make(chan formCall, 10)
	fail := func(ch chan formCall) func(context.Context, formCall) error {
		return func(_ context.Context, c formCall) error {
			ch <- c
			return fmt.Errorf("fail %s %d", c.Queue, c.Attempt)
		}
	}
	m := tinymq.New(tinymq.WithDataDir(dir))
	reg(m, fail(c0), fail(c1), recordCall(cd))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", &numbered{N: 1}, tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"h": int16(7)})))
	got0 := recv(t, c0, 2) // attempts 1 and 2 (5ms apart); the third waits 500ms
	got1 := recv(t, c1, 1) // attempt 1; the second waits 300ms
	assert.Equal(t, []int{1, 2}, []int{got0[0].Attempt, got0[1].Attempt})
	assert.Equal(t, 1, got1[0].Attempt)
	require.Eventually(t, func() bool {
		st := m.Stats().Queues
		return st["q0"].Scheduled == 1 && st["q1"].Scheduled == 1
	}, wait, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.Shutdown(ctx)
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir))
	reg(m, fail(c0), fail(c1), recordCall(cd))
	require.NoError(t, m.Start(context.Background()))
	a0 := recv(t, c0, 2) // attempts 3 and 4, then dead
	a1 := recv(t, c1, 1) // attempt 2, then dead
	dead := recv(t, cd, 2)
	stopWithin(t, m)
	assert.Equal(t, []int{3, 4}, []int{a0[0].Attempt, a0[1].Attempt}, "q0 goes on with its own count")
	assert.Equal(t, 2, a1[0].Attempt, "q1 goes on with its own count")
	for _, c := range append(a0, a1...) {
		assert.True(t, c.Redelivered || c.Attempt == 4, "%s attempt %d after the restart", c.Queue, c.Attempt)
		assert.Equal(t, "k", c.RoutingKey)
		assert.Equal(t, int16(7), c.Headers["h"])
		assert.Empty(t, c.Deaths)
	}
	byQueue := map[string]tinymq.Death{}
	for _, d := range dead {
		require.Len(t, d.Deaths, 1)
		byQueue[d.Deaths[0].Queue] = d.Deaths[0]
		assert.Equal(t, "k", d.RoutingKey)
		assert.Equal(t, int16(7), d.Headers["h"])
	}
	assert.Equal(t, 4, byQueue["q0"].Attempts)
	assert.Equal(t, "fail q0 4", byQueue["q0"].LastError)
	assert.Equal(t, 2, byQueue["q1"].Attempts)
	assert.Equal(t, "fail q1 2", byQueue["q1"].LastError)
	assert.Equal(t, byQueue["q0"].MessageID, byQueue["q1"].MessageID)
}

// A durable queue bound to two exchanges gets messages whose IDs come from
// two sequences (both start at 1): acknowledging one must not acknowledge
// the other.
func TestDurableQueueOnTwoExchangesAcknowledgesEachApart(t *testing.T) {
	for _, ackFrom := range []string{"a", "b", "none"} {
		t.Run("ack from "+ackFrom, func(t *testing.T) {
			dir := t.TempDir()
			reg := func(m *tinymq.MQ, fn tinymq.ConsumerFunc) {
				require.NoError(t, m.RegisterQueue("a", tinymq.Fanout, fn, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
				require.NoError(t, m.Bind("q", "b", tinymq.Fanout))
			}
			m := tinymq.New(tinymq.WithDataDir(dir))
			acked := make(chan string, 10)
			entered := make(chan string, 10)
			reg(m, func(ctx context.Context, msg *tinymq.Msg) error {
				if msg.Exchange == ackFrom {
					acked <- msg.Exchange
					return nil
				}
				entered <- msg.Exchange
				<-ctx.Done()
				return ctx.Err()
			})
			require.NoError(t, m.Start(context.Background()))
			// The acknowledged one first: the other then blocks the only worker.
			if ackFrom == "b" {
				require.NoError(t, m.Publish("b", &numbered{N: 2}))
				require.NoError(t, m.Publish("a", &numbered{N: 1}))
			} else {
				require.NoError(t, m.Publish("a", &numbered{N: 1}))
				require.NoError(t, m.Publish("b", &numbered{N: 2}))
			}
			if ackFrom != "none" {
				recv(t, acked, 1)
			}
			recv(t, entered, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_ = m.Shutdown(ctx)
			cancel()
			stopWithin(t, m)
			ids := map[string]uint64{}
			m = tinymq.New(tinymq.WithDataDir(dir))
			got := make(chan *tinymq.Msg, 10)
			reg(m, sink(got))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("a", &numbered{N: 100}))
			var ns []int
			for {
				msg := recv(t, got, 1)[0]
				n, _ := numberOf(msg.Data)
				if n == 100 {
					break
				}
				ns = append(ns, n)
				ids[msg.Exchange] = msg.ID
			}
			stopWithin(t, m)
			var want []int
			if ackFrom != "a" {
				want = append(want, 1)
			}
			if ackFrom != "b" {
				want = append(want, 2)
			}
			sort.Ints(ns)
			assert.Equal(t, want, ns, "redelivered after the restart (IDs %v)", ids)
		})
	}
}

// Message IDs stay unique across restarts (README, Durability), whatever
// the exchange feeds, however many publish, wherever a restart lands in a
// block of reserved IDs, and after a failed reservation.
func TestIDsStayUniqueAcrossRestarts(t *testing.T) {
	// An exchange that only feeds in-memory queues, published to before Start.
	t.Run("in-memory exchange published before Start", func(t *testing.T) {
		dir := t.TempDir()
		var ids []uint64
		for range 2 {
			m := tinymq.New(tinymq.WithDataDir(dir))
			ch := make(chan *tinymq.Msg, 1)
			require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, sink(ch), 1))
			require.NoError(t, m.Publish("mem", 1))
			require.NoError(t, m.Start(context.Background()))
			ids = append(ids, recv(t, ch, 1)[0].ID)
			m.Stop()
		}
		assert.NotEqual(t, ids[0], ids[1])
	})
	// More than 10,000 messages, on a durable queue's exchange and on an
	// in-memory exchange of the same MQ, with clean stops, Shutdown
	// deadlines and publishes before Start.
	t.Run("durable and in-memory exchanges over 10000 messages", func(t *testing.T) {
		dir := t.TempDir()
		const procs, per = 5, 2200
		rec := &idRecorder{ids: map[string]map[uint64]int{}}
		record := rec.consumer
		for proc := range procs {
			m := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, record("ev"), 2, tinymq.WithQueueName("d"), tinymq.WithDurable()))
			require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, record("mem"), 2, tinymq.WithQueueName("m")))
			before := proc == 2
			if !before {
				require.NoError(t, m.Start(context.Background()))
			}
			var wg sync.WaitGroup
			for p := range 4 {
				wg.Go(func() {
					for i := p; i < per; i += 4 {
						n := proc*100000 + i
						if err := m.Publish("ev", &numbered{N: n}); err != nil {
							t.Errorf("Publish ev: %v", err)
							return
						}
						if err := m.Publish("mem", &numbered{N: n}); err != nil {
							t.Errorf("Publish mem: %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			if before {
				require.NoError(t, m.Start(context.Background()))
			}
			if proc == 3 {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				_ = m.Shutdown(ctx) // whatever is left of ev comes back next time
			}
			stopWithin(t, m)
		}
		// A last process drains what the Shutdown left.
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, record("ev"), 2, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, record("mem"), 2, tinymq.WithQueueName("m")))
		require.NoError(t, m.Start(context.Background()))
		stopWithin(t, m)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		assert.Empty(t, rec.problems)
		assert.Len(t, rec.ids["ev"], procs*per, "every durable message delivered once under a unique ID")
		// The in-memory exchange loses what Shutdown dropped, but never reuses an ID.
		assert.GreaterOrEqual(t, len(rec.ids["mem"]), (procs-1)*per)
	})
	// A single publisher's durable messages: delivered in publish order with
	// concurrency 1, IDs growing, across more than 10,000 messages and restarts.
	t.Run("one publisher in order with growing IDs", func(t *testing.T) {
		dir := t.TempDir()
		var lastID uint64
		next := 0
		for proc := range 3 {
			m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Millisecond))
			got := make(chan *tinymq.Msg, 5000)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
			require.NoError(t, m.Start(context.Background()))
			count := 4000
			first := next
			go func() {
				for i := range count {
					if err := m.Publish("ev", &numbered{N: first + i}); err != nil {
						t.Errorf("Publish: %v", err)
						return
					}
				}
			}()
			for i, msg := range recv(t, got, count) {
				n, _ := numberOf(msg.Data)
				if n != first+i || msg.ID <= lastID {
					t.Fatalf("process %d: message %d (ID %d) at position %d after ID %d", proc, n, msg.ID, first+i, lastID)
				}
				lastID = msg.ID
			}
			next += count
			stopWithin(t, m)
		}
	})
	// Many concurrent publishers crossing the half-block point (where one of
	// them joins the next reservation to its own batch) and whole blocks,
	// restarts at different points of a block, both sync policies, a Shutdown
	// that leaves durable messages for the next run: IDs never repeat.
	t.Run("many publishers across reservation blocks", func(t *testing.T) {
		dir := t.TempDir()
		rec := &idRecorder{ids: map[string]map[uint64]int{}}
		register := func(m *tinymq.MQ) {
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev"), 4, tinymq.WithQueueName("d"), tinymq.WithDurable()))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev-mem"), 2, tinymq.WithQueueName("evm")))
			require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, rec.consumer("mem"), 2, tinymq.WithQueueName("m")))
		}
		const publishers = 16
		durablePer := []int{150, 37, 260, 5} // per publisher and run: restarts land anywhere in a block
		published := 0
		for run, per := range durablePer {
			var opts []tinymq.Option
			opts = append(opts, tinymq.WithDataDir(dir), quiet())
			if run%2 == 1 {
				opts = append(opts, tinymq.WithSync(5*time.Millisecond))
			}
			m := tinymq.New(opts...)
			register(m)
			require.NoError(t, m.Start(context.Background()))
			var wg sync.WaitGroup
			for p := range publishers {
				wg.Go(func() {
					for i := range per {
						n := run*1_000_000 + p*10_000 + i
						if !assert.NoError(t, m.Publish("ev", n)) {
							return
						}
						for j := range 4 { // the in-memory exchange crosses several blocks per run
							if !assert.NoError(t, m.Publish("mem", n*10+j)) {
								return
							}
						}
					}
				})
			}
			wg.Wait()
			published += publishers * per
			if run == 2 {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				_ = m.Shutdown(ctx) // what is left of the durable queue comes back next run
			}
			stopWithin(t, m)
		}
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		register(m)
		require.NoError(t, m.Start(context.Background()))
		waitDrained(t, m, "d")
		stopWithin(t, m)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		assert.Empty(t, rec.problems)
		assert.Len(t, rec.ids["ev"], published, "every durable message delivered under its own ID")
	})
	// The publish whose batch carries the reservation ahead fails (the disk
	// is full): the reservation must not count, and after a restart no ID
	// repeats, neither of the messages on disk nor of those published before
	// the failure.
	t.Run("after a failed reservation commit", func(t *testing.T) {
		dir := t.TempDir()
		var fail atomic.Bool
		restore := tinymq.SetWALFaults(&wal.Faults{WriteErr: func(string) error {
			if fail.Load() {
				return syscall.ENOSPC
			}
			return nil
		}})
		rec := &idRecorder{ids: map[string]map[uint64]int{}}
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Hour), quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev"), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		restore() // the log is open
		// Not started: nothing is consumed, so each Publish is exactly one write
		// (the first one two: its reservation, then the message).
		const before = 2049 // IDs 1..2049; the reservation ahead joins ID 2050's batch
		for i := range before {
			require.NoError(t, m.Publish("ev", i))
		}
		fail.Store(true)
		require.ErrorIs(t, m.Publish("ev", -1), tinymq.ErrLog)
		fail.Store(false)
		require.ErrorIs(t, m.Publish("ev", -2), tinymq.ErrLog, "the log stays failed")
		stopWithin(t, m)

		m = tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev"), 2, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		for i := range 3000 {
			require.NoError(t, m.Publish("ev", 100_000+i))
		}
		waitDrained(t, m, "d")
		stopWithin(t, m)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		assert.Empty(t, rec.problems)
		assert.Len(t, rec.ids["ev"], before+3000)
		for id, n := range rec.ids["ev"] {
			if n >= 100_000 {
				assert.Greater(t, id, uint64(before), "a new ID reuses one of the previous run")
			}
		}
	})
}

// idRecorder records, per exchange, which payload each message ID carried.
type idRecorder struct {
	mu       sync.Mutex
	ids      map[string]map[uint64]int
	problems []string
}

func (r *idRecorder) consumer(ex string) tinymq.ConsumerFunc {
	return func(_ context.Context, msg *tinymq.Msg) error {
		n, ok := numberOf(msg.Data) // a *numbered, or one encoded
		if !ok {
			switch d := msg.Data.(type) {
			case int:
				n = d
			case tinymq.Encoded:
				if err := d.Decode(&n); err != nil {
					return tinymq.Permanent(err)
				}
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.ids[ex] == nil {
			r.ids[ex] = map[uint64]int{}
		}
		if prev, ok := r.ids[ex][msg.ID]; ok && prev != n {
			r.problems = append(r.problems, fmt.Sprintf("%s: ID %d carried %d and %d", ex, msg.ID, prev, n))
		}
		r.ids[ex][msg.ID] = n
		return nil
	}
}

// An MQ option cannot return an error, so an invalid one makes the calls
// that need it fail: a negative sync interval fails Start, and the
// RegisterQueue that would open the log, instead of being clamped to 0.
func TestNegativeSyncIntervalIsRefused(t *testing.T) {
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(-1))
	assert.ErrorIs(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrInvalidOption)
	m.Stop()
	m = tinymq.New(tinymq.WithSync(-1)) // no data directory: still a mistake
	assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrInvalidOption)
	m.Stop()
	m = tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(0))
	require.NoError(t, m.Start(context.Background()))
	m.Stop()
}

// leaveOnDisk publishes n messages, payload(i) (i itself if payload is nil),
// to the durable queue named queue on exchange "ev" of a new MQ in dir, and
// stops it before Start, so that all n stay in the log.
func leaveOnDisk(t *testing.T, dir, queue string, n int, payload func(i int) any) {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName(queue), tinymq.WithDurable()))
	for i := range n {
		var v any = i
		if payload != nil {
			v = payload(i)
		}
		require.NoError(t, m.Publish("ev", v))
	}
	require.ErrorIs(t, m.Shutdown(context.Background()), tinymq.ErrUndelivered)
}

// copyOfDataDir copies the files of dir but its LOCK into a new directory, as
// they are: what a crash of the process owning dir would leave (what the log
// wrote is in the operating system, synced or not).
func copyOfDataDir(t *testing.T, dir string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if e.Name() == "LOCK" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600))
	}
	return dst
}

// Acknowledgements are batched and never an fsync each, but an idle MQ still
// writes them without waiting for another publish: once ten messages are
// acknowledged and nothing else happens, a crash (a copy of the directory
// taken while the MQ runs) soon redelivers none of them.
func TestAcksOfAnIdleMQAreWrittenWithoutAnotherPublish(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	defer stopWithin(t, m)
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i))
	}
	afterACrash := func() int {
		crashed := tinymq.New(tinymq.WithDataDir(copyOfDataDir(t, dir)), quiet())
		require.NoError(t, crashed.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		defer crashed.Stop()
		return crashed.Stats().Queues["q"].Depth
	}
	require.Equal(t, 10, afterACrash(), "before Start, a crash keeps all ten")
	require.NoError(t, m.Start(context.Background()))
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Succeeded == 10 }, wait, time.Millisecond)
	deadline := time.Now().Add(settleWait)
	for {
		again := afterACrash()
		if again == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 10 messages acknowledged %v ago, with the MQ idle since, would be delivered again after a crash", again, settleWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A tail torn by a crash is cut on open without asking: a segment cut at any
// of its last bytes opens without WithLogRepair and restores every message
// but the torn one, redelivered.
func TestTornTailIsCutWithoutAsking(t *testing.T) {
	base := t.TempDir()
	leaveOnDisk(t, base, "q", 20, func(int) any { return strings.Repeat("m", 500) })
	segs, err := filepath.Glob(filepath.Join(base, "*.wal"))
	require.NoError(t, err)
	require.Len(t, segs, 1)
	data, err := os.ReadFile(segs[0])
	require.NoError(t, err)
	for cut := 1; cut <= 64; cut += 7 {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(segs[0])), data[:len(data)-cut], 0o600))
		m := tinymq.New(tinymq.WithDataDir(dir))
		got := make(chan *tinymq.Msg, 20)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()),
			"a tail torn %d bytes from the end", cut)
		n := m.Stats().Queues["q"].Depth
		assert.GreaterOrEqual(t, n, 19, "a tail torn %d bytes from the end", cut)
		require.NoError(t, m.Start(context.Background()))
		for _, msg := range recv(t, got, n) {
			assert.True(t, msg.Redelivered)
		}
		stopWithin(t, m)
	}
}

// A LOCK planted in the data directory as a symbolic link is never followed:
// the open is refused with ErrLog, and a file it points to is neither
// written, truncated nor chmodded, a missing target is not created, and a
// directory it points to stays empty.
func TestPlantedLockSymlinkIsNeverFollowed(t *testing.T) {
	for _, kind := range []string{"to a file", "dangling", "to a directory"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(t.TempDir(), "victim")
			switch kind {
			case "to a file":
				require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
			case "to a directory":
				require.NoError(t, os.Mkdir(victim, 0o755))
			}
			if err := os.Symlink(victim, filepath.Join(dir, "LOCK")); err != nil {
				t.Skipf("cannot create a symbolic link here: %v", err)
			}
			m := tinymq.New(tinymq.WithDataDir(dir))
			err := m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable())
			require.ErrorIs(t, err, tinymq.ErrLog)
			m.Stop()
			switch kind {
			case "to a file":
				b, err := os.ReadFile(victim)
				require.NoError(t, err)
				assert.Equal(t, "precious", string(b), "the victim was written")
				fi, err := os.Stat(victim)
				require.NoError(t, err)
				assert.Equal(t, fs.FileMode(0o644), fi.Mode().Perm(), "the victim was chmodded")
			case "dangling":
				_, err := os.Lstat(victim)
				assert.ErrorIs(t, err, fs.ErrNotExist, "the symlink's target was created")
			case "to a directory":
				ents, err := os.ReadDir(victim)
				require.NoError(t, err)
				assert.Empty(t, ents)
			}
		})
	}
}

// An open refused because the data directory cannot be one (a file is in
// its way) fails with ErrLog, not ErrLocked, changes nothing, and the same
// calls succeed once a directory is there, even one holding a stale LOCK
// that names a process that is gone.
func TestDataDirThatCannotBeOpenedIsRetriedOnceFixed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.WriteFile(dir, []byte("not a directory"), 0o600))
	m := tinymq.New(tinymq.WithDataDir(dir))
	durable := []tinymq.QueueOption{tinymq.WithQueueName("q"), tinymq.WithDurable()}
	for range 2 {
		err := m.RegisterQueue("ev", tinymq.Fanout, failing, 1, durable...)
		require.ErrorIs(t, err, tinymq.ErrLog)
		assert.NotErrorIs(t, err, tinymq.ErrLocked)
		assert.Empty(t, m.Topology().Queues)
	}
	require.ErrorIs(t, m.Start(context.Background()), tinymq.ErrLog)
	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "LOCK"), []byte("999999"), 0o600))
	got := make(chan *tinymq.Msg, 1)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, durable...))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	recv(t, got, 1)
	stopWithin(t, m)
}

// Many MQs racing to open one data directory, by Start or by a durable
// RegisterQueue: exactly one wins, every other gets ErrLocked, and once the
// winner stops each of them in turn opens it (no loser kept anything).
func TestRacingOpenersOneWinsTheOthersRetry(t *testing.T) {
	dir := t.TempDir()
	const n = 6
	open := func(m *tinymq.MQ, i int) error {
		if i%2 == 0 {
			return m.Start(context.Background())
		}
		return m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable())
	}
	mqs := make([]*tinymq.MQ, n)
	for i := range mqs {
		mqs[i] = tinymq.New(tinymq.WithDataDir(dir), quiet())
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range mqs {
		wg.Go(func() {
			<-start
			errs[i] = open(mqs[i], i)
		})
	}
	close(start)
	wg.Wait()
	winners := 0
	for i, err := range errs {
		if err == nil {
			winners++
			stopWithin(t, mqs[i])
		} else {
			require.ErrorIs(t, err, tinymq.ErrLocked, "loser %d", i)
		}
	}
	require.Equal(t, 1, winners)
	for i, err := range errs {
		if err != nil {
			require.NoError(t, open(mqs[i], i), "loser %d retrying", i)
			stopWithin(t, mqs[i])
		}
	}
}

// A Shutdown deadline that passes while durable publishes wait for their
// fdatasync: a publish whose record reached the log returns nil and counts as
// undelivered (it comes back after a restart), one that returned ErrStopped
// never comes back, Shutdown reports the loss, and the ledger is exact. (One
// whose write the deadline's closing of the log cut short gets ErrLog: it
// may still be on disk, as the README says.)
func TestShutdownDeadlineRacingDurablePublishesAccountsForEach(t *testing.T) {
	for round := range 3 {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		var mu sync.Mutex
		accepted, stopped, logErr := map[int]bool{}, map[int]bool{}, map[int]bool{}
		var n atomic.Int64
		flowing := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for i := 0; ; i++ {
					v := int(n.Add(1))
					err := m.Publish("ev", v)
					mu.Lock()
					switch {
					case err == nil:
						accepted[v] = true
					case errors.Is(err, tinymq.ErrLog):
						logErr[v] = true
					default:
						assert.ErrorIs(t, err, tinymq.ErrStopped)
						stopped[v] = true
					}
					mu.Unlock()
					if err != nil {
						return
					}
					if i == 5 {
						flowing <- struct{}{}
					}
				}
			})
		}
		recv(t, flowing, 16)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(round)*time.Millisecond)
		serr := m.Shutdown(ctx)
		cancel()
		wg.Wait()
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(len(accepted)), st.Accepted, "round %d: every nil publish is accepted", round)
		assert.Equal(t, st.Accepted, st.Succeeded+st.Undelivered, "round %d: %+v", round, st)
		if st.Undelivered > 0 {
			assert.ErrorIs(t, serr, tinymq.ErrUndelivered, "round %d: Shutdown reports what it left undelivered", round)
		}

		m = tinymq.New(tinymq.WithDataDir(dir))
		got := make(chan *tinymq.Msg, len(accepted)+len(stopped)+len(logErr))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		m.Stop()
		close(got)
		for d := range got {
			var v int
			require.NoError(t, d.Data.(tinymq.Encoded).Decode(&v))
			assert.False(t, stopped[v], "round %d: message %d, refused with ErrStopped, was delivered after the restart", round, v)
			assert.True(t, accepted[v] || logErr[v], "round %d: message %d was never published", round, v)
		}
	}
}

// A durable MQ works inside a testing/synctest bubble, and so does one
// outside it afterwards: nothing the log made in the bubble (a channel) is
// handed to a log outside it.
func TestDurableMQWorksInsideAndAfterASynctestBubble(t *testing.T) {
	run := func(t *testing.T, dir string) {
		m := tinymq.New(quiet(), tinymq.WithDataDir(dir))
		got := make(chan *tinymq.Msg, 8)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		for i := range 4 {
			require.NoError(t, m.Publish("ev", i))
		}
		recv(t, got, 4)
		m.Stop()
	}
	for range 3 {
		synctest.Test(t, func(t *testing.T) { run(t, t.TempDir()) })
		run(t, t.TempDir())
	}
}

// Concurrent durable publishes share the buffers they encode their records
// in (and the log's requests): a buffer reused while a record or a body
// still pointed into it would corrupt another message. Every message of 16
// concurrent publishers, with distinct bodies of every size (the ones from
// 64 KiB are written straight into the log's batch), routing keys and
// headers, reaches its consumer byte for byte, still so once every publish
// has returned, and comes back byte for byte after a restart: through a
// record shared by two durable queues, and alone in one.
func TestConcurrentDurablePublishesKeepEveryByte(t *testing.T) {
	const publishers = 16
	each := 60
	if raceEnabled {
		each = 20 // the race detector makes each 70 KB body cost milliseconds; every size and path still comes by
	}
	type key struct{ p, i int }
	// payload is message i of publisher p: its Data, and what Encoded.Body
	// must hold (JSONCodec's encoding, or an Encoded's own bytes).
	makePayload := func(p, i int) (data any, body []byte) {
		n := (p*131 + i*71) % 700
		if i%10 == 4 || i%20 == 7 { // through both exchanges
			n = 70_000 + p // from 64 KiB: encoded in the log's batch
		}
		b := make([]byte, n)
		x := uint32(p*1000 + i + 1)
		for j := range b {
			x = x*1664525 + 1013904223
			b[j] = byte(x >> 24)
		}
		switch i % 3 {
		case 0:
			data = b
		case 1:
			data = string(b)
		default:
			enc, err := json.Marshal(string(b))
			require.NoError(t, err)
			return tinymq.Encoded{Body: enc}, append([]byte(nil), enc...) // a copy: compared apart from what was published
		}
		body, err := json.Marshal(data)
		require.NoError(t, err)
		return data, body
	}
	// Made once, before anything runs, and only read after: the checks
	// compare each message three times.
	type made struct {
		data any
		body []byte
	}
	payloads := make([][]made, publishers)
	for p := range payloads {
		payloads[p] = make([]made, each)
		for i := range each {
			payloads[p][i].data, payloads[p][i].body = makePayload(p, i)
		}
	}
	payload := func(p, i int) (any, []byte) { return payloads[p][i].data, payloads[p][i].body }
	exchangeOf := func(i int) string { return [2]string{"ev", "solo"}[i%2] }
	type got struct {
		queue string
		k     key
		msg   *tinymq.Msg
	}
	// check checks msg against what was published, and returns its key.
	check := func(t *testing.T, queue string, msg *tinymq.Msg) key {
		k := key{msg.Headers["p"].(int), msg.Headers["i"].(int)}
		_, want := payload(k.p, k.i)
		assert.Equal(t, fmt.Sprintf("rk-%d-%d", k.p, k.i), msg.RoutingKey, "%s: message %v", queue, k)
		enc, ok := msg.Data.(tinymq.Encoded)
		if assert.True(t, ok, "%s: message %v: Data is %T", queue, k, msg.Data) {
			assert.True(t, string(want) == string(enc.Body), "%s: message %v: the body differs from what was published", queue, k)
		}
		return k
	}
	consumer := func(queue string, ch chan<- got) tinymq.ConsumerFunc {
		return func(_ context.Context, msg *tinymq.Msg) error {
			ch <- got{queue, check(t, queue, msg), msg}
			return nil
		}
	}

	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(discardLogger))
	seen := make(chan got, publishers*each)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consumer("seen", seen), 4,
		tinymq.WithQueueName("seen"), tinymq.WithDurable()))
	// No consumer: what they hold stays in the log for the restart.
	require.NoError(t, m.DeclareQueue("kept", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.DeclareQueue("solo", "solo", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				data, _ := payload(p, i)
				err := m.Publish(exchangeOf(i), data, tinymq.WithRoutingKey(fmt.Sprintf("rk-%d-%d", p, i)),
					tinymq.WithHeaders(map[string]any{"p": p, "i": i}))
				if !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	wg.Wait()
	delivered := recv(t, seen, publishers*each/2)
	stopWithin(t, m)
	// Every publish has returned and its buffers are back in their pools and
	// reused: what the consumers kept must not have changed.
	keys := map[key]bool{}
	for _, g := range delivered {
		assert.Equal(t, g.k, check(t, g.queue, g.msg), "re-checked once every publish returned")
		assert.False(t, keys[g.k], "message %v delivered twice", g.k)
		keys[g.k] = true
	}

	m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(discardLogger))
	back := make(chan got, 2*publishers*each)
	for _, q := range []struct{ name, exchange string }{{"seen", "ev"}, {"kept", "ev"}, {"solo", "solo"}} {
		require.NoError(t, m.RegisterQueue(q.exchange, tinymq.Fanout, consumer(q.name, back), 4,
			tinymq.WithQueueName(q.name), tinymq.WithDurable()))
	}
	require.NoError(t, m.Start(context.Background()))
	redelivered := recv(t, back, publishers*each)
	stopWithin(t, m)
	assert.Empty(t, back, "more messages came back than were left unacknowledged")
	byQueue := map[string]map[key]bool{}
	for _, g := range redelivered {
		assert.Equal(t, g.k, check(t, g.queue, g.msg), "re-checked after the restart")
		assert.True(t, g.msg.Redelivered)
		if byQueue[g.queue] == nil {
			byQueue[g.queue] = map[key]bool{}
		}
		assert.False(t, byQueue[g.queue][g.k], "%s: message %v came back twice", g.queue, g.k)
		byQueue[g.queue][g.k] = true
	}
	assert.Empty(t, byQueue["seen"], "an acknowledged message came back")
	for p := range publishers {
		for i := range each {
			q := map[string]string{"ev": "kept", "solo": "solo"}[exchangeOf(i)]
			assert.True(t, byQueue[q][key{p, i}], "%s: message %v did not come back", q, key{p, i})
		}
	}
}
