package tinymq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
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
func TestDurableMessagesSurviveARestart(t *testing.T) {
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
func TestOnlyUnacknowledgedMessagesComeBack(t *testing.T) {
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
// directory, and its retry succeeds once the owner has stopped (it used to
// return the first ErrLocked forever while holding the lock).
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
	a.Stop()

	got := make(chan *tinymq.Msg, 1)
	require.NoError(t, b.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, durable...), "the retry succeeds once the owner stopped")
	require.NoError(t, b.Start(context.Background()))
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

// A durable queue's backlog stays visible in Stats, and on disk, while a
// queue of its name is registered in memory.
func TestDurableBacklogUnderAnInMemoryQueueStaysVisible(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	for i := range 3 {
		require.NoError(t, m.Publish("ev", i))
	}
	_ = m.Shutdown(context.Background()) // before Start: they stay on disk

	m = tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	st := m.Stats().Queues["q"]
	assert.Equal(t, 3, st.Stored, "the backlog is shown")
	assert.False(t, st.Durable)
	assert.Zero(t, st.Depth, "the in-memory queue does not have them")
	m.Stop()

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
// RejectPublish keeps them all and refuses publishes until there is room.
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
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(),
			tinymq.WithMaxLen(10, tinymq.RejectPublish)))
		assert.Equal(t, 50, m.Stats().Queues["q"].Depth, "all are kept")
		assert.ErrorIs(t, m.Publish("ev", 50), tinymq.ErrQueueFull)
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
func TestRetryAttemptsSurviveARestart(t *testing.T) {
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

// IDs stay unique across restarts also for an exchange that only feeds
// in-memory queues and is published to before Start.
func TestIDsStayUniqueWhenPublishedBeforeStart(t *testing.T) {
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
}

// Once Shutdown returned at its deadline, the data directory is free, even
// while a consumer that ignores its context still runs.
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
	require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	got := make(chan *tinymq.Msg, 1)
	err := m2.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable())
	close(release)
	m.Stop()
	require.NoError(t, err)
	require.NoError(t, m2.Start(context.Background()))
	assert.True(t, recv(t, got, 1)[0].Redelivered, "its acknowledgement came after the log closed")
	m2.Stop()
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
// []byte within the limit whose JSON encoding is not is refused too.
func TestDurableMaxMessageSize(t *testing.T) {
	var marshals atomic.Int32
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithMaxMessageSize(1000),
		tinymq.WithCodec(countingCodec{marshals: &marshals}))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
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
	require.Equal(t, 2, m.Stats().Queues["q"].Depth, "the queue holds only the messages accepted")

	j := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithMaxMessageSize(1000))
	require.NoError(t, j.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	defer j.Stop()
	require.ErrorIs(t, j.Publish("ev", make([]byte, 900)), tinymq.ErrTooLarge, "JSONCodec encodes 900 bytes in 1202")
	require.NoError(t, j.Publish("ev", make([]byte, 700)), "JSONCodec encodes 700 bytes in 936")
}

// A message routed to two durable queues comes back only to the queue that
// had not acknowledged it, after a restart, in publish order; once both have,
// a third start finds nothing.
func TestDurableAcksOfSharedMessagesSurviveARestart(t *testing.T) {
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
