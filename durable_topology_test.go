package tinymq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

// The run-time topology of durable queues is in the log: a delete, a purge,
// a declare and an expiry are records, so that a restart (and a crash: see
// TestDurableTopologySurvivesPowerLoss here, and internal/durabletest for
// kill -9) finds the queues as they were left.

// topoInt is the int that a durable message carries.
func topoInt(t testing.TB, m *tinymq.Msg) int {
	e, ok := m.Data.(tinymq.Encoded)
	if !ok {
		t.Errorf("Data of message %d is %T, not Encoded", m.ID, m.Data)
		return -1
	}
	var n int
	if err := e.Decode(&n); err != nil {
		t.Errorf("message %d: %v", m.ID, err)
		return -1
	}
	return n
}

// topoGot records the ints each queue delivered.
type topoGot struct {
	mu sync.Mutex
	by map[string][]int
}

func (g *topoGot) consumer(t testing.TB) tinymq.ConsumerFunc {
	return func(_ context.Context, m *tinymq.Msg) error {
		n := topoInt(t, m)
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.by == nil {
			g.by = make(map[string][]int)
		}
		g.by[m.Queue] = append(g.by[m.Queue], n)
		return nil
	}
}

func (g *topoGot) of(queue string) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.by[queue])
}

// topoDecl is a durable queue bound to a fanout exchange, as topoDrain
// declares it.
type topoDecl struct {
	queue, exchange string
	opts            []tinymq.QueueOption
}

// topoDrained is what topoDrain found in each queue: what it delivered, in
// order, and how many messages wait for a retry or a delay due later.
type topoDrained struct {
	got       map[string][]int
	scheduled map[string]int
}

// topoDrain opens dir, declares the durable queues (each one's backlog is
// restored), consumes them at concurrency 1 until nothing is ready or in a
// consumer, and stops, leaving what is scheduled later in the log.
func topoDrain(t *testing.T, dir string, decls ...topoDecl) topoDrained {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	var g topoGot
	for _, d := range decls {
		require.NoError(t, m.DeclareQueue(d.queue, d.exchange, tinymq.Fanout, append(slices.Clone(d.opts), tinymq.WithDurable())...))
		_, err := m.Consume(d.queue, g.consumer(t), 1)
		require.NoError(t, err)
	}
	require.NoError(t, m.Start(context.Background()))
	out := topoDrained{got: make(map[string][]int), scheduled: make(map[string]int)}
	require.Eventually(t, func() bool {
		st := m.Stats()
		for _, d := range decls {
			// Every message that is not scheduled later has succeeded.
			q := st.Queues[d.queue]
			if q.Ready != 0 || q.InFlight != 0 || q.Succeeded+uint64(q.Scheduled) != q.Accepted {
				return false
			}
			out.scheduled[d.queue] = q.Scheduled
		}
		return true
	}, wait, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_ = m.Shutdown(ctx) // ErrUndelivered when something is scheduled later: it stays in the log
	stopWithin(t, m)
	for _, d := range decls {
		out.got[d.queue] = g.of(d.queue)
	}
	return out
}

func topoSeq(a, b int) []int {
	var out []int
	for i := a; i < b; i++ {
		out = append(out, i)
	}
	return out
}

// A deleted durable queue stays deleted after a restart: declaring it again
// gets none of its old messages, neither those that waited (ready, or
// waiting for a retry) nor those that were in a consumer at the delete,
// whether their delivery succeeded or failed after it; another durable
// queue that got the same messages keeps its copies, and once it has
// acknowledged them nothing is left.
func TestDeletedDurableQueueStaysDeleted(t *testing.T) {
	dir := t.TempDir()
	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("del", "ev", tinymq.Fanout, tinymq.WithDurable(), retry))
	require.NoError(t, m.DeclareQueue("keep", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := range 20 {
		require.NoError(t, m.Publish("ev", i))
	}
	release := make(chan struct{})
	entered := make(chan int, 20)
	_, err := m.Consume("del", func(_ context.Context, msg *tinymq.Msg) error {
		n := topoInt(t, msg)
		if n == 0 && msg.Attempt == 1 {
			return errors.New("retried in an hour")
		}
		entered <- n
		<-release
		if n%2 == 0 {
			return errors.New("fails after the delete")
		}
		return nil
	}, 2)
	require.NoError(t, err)
	inFlight := recv(t, entered, 2)
	require.Eventually(t, func() bool { return m.Stats().Queues["del"].Scheduled == 1 }, wait, time.Millisecond)
	removed, err := m.DeleteQueue("del")
	require.NoError(t, err)
	assert.Equal(t, 18, removed, "the waiting ones (%v were in the consumer)", inFlight)
	close(release)
	require.Eventually(t, func() bool { return m.Stats().Deleted.InFlight == 0 }, wait, time.Millisecond)
	stopWithin(t, m)

	d := topoDrain(t, dir, topoDecl{"del", "ev", nil}, topoDecl{"keep", "ev", nil})
	assert.Empty(t, d.got["del"], "nothing of the deleted queue comes back")
	assert.Zero(t, d.scheduled["del"], "not the retried one either")
	assert.Equal(t, topoSeq(0, 20), d.got["keep"], "the other queue keeps its copies")

	d = topoDrain(t, dir, topoDecl{"del", "ev", nil}, topoDecl{"keep", "ev", nil})
	assert.Empty(t, d.got["del"])
	assert.Empty(t, d.got["keep"], "acknowledged by the queue that kept them: gone")
}

// A durable queue deleted and declared again, in one run or after a restart,
// and deleted twice, gets after a restart only the messages published to its
// latest declaration.
func TestDurableQueueDeclaredAgainAfterItsDeleteGetsOnlyItsOwnMessages(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	for round := range 3 {
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		for i := range 5 {
			require.NoError(t, m.Publish("ev", round*5+i))
		}
		if round < 2 {
			n, err := m.DeleteQueue("q")
			require.NoError(t, err)
			require.Equal(t, 5, n)
		}
	}
	stopWithin(t, m)

	// After a restart: its backlog is the third declaration's; deleted
	// again with it, and declared again once more.
	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	assert.Equal(t, 5, m.Stats().Queues["q"].Depth, "the third declaration's backlog")
	n, err := m.DeleteQueue("q")
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Publish("ev", 100))
	stopWithin(t, m)

	d := topoDrain(t, dir, topoDecl{"q", "ev", nil})
	assert.Equal(t, []int{100}, d.got["q"])
}

// A message that two durable queues got comes back, after the delete of one
// of them in a later run, only in the other.
func TestMessageOfTwoDurableQueuesComesBackOnlyInTheOneNotDeleted(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("a", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.DeclareQueue("b", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i))
	}
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("a", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.DeclareQueue("b", "ev", tinymq.Fanout, tinymq.WithDurable()))
	n, err := m.DeleteQueue("a") // its restored backlog
	require.NoError(t, err)
	require.Equal(t, 10, n)
	stopWithin(t, m)

	d := topoDrain(t, dir, topoDecl{"a", "ev", nil}, topoDecl{"b", "ev", nil})
	assert.Empty(t, d.got["a"])
	assert.Equal(t, topoSeq(0, 10), d.got["b"])
	d = topoDrain(t, dir, topoDecl{"a", "ev", nil}, topoDecl{"b", "ev", nil})
	assert.Empty(t, d.got["a"])
	assert.Empty(t, d.got["b"])
}

// A purged durable message never comes back: the ready ones, those waiting
// for a retry or a delay, and a backlog restored before the purge. A
// message in a consumer at the purge is not purged, and messages published
// after it stay.
func TestPurgedDurableMessagesNeverComeBack(t *testing.T) {
	t.Run("waiting, retrying and delayed", func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.DeclareQueue("p", "ev", tinymq.Fanout, tinymq.WithDurable(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})))
		require.NoError(t, m.Start(context.Background()))
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i))
		}
		for i := range 3 {
			require.NoError(t, m.Publish("ev", 100+i, tinymq.WithDelay(time.Hour)))
		}
		release := make(chan struct{})
		entered := make(chan int, 1)
		_, err := m.Consume("p", func(_ context.Context, msg *tinymq.Msg) error {
			n := topoInt(t, msg)
			if n == 0 && msg.Attempt == 1 {
				return errors.New("retried in an hour")
			}
			entered <- n
			<-release
			return nil
		}, 1)
		require.NoError(t, err)
		assert.Equal(t, []int{1}, recv(t, entered, 1))
		require.Eventually(t, func() bool { return m.Stats().Queues["p"].Scheduled == 4 }, wait, time.Millisecond)
		require.NoError(t, m.PauseQueue("p"))
		n, err := m.PurgeQueue("p")
		require.NoError(t, err)
		assert.Equal(t, 12, n, "8 ready, 1 retrying, 3 delayed")
		for i := 10; i < 13; i++ {
			require.NoError(t, m.Publish("ev", i))
		}
		close(release)
		require.Eventually(t, func() bool {
			st := m.Stats().Queues["p"]
			return st.Succeeded == 1 && st.InFlight == 0
		}, wait, time.Millisecond)
		stopWithin(t, m) // paused: what was published after the purge stays in the log

		d := topoDrain(t, dir, topoDecl{"p", "ev", nil})
		assert.Equal(t, []int{10, 11, 12}, d.got["p"])
		assert.Zero(t, d.scheduled["p"])
	})
	t.Run("delayed ones coming due during the purge", func(t *testing.T) {
		// The scheduler moves messages that came due into the queue one at
		// a time: a purge in the middle counts those it has taken and not
		// moved yet, and they must not come back either.
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.DeclareQueue("p", "ev", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		due := time.Now().Add(time.Second)
		var wg sync.WaitGroup
		for p := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 250 {
					assert.NoError(t, m.Publish("ev", p*250+i, tinymq.WithDelay(time.Until(due))))
				}
			}()
		}
		wg.Wait()
		require.Eventually(t, func() bool { return m.Stats().Queues["p"].Ready > 0 }, wait, 10*time.Microsecond)
		n, err := m.PurgeQueue("p")
		require.NoError(t, err)
		stopWithin(t, m)
		got := topoDrain(t, dir, topoDecl{"p", "ev", nil}).got["p"]
		assert.Empty(t, got, "%d of the %d purged came back", len(got), n)
	})
	t.Run("restored", func(t *testing.T) {
		dir := t.TempDir()
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.DeclareQueue("p", "ev", tinymq.Fanout, tinymq.WithDurable()))
		for i := range 5 {
			require.NoError(t, m.Publish("ev", i))
		}
		stopWithin(t, m)
		m = tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.DeclareQueue("p", "ev", tinymq.Fanout, tinymq.WithDurable()))
		n, err := m.PurgeQueue("p")
		require.NoError(t, err)
		require.Equal(t, 5, n)
		stopWithin(t, m)
		assert.Empty(t, topoDrain(t, dir, topoDecl{"p", "ev", nil}).got["p"])
	})
}

// A durable queue declared with no consumer keeps what is published to it
// across restarts: listed as Unregistered until it is declared again, then
// restored without a consumer, then delivered, in order, once consumed.
func TestDurableQueueDeclaredWithoutAConsumerKeepsItsBacklogAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i))
	}
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	st := m.Stats().Queues["q"]
	assert.True(t, st.Unregistered && st.Durable, "listed before it is declared: %+v", st)
	assert.Equal(t, 10, st.Depth)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	st = m.Stats().Queues["q"]
	assert.False(t, st.Unregistered)
	assert.Equal(t, 10, st.Depth, "restored with no consumer")
	assert.Zero(t, st.Consumers)
	stopWithin(t, m)

	assert.Equal(t, topoSeq(0, 10), topoDrain(t, dir, topoDecl{"q", "ev", nil}).got["q"])
}

// A durable queue that WithQueueExpiry deleted stays deleted after a
// restart: not listed, and declared again it gets none of its messages.
func TestExpiredDurableQueueStaysDeleted(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("x", "ev", tinymq.Fanout, tinymq.WithDurable(), tinymq.WithQueueExpiry(50*time.Millisecond)))
	for i := range 5 {
		require.NoError(t, m.Publish("ev", i))
	}
	require.NoError(t, m.Start(context.Background()))
	require.Eventually(t, func() bool { return m.Stats().ExpiredQueues == 1 }, wait, time.Millisecond)
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	_, listed := m.Stats().Queues["x"]
	assert.False(t, listed, "an expired queue is not listed after a restart")
	stopWithin(t, m)
	assert.Empty(t, topoDrain(t, dir, topoDecl{"x", "ev", nil}).got["x"])
}

// A declared durable queue is listed after a restart as Unregistered, even
// with no message in the log, until it is declared again; a deleted one is
// not listed. Binding and unbinding it, and deleting an exchange it was
// bound to, keep it declared.
func TestDeclaredDurableQueueIsListedAfterARestart(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("empty", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.DeclareQueue("rebound", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Bind("rebound", "other", tinymq.Direct, tinymq.WithBindingKey("k")))
	require.NoError(t, m.Unbind("rebound", "ev"))
	require.NoError(t, m.DeleteExchange("other"))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("registered"), tinymq.WithDurable()))
	require.NoError(t, m.DeclareQueue("gone", "ev", tinymq.Fanout, tinymq.WithDurable()))
	_, err := m.DeleteQueue("gone")
	require.NoError(t, err)
	require.NoError(t, m.DeclareQueue("memory", "ev", tinymq.Fanout))
	require.NoError(t, m.Start(context.Background()))
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	st := m.Stats()
	for _, q := range []string{"empty", "rebound", "registered"} {
		s, ok := st.Queues[q]
		assert.True(t, ok && s.Unregistered && s.Durable && s.Depth == 0, "%s: listed as Unregistered, with no message: %+v", q, s)
	}
	for _, q := range []string{"gone", "memory"} {
		_, ok := st.Queues[q]
		assert.False(t, ok, "%s is not listed", q)
	}
	require.NoError(t, m.DeclareQueue("empty", "ev", tinymq.Fanout, tinymq.WithDurable()))
	assert.False(t, m.Stats().Queues["empty"].Unregistered, "declared again")
	_, err = m.DeleteQueue("empty")
	require.NoError(t, err)
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	st = m.Stats()
	_, ok := st.Queues["empty"]
	assert.False(t, ok, "deleted after its restart")
	assert.True(t, st.Queues["rebound"].Unregistered)
	assert.True(t, st.Queues["registered"].Unregistered)
	stopWithin(t, m)

	// Declared again while the record of its delete is being written, it
	// stays declared: the delete's record does not remove the new one.
	settings := func(i int) []tinymq.QueueOption { // other settings each time
		return []tinymq.QueueOption{tinymq.WithDurable(), tinymq.WithMessageTTL(time.Duration(i+1) * time.Hour)}
	}
	for i := range 20 {
		m = tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.Start(context.Background()))
		if i > 0 {
			assert.True(t, m.Stats().Queues["racy"].Unregistered, "declared after its delete, in round %d", i-1)
		}
		require.NoError(t, m.DeclareQueue("racy", "ev", tinymq.Fanout, settings(2*i)...))
		deleted := make(chan error, 1)
		go func() {
			_, err := m.DeleteQueue("racy")
			deleted <- err
		}()
		for { // refused until the delete took the old one out of the MQ; its record may still be written
			err := m.DeclareQueue("racy", "ev", tinymq.Fanout, settings(2*i+1)...)
			if err == nil {
				break
			}
			require.ErrorIs(t, err, tinymq.ErrDuplicateQueue)
			runtime.Gosched()
		}
		require.NoError(t, <-deleted)
		stopWithin(t, m)
	}
}

// Publishes racing deletes and declarations of a durable queue each belong to
// one declaration: after a restart the queue holds every message published
// after its latest declaration returned, and none published before the
// delete of the one before was called (the IDs that a delete's record covers
// are those stamped before it).
func TestDurableDeleteRacingPublishesKeepsEachMessageInItsDeclaration(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.DeclareQueue("all", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	var clock atomic.Int64
	type pub struct {
		n          int
		start, end int64
	}
	var mu sync.Mutex
	var pubs []pub
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := p*1_000_000 + i
				s := clock.Add(1)
				if !assert.NoError(t, m.Publish("ev", n)) {
					return
				}
				e := clock.Add(1)
				mu.Lock()
				pubs = append(pubs, pub{n, s, e})
				mu.Unlock()
			}
		}()
	}
	// confirmedSince waits until 20 publishes that started after t0 have
	// returned: each declaration then has messages of its own, however
	// the publishers are scheduled.
	confirmedSince := func(t0 int64) {
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, p := range pubs {
				if p.start > t0 {
					n++
				}
			}
			return n >= 20
		}, wait, time.Millisecond)
	}
	var deleteCalled, declared int64
	for range 3 {
		confirmedSince(declared)
		deleteCalled = clock.Add(1)
		_, err := m.DeleteQueue("q")
		require.NoError(t, err)
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
		declared = clock.Add(1)
	}
	confirmedSince(declared)
	close(stop)
	wg.Wait()
	stopWithin(t, m)

	d := topoDrain(t, dir, topoDecl{"q", "ev", nil}, topoDecl{"all", "ev", nil})
	inQ := make(map[int]bool)
	for _, n := range d.got["q"] {
		assert.False(t, inQ[n], "%d delivered twice", n)
		inQ[n] = true
	}
	inAll := make(map[int]bool)
	for _, n := range d.got["all"] {
		inAll[n] = true
	}
	before, after := 0, 0
	for _, p := range pubs {
		assert.True(t, inAll[p.n], "%d, confirmed, is in the queue never deleted", p.n)
		switch {
		case p.end < deleteCalled:
			before++
			assert.False(t, inQ[p.n], "%d, published before the last delete, came back", p.n)
		case p.start > declared:
			after++
			assert.True(t, inQ[p.n], "%d, published after the last declaration, is missing", p.n)
		}
	}
	assert.NotZero(t, before)
	assert.NotZero(t, after)
}

// A delete or a purge that the log does not take (a full disk, a failed
// fsync) returns an error wrapping ErrLog that says its messages may come
// back after a restart; in memory it is done.
func TestDeleteAndPurgeOnAFailedLogReturnErrLog(t *testing.T) {
	for _, fault := range []string{"write", "sync"} {
		for _, op := range []string{"delete", "purge"} {
			t.Run(fault+"/"+op, func(t *testing.T) {
				var fail atomic.Bool
				f := &wal.Faults{}
				hook := func(string) error {
					if fail.Load() {
						return syscall.EIO
					}
					return nil
				}
				if fault == "write" {
					f.WriteErr = hook
				} else {
					f.SyncErr = hook
				}
				restore := tinymq.SetWALFaults(f)
				dir := t.TempDir()
				m := tinymq.New(tinymq.WithDataDir(dir), quiet())
				require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
				restore() // the log is open
				for i := range 5 {
					require.NoError(t, m.Publish("ev", i))
				}
				fail.Store(true)
				var n int
				var err error
				if op == "delete" {
					n, err = m.DeleteQueue("q")
				} else {
					n, err = m.PurgeQueue("q")
				}
				require.ErrorIs(t, err, tinymq.ErrLog)
				assert.Contains(t, err.Error(), "may come back after a restart")
				assert.Equal(t, 5, n, "done in memory")
				_, exists := m.Stats().Queues["q"]
				assert.Equal(t, op == "purge", exists)
				fail.Store(false)
				stopWithin(t, m)
				got := topoDrain(t, dir, topoDecl{"q", "ev", nil}).got["q"]
				if fault == "write" {
					assert.Equal(t, topoSeq(0, 5), got, "nothing reached the disk: they come back")
				}
			})
		}
	}
}

// topoCrashEnv names the scenario of a child of
// TestDurableTopologySurvivesPowerLoss (crashEnv names its data directory,
// and topoSyncEnv its WithSync interval).
const (
	topoCrashEnv = "TINYMQ_TOPOLOGY_CRASH"
	topoSyncEnv  = "TINYMQ_TOPOLOGY_SYNC"
)

// TestDurableTopologyCrashChild is what TestDurableTopologySurvivesPowerLoss
// runs and kills: a scenario of topoChild, printing "Y file size" after each
// fdatasync.
func TestDurableTopologyCrashChild(t *testing.T) {
	scenario := os.Getenv(topoCrashEnv)
	if scenario == "" {
		t.Skip("runs in a child process of TestDurableTopologySurvivesPowerLoss")
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	defer tinymq.SetWALFaults(&wal.Faults{Synced: func(name string, size int64) { say("Y %s %d", name, size) }})()
	every, _ := time.ParseDuration(os.Getenv(topoSyncEnv))
	topoChild(t, scenario, os.Getenv(crashEnv), every, say)
}

// topoChild runs a scenario on dir, printing what it did ("P n" once
// Publish(n) returned, and the markers of topoCrashCases once the operation
// returned), then publishes to and consumes a queue of its own until it is
// killed. every is its WithSync.
//
//   - delete: queues "del" (retries an hour apart) and "keep" share N
//     messages; "del" has two in its consumer ("F n") and one waiting for a
//     retry when it is deleted ("PRE-DELETE", "DELETED"); then it is declared
//     again and gets more ("R n").
//   - purge: "p" has N messages and 3 delayed an hour, one in its consumer
//     ("F n") and one waiting for a retry when it is paused and purged
//     ("PRE-PURGE", "PURGED"); then more are published ("Q n").
//   - declared: "d" is declared with no consumer, and published to.
//   - replay: "w" dead-letters its N messages into "dlq"; its consumer is
//     cancelled, and each is replayed back to "w" ("PRE-REPLAY",
//     "REPLAYED").
//   - expiry: "x" (WithQueueExpiry) gets N messages while a consumer holds
//     it paused; the consumer is cancelled ("CANCELLED") and the queue
//     expires ("EXPIRED", logged once its record is written).
func topoChild(t *testing.T, scenario, dir string, every time.Duration, say func(string, ...any)) {
	const n = 30
	logs := tinymq.WithLogger(slogTo(func(msg string) {
		if strings.HasPrefix(msg, "tinymq: queue expired") {
			say("EXPIRED")
		}
	}))
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(every), logs)
	ctx := context.Background()
	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})
	held := func(ctx context.Context, msg *tinymq.Msg) error {
		v := topoInt(t, msg)
		if v == 0 && msg.Attempt == 1 {
			return errors.New("retried in an hour")
		}
		say("F %d", v)
		<-ctx.Done()
		return ctx.Err()
	}
	require.NoError(t, m.DeclareQueue("bg", "bgx", tinymq.Fanout, tinymq.WithDurable()))
	_, err := m.Consume("bg", func(context.Context, *tinymq.Msg) error { return nil }, 2)
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	publish := func(ex, kind string, from, to int, opts ...tinymq.PublishOption) {
		for i := from; i < to; i++ {
			require.NoError(t, m.Publish(ex, i, opts...))
			say("%s %d", kind, i)
		}
	}
	switch scenario {
	case "delete":
		require.NoError(t, m.DeclareQueue("del", "ev", tinymq.Fanout, tinymq.WithDurable(), retry))
		require.NoError(t, m.DeclareQueue("keep", "ev", tinymq.Fanout, tinymq.WithDurable()))
		publish("ev", "P", 0, n)
		_, err := m.Consume("del", held, 2)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			st := m.Stats().Queues["del"]
			return st.InFlight == 2 && st.Scheduled == 1
		}, 10*time.Second, time.Millisecond)
		say("PRE-DELETE")
		removed, err := m.DeleteQueue("del")
		require.NoError(t, err)
		say("DELETED %d", removed)
		require.NoError(t, m.DeclareQueue("del", "ev", tinymq.Fanout, tinymq.WithDurable(), retry))
		publish("ev", "R", 1000, 1000+10)
	case "purge":
		require.NoError(t, m.DeclareQueue("p", "pe", tinymq.Fanout, tinymq.WithDurable(), retry))
		publish("pe", "P", 0, n)
		publish("pe", "P", 500, 503, tinymq.WithDelay(time.Hour))
		_, err := m.Consume("p", held, 1)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			st := m.Stats().Queues["p"]
			return st.InFlight == 1 && st.Scheduled == 4
		}, 10*time.Second, time.Millisecond)
		require.NoError(t, m.PauseQueue("p"))
		say("PRE-PURGE")
		purged, err := m.PurgeQueue("p")
		require.NoError(t, err)
		say("PURGED %d", purged)
		publish("pe", "Q", 1000, 1000+10)
	case "declared":
		require.NoError(t, m.DeclareQueue("d", "de", tinymq.Fanout, tinymq.WithDurable()))
		say("STARTED")
		publish("de", "P", 0, 1_000_000)
	case "expiry":
		require.NoError(t, m.DeclareQueue("x", "xe", tinymq.Fanout, tinymq.WithDurable(), tinymq.WithQueueExpiry(100*time.Millisecond)))
		sub, err := m.Consume("x", held, 1)
		require.NoError(t, err)
		require.NoError(t, m.PauseQueue("x"))
		publish("xe", "P", 0, n)
		require.NoError(t, sub.Cancel(ctx))
		say("CANCELLED")
	case "replay":
		require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.DeclareQueue("w", "we", tinymq.Fanout, tinymq.WithDurable(), tinymq.WithDeadLetter("dlx", "")))
		sub, err := m.Consume("w", func(context.Context, *tinymq.Msg) error { return tinymq.Permanent(errors.New("bug")) }, 1)
		require.NoError(t, err)
		publish("we", "P", 0, n)
		require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == n }, 10*time.Second, time.Millisecond)
		require.NoError(t, sub.Cancel(ctx)) // the bug is fixed: what comes back waits in w
		say("PRE-REPLAY")
		for {
			k, err := m.ReplayDeadLetters("dlq", 1)
			require.NoError(t, err)
			if k == 0 {
				break
			}
		}
		say("REPLAYED")
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
	for i := 0; ; i++ { // killed
		require.NoError(t, m.Publish("bgx", i))
	}
}

// slogTo is a logger that calls fn with the message of each line.
func slogTo(fn func(msg string)) *slog.Logger {
	return slog.New(msgHandler(fn))
}

type msgHandler func(msg string)

func (h msgHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h msgHandler) Handle(_ context.Context, r slog.Record) error {
	h(r.Message)
	return nil
}
func (h msgHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h msgHandler) WithGroup(string) slog.Handler      { return h }

// topoCrashCase is a scenario of topoChild and when to kill it: at a random
// moment up to within after the marker line was printed, times times; every
// is the child's WithSync (0: a sync before each Publish returns).
type topoCrashCase struct {
	scenario, marker string
	within           time.Duration
	times            int
	every            time.Duration
}

func (c topoCrashCase) String() string {
	s := c.scenario + " after " + c.marker
	if c.every > 0 {
		s += fmt.Sprintf(" syncing every %v", c.every)
	}
	return s
}

var topoCrashCases = []topoCrashCase{
	{"delete", "P", 15 * time.Millisecond, 2, 0},     // any time: publishing, consuming, deleting
	{"delete", "PRE-DELETE", time.Millisecond, 4, 0}, // during the delete, or just before or after it
	{"delete", "DELETED", 30 * time.Millisecond, 1, 0},
	{"purge", "P", 15 * time.Millisecond, 2, 0},
	{"purge", "PRE-PURGE", time.Millisecond, 4, 0},
	{"purge", "PURGED", 30 * time.Millisecond, 1, 0},
	{"declared", "STARTED", 150 * time.Millisecond, 1, 0},
	{"expiry", "CANCELLED", 300 * time.Millisecond, 2, 0}, // before, during or after the expiry
	{"expiry", "EXPIRED", 30 * time.Millisecond, 1, 0},
	{"replay", "P", 15 * time.Millisecond, 2, 0}, // dead-lettering, or replaying
	{"replay", "PRE-REPLAY", 2 * time.Millisecond, 4, 0},
	{"replay", "REPLAYED", 30 * time.Millisecond, 1, 0},
	// A delete and a purge wait for an fdatasync whatever WithSync says.
	{"delete", "DELETED", 5 * time.Millisecond, 2, 20 * time.Millisecond},
	{"purge", "PURGED", 5 * time.Millisecond, 2, 20 * time.Millisecond},
}

// topoRun is what a killed child printed.
type topoRun struct {
	ints    map[string][]int // "P", "R", "Q", "F" -> their numbers
	markers map[string]bool
	synced  map[string]int64 // segment -> the size its last fdatasync made durable
}

func parseTopoRun(lines []string) topoRun {
	r := topoRun{ints: make(map[string][]int), markers: make(map[string]bool), synced: make(map[string]int64)}
	for _, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 3 && f[0] == "Y":
			size, _ := strconv.ParseInt(f[2], 10, 64)
			r.synced[f[1]] = max(r.synced[f[1]], size)
		case len(f) == 2 && len(f[0]) == 1:
			n, err := strconv.Atoi(f[1])
			if err == nil {
				r.ints[f[0]] = append(r.ints[f[0]], n)
			}
		case len(f) >= 1:
			r.markers[f[0]] = true
		}
	}
	return r
}

// runTopoChild runs TestDurableTopologyCrashChild on dir with the scenario
// and kills it (SIGKILL) at a random moment within c.within after it printed
// c.marker. It returns the lines the child printed.
func runTopoChild(t *testing.T, dir string, c topoCrashCase, rng *rand.Rand) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDurableTopologyCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir, topoCrashEnv+"="+c.scenario, topoSyncEnv+"="+c.every.String())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	var all []string
	var kill <-chan time.Time // armed by the marker
	bound := time.After(60 * time.Second)
	for lines != nil {
		select {
		case l, ok := <-lines:
			if !ok {
				err := cmd.Wait()
				t.Fatalf("the child ended by itself (%v):\n%s\n%s", err, strings.Join(all, "\n"), stderr.String())
			}
			all = append(all, l)
			if kill == nil && strings.HasPrefix(l, c.marker) {
				kill = time.After(time.Duration(rng.Int64N(int64(c.within))))
			}
		case <-kill:
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			for l := range lines {
				all = append(all, l)
			}
			lines = nil
		case <-bound:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			t.Fatalf("no %q within a minute:\n%s\n%s", c.marker, strings.Join(all, "\n"), stderr.String())
		}
	}
	_ = cmd.Wait() // killed
	return all
}

// Promise: after a power loss (the child killed with SIGKILL, every segment
// cut back to what its last fdatasync made durable), a deleted durable
// queue stays deleted, declared again it gets none of its old messages
// (those in a consumer at the delete included) but those of its new
// declaration; a message it shared with another durable queue comes back
// only in that one; a purged message never comes back (one in a consumer at
// the purge does); a queue declared without a consumer keeps every
// confirmed message; an expired queue stays deleted; and a replayed dead
// letter is in exactly one of its two queues. Killed while the
// record was being written, the queue is either deleted (purged, expired)
// or not, never half.
func TestDurableTopologySurvivesPowerLoss(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	for _, c := range topoCrashCases {
		t.Run(c.String(), func(t *testing.T) {
			for range c.times {
				dir := t.TempDir()
				r := parseTopoRun(runTopoChild(t, dir, c, rng))
				cutToSynced(t, dir, r.synced)
				t.Logf("killed after %v; confirmed %d, in consumers %v", slices.Sorted(maps.Keys(r.markers)), len(r.ints["P"]), r.ints["F"])
				checkTopoRun(t, dir, c, r)
			}
		})
	}
}

// checkTopoRun checks that dir holds, for the queues of the scenario, what
// the promises say about run r of case c. Under a sync interval, only what
// a delete's or a purge's sync covered must survive a power loss.
func checkTopoRun(t *testing.T, dir string, c topoCrashCase, r topoRun) {
	t.Helper()
	const n = 30
	allOrNothing := func(what string, begun bool, count, all, confirmed int) {
		t.Helper()
		if !begun { // killed before the operation: nothing confirmed is lost
			assert.GreaterOrEqual(t, count, confirmed, "%s: confirmed messages lost", what)
			return
		}
		assert.True(t, count == 0 || count == all, "%s: %d of %d came back: a record half taken", what, count, all)
	}
	in := func(got []int, from, to int) (k int) {
		for _, v := range got {
			if v >= from && v < to {
				k++
			}
		}
		return k
	}
	synced := func(ns []int) []int {
		if c.every > 0 {
			return nil
		}
		return ns
	}
	switch c.scenario {
	case "delete":
		d := topoDrain(t, dir, topoDecl{"del", "ev", nil}, topoDecl{"keep", "ev", nil})
		assert.Subset(t, d.got["keep"], r.ints["P"], "every confirmed message is in the queue not deleted")
		assert.Subset(t, d.got["keep"], synced(r.ints["R"]))
		old := in(d.got["del"], 0, n) + d.scheduled["del"]
		if r.markers["DELETED"] {
			assert.Zero(t, old, "the deleted queue's messages came back: %v (%d scheduled)", d.got["del"], d.scheduled["del"])
			assert.Subset(t, d.got["del"], synced(r.ints["R"]), "the messages of its new declaration are there")
		} else {
			allOrNothing("the deleted queue's messages", r.markers["PRE-DELETE"], old, n, len(r.ints["P"]))
		}
	case "purge":
		d := topoDrain(t, dir, topoDecl{"p", "pe", nil})
		assert.Subset(t, d.got["p"], r.ints["F"], "the message in the consumer at the purge comes back")
		assert.Subset(t, d.got["p"], synced(r.ints["Q"]), "what was published after the purge is there")
		waiting := d.scheduled["p"] // of the old messages, those not in the consumer at the purge
		for _, v := range d.got["p"] {
			if (v < n || v >= 500 && v < 503) && !slices.Contains(r.ints["F"], v) {
				waiting++
			}
		}
		if r.markers["PURGED"] {
			assert.Zero(t, waiting, "purged messages came back: %v (%d scheduled)", d.got["p"], d.scheduled["p"])
		} else {
			allOrNothing("the purged messages", r.markers["PRE-PURGE"], waiting, n+3-len(r.ints["F"]), len(r.ints["P"])-len(r.ints["F"]))
		}
	case "declared":
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.Start(context.Background()))
		st := m.Stats().Queues["d"]
		stopWithin(t, m)
		if len(r.ints["P"]) > 0 {
			assert.True(t, st.Unregistered, "listed before it is declared again")
			assert.GreaterOrEqual(t, st.Depth, len(r.ints["P"]))
		}
		d := topoDrain(t, dir, topoDecl{"d", "de", nil})
		assert.Subset(t, d.got["d"], r.ints["P"], "every confirmed message survives")
		assert.True(t, slices.IsSorted(d.got["d"]), "in publish order")
	case "replay":
		d := topoDrain(t, dir, topoDecl{"dlq", "dlx", nil}, topoDecl{"w", "we", nil})
		for _, v := range r.ints["P"] {
			inW, inDLQ := in(d.got["w"], v, v+1), in(d.got["dlq"], v, v+1)
			assert.Equal(t, 1, inW+inDLQ, "message %d is in w %d times and in dlq %d times: each move is one record", v, inW, inDLQ)
		}
		if r.markers["REPLAYED"] {
			assert.Empty(t, d.got["dlq"], "every dead letter was moved back")
		}
	case "expiry":
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.Start(context.Background()))
		_, listed := m.Stats().Queues["x"]
		stopWithin(t, m)
		d := topoDrain(t, dir, topoDecl{"x", "xe", nil})
		if r.markers["EXPIRED"] {
			assert.False(t, listed, "an expired queue is not listed")
			assert.Empty(t, d.got["x"], "an expired queue's messages came back")
		} else {
			allOrNothing("the expired queue's messages", r.markers["CANCELLED"], len(d.got["x"]), n, len(r.ints["P"]))
		}
	}
}

// topoLogKeys returns the keys that the log in dir holds, by their prefix
// (m/, a/, s/, x/, d/, q/): what a closed MQ left on disk.
func topoLogKeys(t *testing.T, dir string) map[string]int {
	t.Helper()
	l, err := wal.Open(dir, wal.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	keys := make(map[string]int)
	require.NoError(t, l.Scan(func(k string, _ []byte) bool {
		keys[k[:2]]++
		return true
	}))
	return keys
}

// What deleted durable queues leave in the log goes at the next start: a
// message in a consumer at the delete whose acknowledgement was lost (here
// the disk failed; a crash does the same) is deleted, or, when another
// queue still holds it, acknowledged for the deleted one; and the
// tombstones go, so that queues with names of their own (an expiring reply
// queue each) do not fill the log.
func TestRecoveryCollectsWhatDeletedQueuesLeft(t *testing.T) {
	var fail atomic.Bool
	restore := tinymq.SetWALFaults(&wal.Faults{WriteErr: func(string) error {
		if fail.Load() {
			return syscall.EIO
		}
		return nil
	}})
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	restore() // the log is open
	require.NoError(t, m.DeclareQueue("other", "reply-0", tinymq.Fanout, tinymq.WithDurable()))
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	for i := range 10 {
		name := fmt.Sprint("reply-", i)
		require.NoError(t, m.DeclareQueue(name, name, tinymq.Fanout, tinymq.WithDurable()))
		require.NoError(t, m.Publish(name, i)) // reply-0's: in "other" too
		require.NoError(t, m.Publish(name, i+100))
		if i < 2 { // in a consumer at the delete
			_, err := m.Consume(name, func(context.Context, *tinymq.Msg) error {
				entered <- struct{}{}
				<-release
				return nil
			}, 1)
			require.NoError(t, err)
			recv(t, entered, 1)
		}
		_, err := m.DeleteQueue(name)
		require.NoError(t, err)
	}
	fail.Store(true) // the acknowledgements are lost
	close(release)
	require.Eventually(t, func() bool { return m.Stats().Deleted.Succeeded == 2 }, wait, time.Millisecond)
	stopWithin(t, m)
	keys := topoLogKeys(t, dir)
	assert.Equal(t, 3, keys["m/"], "the messages whose acknowledgement was lost, and the other of reply-0")
	assert.Equal(t, 10, keys["d/"], "a tombstone per deleted queue")

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.Start(context.Background()))
	stopWithin(t, m)
	keys = topoLogKeys(t, dir)
	assert.Zero(t, keys["d/"], "tombstones left: %v", keys)
	assert.Equal(t, 2, keys["m/"], "the messages that \"other\" holds: %v", keys)

	d := topoDrain(t, dir, topoDecl{"reply-0", "reply-0", nil}, topoDecl{"other", "reply-0", nil})
	assert.Empty(t, d.got["reply-0"], "the deleted queue stays deleted without its tombstone")
	assert.Equal(t, []int{0, 100}, d.got["other"])
	keys = topoLogKeys(t, dir)
	assert.Zero(t, keys["m/"]+keys["a/"]+keys["s/"]+keys["d/"], "left in the log: %v", keys)
}
