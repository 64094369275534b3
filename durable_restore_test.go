package tinymq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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

// These tests cover what a durable queue restores after a restart: it keeps
// the messages on disk and reads each one when it is delivered or
// dead-lettered, so what reaches the consumer must be what was published.

type restorePayload struct {
	N int
	S string
}

// restoreMsgs collects messages, safe for concurrent consumers.
type restoreMsgs struct {
	mu   sync.Mutex
	msgs []*tinymq.Msg
}

func (r *restoreMsgs) add(m *tinymq.Msg) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
}

func (r *restoreMsgs) get() []*tinymq.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

func (r *restoreMsgs) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *restoreMsgs) consumer() tinymq.ConsumerFunc {
	return func(_ context.Context, m *tinymq.Msg) error {
		r.add(m)
		return nil
	}
}

// restoreQuiet is a logger for MQs whose losses are expected.
var restoreQuiet = tinymq.WithLogger(slog.New(slog.DiscardHandler))

// restoreData returns m's payload, decoded when it is an Encoded.
func restoreData(t *testing.T, m *tinymq.Msg) restorePayload {
	t.Helper()
	switch d := m.Data.(type) {
	case restorePayload:
		return d
	case tinymq.Encoded:
		var p restorePayload
		require.NoError(t, d.Decode(&p))
		return p
	}
	t.Fatalf("message %d: Data is a %T", m.ID, m.Data)
	return restorePayload{}
}

// requireSameMsg checks that got, delivered after a restart, carries what
// want, its copy before the restart, did.
func requireSameMsg(t *testing.T, want, got *tinymq.Msg) {
	t.Helper()
	assert.Equal(t, want.ID, got.ID)
	assert.Equal(t, want.Exchange, got.Exchange, "message %d: Exchange", want.ID)
	assert.Equal(t, want.RoutingKey, got.RoutingKey, "message %d: RoutingKey", want.ID)
	assert.Equal(t, want.Headers, got.Headers, "message %d: Headers", want.ID)
	assert.Equal(t, restoreData(t, want), restoreData(t, got), "message %d: Data", want.ID)
	require.Len(t, got.Deaths, len(want.Deaths), "message %d: Deaths", want.ID)
	for i, d := range want.Deaths {
		g := got.Deaths[i]
		assert.True(t, d.Time.Equal(g.Time), "message %d: death %d at %v, want %v", want.ID, i, g.Time, d.Time)
		d.Time, g.Time = time.Time{}, time.Time{}
		assert.Equal(t, d, g, "message %d: death %d", want.ID, i)
	}
}

// restoreHeaders are headers of every kind the log keeps, varied by i.
func restoreHeaders(i int) map[string]any {
	return map[string]any{
		"i": i, "i8": int8(-i), "u16": uint16(i), "i64": int64(i) << 40, "f": float64(i) / 4, "f32": float32(i),
		"s": fmt.Sprint("h", i), "b": []byte{byte(i), 0}, "ok": i%2 == 0, "nil": nil,
		"nested": map[string]any{"list": []any{"x", int32(i), map[string]any{"deep": uint64(i)}}},
	}
}

// TestRestoreDeliversWhatWasPublished: a backlog left in the log by a
// Shutdown deadline comes back, after a restart, with the data, headers,
// deaths, routing key and ID each message had, as its first attempt,
// marked redelivered, and with one worker in the order it was published.
func TestRestoreDeliversWhatWasPublished(t *testing.T) {
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency=%d", concurrency), func(t *testing.T) {
			dir := t.TempDir()
			const n = 60
			// Run 1: the durable queue's consumer holds its first message
			// until the deadline; an in-memory mirror sees what was queued.
			m := tinymq.New(tinymq.WithDataDir(dir), restoreQuiet)
			mirror := &restoreMsgs{}
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
				<-ctx.Done()
				return ctx.Err()
			}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, mirror.consumer(), 1, tinymq.WithQueueName("mirror")))
			require.NoError(t, m.RegisterQueue("src", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				return tinymq.Permanent(errors.New("refused"))
			}, 1, tinymq.WithQueueName("s"), tinymq.WithDeadLetter("ev", "")))
			require.NoError(t, m.Start(context.Background()))
			for i := range n {
				p := restorePayload{N: i, S: fmt.Sprint("payload ", i)}
				opts := []tinymq.PublishOption{tinymq.WithRoutingKey(fmt.Sprint("key.", i))}
				if i%4 != 1 {
					opts = append(opts, tinymq.WithHeaders(restoreHeaders(i)))
				}
				exchange := "ev"
				if i%3 == 0 {
					exchange = "src" // reaches q as a dead letter, with a death
				}
				require.NoError(t, m.Publish(exchange, p, opts...))
				require.Eventually(t, func() bool { return mirror.len() == i+1 }, wait, time.Millisecond)
			}
			require.Eventually(t, func() bool { return m.Stats().Queues["q"].InFlight == 1 }, wait, time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			err := m.Shutdown(ctx)
			cancel()
			require.ErrorIs(t, err, tinymq.ErrUndelivered)

			// Run 2: everything comes back from the log.
			got := &restoreMsgs{}
			m = tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, got.consumer(), concurrency,
				tinymq.WithQueueName("q"), tinymq.WithDurable()))
			qs := m.Stats().Queues["q"]
			require.Equal(t, n, qs.Depth)
			require.Equal(t, n, qs.Ready)
			require.NoError(t, m.Start(context.Background()))
			require.Eventually(t, func() bool { return got.len() == n }, wait, time.Millisecond)
			m.Stop()
			qs = m.Stats().Queues["q"]
			assert.Equal(t, uint64(n), qs.Accepted)
			assert.Equal(t, uint64(n), qs.Succeeded)

			want := mirror.get()
			byID := make(map[uint64]*tinymq.Msg, n)
			for _, g := range got.get() {
				assert.Equal(t, 1, g.Attempt, "message %d", g.ID)
				assert.True(t, g.Redelivered, "message %d", g.ID)
				assert.Equal(t, "q", g.Queue)
				byID[g.ID] = g
			}
			require.Len(t, byID, n, "a message was delivered twice")
			for _, w := range want {
				g := byID[w.ID]
				require.NotNil(t, g, "message %d was not delivered", w.ID)
				requireSameMsg(t, w, g)
			}
			if concurrency == 1 {
				var wantIDs, gotIDs []uint64
				for _, w := range want {
					wantIDs = append(wantIDs, w.ID)
				}
				for _, g := range got.get() {
					gotIDs = append(gotIDs, g.ID)
				}
				assert.Equal(t, wantIDs, gotIDs, "delivery order after the restart")
			}
		})
	}
}

// restorePublishBacklog publishes n messages (payload N = i, routing key
// key.i, headers of kind i, and the options extra(i) gives, if any) to a
// durable queue q of exchange ev in a new MQ in dir, with nothing consuming
// them, and stops it before Start: they stay in the log. It returns the
// messages as published, in order.
func restorePublishBacklog(t *testing.T, dir string, n int, extra func(i int) []tinymq.PublishOption) []*tinymq.Msg {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), restoreQuiet)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	var want []*tinymq.Msg
	for i := range n {
		p := restorePayload{N: i, S: fmt.Sprint("payload ", i)}
		opts := []tinymq.PublishOption{tinymq.WithRoutingKey(fmt.Sprint("key.", i)), tinymq.WithHeaders(restoreHeaders(i))}
		if extra != nil {
			opts = append(opts, extra(i)...)
		}
		require.NoError(t, m.Publish("ev", p, opts...))
		// A new data directory: the exchange's IDs start at 1.
		want = append(want, &tinymq.Msg{ID: uint64(i + 1), Exchange: "ev", RoutingKey: fmt.Sprint("key.", i),
			Headers: restoreHeaders(i), Data: p})
	}
	m.Stop()
	return want
}

// TestRestoreExpiredAtHeadDeadLettersWithData: a restored message whose TTL
// (counted from its publish, before the restart) passes while it waits at the
// head of its queue, behind a busy consumer, is dead-lettered with its data,
// headers and routing key.
func TestRestoreExpiredAtHeadDeadLettersWithData(t *testing.T) {
	dir := t.TempDir()
	// Message 1 has no TTL and holds the only worker; 2 and 3 expire.
	const ttl = 300 * time.Millisecond
	published := time.Now()
	want := restorePublishBacklog(t, dir, 3, func(i int) []tinymq.PublishOption {
		if i == 0 {
			return nil
		}
		return []tinymq.PublishOption{tinymq.WithExpiration(ttl)}
	})
	m := tinymq.New(tinymq.WithDataDir(dir), restoreQuiet)
	dead := &restoreMsgs{}
	require.NoError(t, m.RegisterQueue("dead", tinymq.Fanout, dead.consumer(), 1, tinymq.WithQueueName("dq")))
	release := make(chan struct{})
	var first atomic.Pointer[tinymq.Msg]
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		first.Store(msg)
		<-release
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithDeadLetter("dead", "")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	require.Eventually(t, func() bool { return dead.len() == 2 }, wait, time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(published), ttl)
	require.NotNil(t, first.Load())
	requireSameMsg(t, want[0], first.Load())
	for i, d := range dead.get() {
		w := want[i+1]
		require.NotEmpty(t, d.Deaths)
		assert.Equal(t, tinymq.ReasonExpired, d.Deaths[0].Reason)
		assert.Equal(t, w.ID, d.Deaths[0].MessageID)
		d.Deaths = nil
		d.ID = w.ID
		d.Exchange = w.Exchange
		requireSameMsg(t, w, d)
	}
	close(release)
	require.Eventually(t, func() bool {
		qs := m.Stats().Queues["q"]
		return qs.Succeeded == 1 && qs.Expired == 2 && qs.DeadLettered == 2 && qs.Depth == 0
	}, wait, time.Millisecond)
}

// TestRestoreDropHeadEvictsWithData: a length limit applied to a restored
// backlog (at restore, and by a publish after it) dead-letters the oldest
// messages with their data, in order, and delivers the newest.
func TestRestoreDropHeadEvictsWithData(t *testing.T) {
	dir := t.TempDir()
	const n, limit = 10, 3
	want := restorePublishBacklog(t, dir, n, nil)
	m := tinymq.New(tinymq.WithDataDir(dir), restoreQuiet)
	dead, got := &restoreMsgs{}, &restoreMsgs{}
	require.NoError(t, m.RegisterQueue("dead", tinymq.Fanout, dead.consumer(), 1, tinymq.WithQueueName("dq")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, got.consumer(), 1, tinymq.WithQueueName("q"), tinymq.WithDurable(),
		tinymq.WithMaxLen(limit, tinymq.DropHead), tinymq.WithDeadLetter("dead", "")))
	qs := m.Stats().Queues["q"]
	require.Equal(t, limit, qs.Depth)
	// One more publish evicts the oldest restored message left.
	require.NoError(t, m.Publish("ev", restorePayload{N: n, S: "new"}, tinymq.WithRoutingKey("new")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	evicted := n - limit + 1
	require.Eventually(t, func() bool { return dead.len() == evicted && got.len() == limit }, wait, time.Millisecond)
	for i, d := range dead.get() {
		w := want[i]
		require.NotEmpty(t, d.Deaths)
		assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
		assert.Equal(t, w.ID, d.Deaths[0].MessageID)
		d.Deaths, d.ID, d.Exchange = nil, w.ID, w.Exchange
		requireSameMsg(t, w, d)
	}
	gotMsgs := got.get()
	for i, g := range gotMsgs[:limit-1] {
		requireSameMsg(t, want[evicted+i], g)
	}
	assert.Equal(t, restorePayload{N: n, S: "new"}, restoreData(t, gotMsgs[limit-1]))
	m.Stop() // the counts are exact once the queue is idle: the consumer saw the last message before it was counted
	qs = m.Stats().Queues["q"]
	assert.Equal(t, uint64(evicted), qs.Overflowed)
	assert.Equal(t, uint64(evicted), qs.DeadLettered)
	assert.Equal(t, qs.Accepted, qs.Succeeded+qs.DeadLettered+qs.Dropped+qs.Undelivered)
}

// restoreLog is a slog handler's output, safe for concurrent use.
type restoreLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *restoreLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *restoreLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestRestoreReadFailureStaysOnDisk: when a restored message cannot be read
// back from the log as it is delivered, it is counted undelivered (the
// ledger holds), logged, never acknowledged, and delivered after the next
// restart.
func TestRestoreReadFailureStaysOnDisk(t *testing.T) {
	dir := t.TempDir()
	const n = 5
	want := restorePublishBacklog(t, dir, n, nil)

	var fail atomic.Bool
	restore := tinymq.SetWALFaults(&wal.Faults{ReadErr: func(string) error {
		if fail.Load() {
			return syscall.EIO
		}
		return nil
	}})
	logs := &restoreLog{}
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	got := &restoreMsgs{}
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, got.consumer(), 2, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	restore()
	fail.Store(true) // the log is open and recovered: the reads of deliveries fail
	require.NoError(t, m.Start(context.Background()))
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Undelivered == n }, wait, time.Millisecond)
	m.Stop()
	qs := m.Stats().Queues["q"]
	assert.Zero(t, got.len())
	assert.Equal(t, uint64(n), qs.Accepted)
	assert.Zero(t, qs.Delivered)
	assert.Zero(t, qs.Depth)
	assert.Equal(t, qs.Accepted, qs.Succeeded+qs.DeadLettered+qs.Dropped+qs.Undelivered)
	assert.Contains(t, logs.String(), "reading a durable message from the log failed")
	assert.Contains(t, logs.String(), "input/output error")

	m = tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, got.consumer(), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	require.Eventually(t, func() bool { return got.len() == n }, wait, time.Millisecond)
	m.Stop()
	for i, g := range got.get() {
		requireSameMsg(t, want[i], g)
	}
}

// TestRestoreHeapIsBoundedByDisk: a restored backlog keeps its messages on
// disk, so the heap grows by less than twice the live log's size (RabbitMQ's
// classic queues keep the same: an index in memory, the messages on disk).
func TestRestoreHeapIsBoundedByDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 100k durable messages")
	}
	if raceEnabled {
		t.Skip("the race detector changes what the heap holds")
	}
	dir := t.TempDir()
	const n = 100_000
	disk := restoreBuildBacklog(t, dir, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := tinymq.New(tinymq.WithDataDir(dir), restoreQuiet)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.Equal(t, n, m.Stats().Queues["q"].Depth)
	runtime.GC()
	runtime.ReadMemStats(&after)
	m.Stop() // before Start: the messages stay in the log
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d bytes (%.0f per message) for %d bytes on disk: %.2fx", grown, float64(grown)/n, disk, float64(grown)/float64(disk))
	assert.Less(t, float64(grown)/float64(disk), 2.0, "heap per byte of log")
}

// restoreBuildBacklog publishes n messages of 64 bytes to a durable queue of
// a new MQ in dir, with nothing consuming them, stops it, and returns the
// size of the log on disk. Apart, so that nothing of that MQ stays reachable.
func restoreBuildBacklog(t *testing.T, dir string, n int) int64 {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Hour), restoreQuiet)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()))
	payload := tinymq.Encoded{Body: make([]byte, 64)}
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Go(func() {
			for i := p; i < n; i += 8 {
				if err := m.Publish("ev", payload); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	m.Stop()
	var disk int64
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if info, err := e.Info(); err == nil && filepath.Ext(e.Name()) == ".wal" {
			disk += info.Size()
		}
	}
	return disk
}
