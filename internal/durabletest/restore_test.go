package durabletest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// leaveBacklog publishes n ints (from base) to a durable queue "q" on fanout
// exchange "ev" whose consumer never finishes, then ends the MQ at a short
// Shutdown deadline so that all of them stay in the log.
func leaveBacklog(t *testing.T, dir string, base, n int, opts ...tinymq.PublishOption) {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := base; i < base+n; i++ {
		require.NoError(t, m.Publish("ev", i, opts...))
	}
	err := shutdownShort(t, m, 30*time.Millisecond)
	require.ErrorIs(t, err, tinymq.ErrUndelivered)
}

// Promise: the restored backlog is delivered, at concurrency 1 in publish
// order, before anything published after the restart, and new publishes
// racing the restored backlog follow in their publish order.
func TestRestoredThenNewInOrderConcurrency1(t *testing.T) {
	dir := t.TempDir()
	const old, fresh = 500, 500
	leaveBacklog(t, dir, 0, old)
	r := newRecorder(old + fresh)
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, r.consumer(t), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := old; i < old+fresh; i++ {
		require.NoError(t, m.Publish("ev", i))
	}
	r.waitAll(t)
	stopWithin(t, m)
	require.Equal(t, seq(0, old+fresh), r.ns())
	for _, g := range r.snapshot() {
		assert.Equal(t, g.N < old, g.Redelivered, "Redelivered of %d", g.N)
		assert.Equal(t, 1, g.Attempt)
	}
	checkLedger(t, m, "q")
	// Nothing acknowledged comes back.
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	r2 := newRecorder(0)
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r2.consumer(t), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m2.Start(context.Background()))
	stopWithin(t, m2)
	require.Empty(t, r2.ns())
}

// Promise: at concurrency 8 every restored message is delivered exactly once
// (and nothing acknowledged comes back).
func TestRestoredConcurrency8ExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	const n = 3000
	leaveBacklog(t, dir, 0, n)
	r := newRecorder(n + 100)
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, r.consumer(t), 8, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				assert.NoError(t, m.Publish("ev", n+p*25+i))
			}
		}()
	}
	wg.Wait()
	r.waitAll(t)
	stopWithin(t, m)
	require.Equal(t, seq(0, n+100), sorted(r.ns()))
	checkLedger(t, m, "q")
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	r2 := newRecorder(0)
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r2.consumer(t), 8, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m2.Start(context.Background()))
	stopWithin(t, m2)
	require.Empty(t, r2.ns())
}

// Promise: routing key, headers (with their Go types) and data survive a
// restart on a restored message; a topic exchange routes it to its queue again.
func TestRestoredKeepsRoutingKeyAndHeaders(t *testing.T) {
	dir := t.TempDir()
	when := time.Date(2024, 5, 6, 7, 8, 9, 10, time.UTC)
	hdr := map[string]any{"s": "x", "i8": int8(-3), "u16": uint16(7), "f": 1.5, "b": []byte{1, 2}, "t": when,
		"nest": map[string]any{"a": []any{int32(1), "two", nil, true}}}
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("topic", tinymq.Topic, blocker, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithBindingKey("a.*")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 20 {
		require.NoError(t, m.Publish("topic", i, tinymq.WithRoutingKey(fmt.Sprintf("a.k%d", i)), tinymq.WithHeaders(hdr)))
	}
	require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)

	r := newRecorder(20)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m2.RegisterQueue("topic", tinymq.Topic, r.consumer(t), 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithBindingKey("a.*")))
	require.NoError(t, m2.Start(context.Background()))
	r.waitAll(t)
	stopWithin(t, m2)
	for i, g := range r.snapshot() {
		require.Equal(t, i, g.N)
		assert.Equal(t, fmt.Sprintf("a.k%d", i), g.RoutingKey)
		assert.True(t, g.Redelivered)
		assert.Equal(t, int8(-3), g.Headers["i8"])
		assert.Equal(t, uint16(7), g.Headers["u16"])
		assert.Equal(t, []byte{1, 2}, g.Headers["b"])
		tm, _ := g.Headers["t"].(time.Time)
		assert.True(t, tm.Equal(when), "time header %v", g.Headers["t"])
		assert.Equal(t, hdr["nest"], g.Headers["nest"])
	}
	checkLedger(t, m2, "q")
}

// Promise: a restored message whose TTL passed is dead-lettered (expired) at
// the head with its data, routing key and headers read from the log, into a
// durable dead-letter queue; a queue-level TTL applies to restored messages too.
func TestRestoredExpiredDeadLetteredWithData(t *testing.T) {
	for _, conc := range []int{1, 8} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			dir := t.TempDir()
			m := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", -1)) // held in the consumer
			for i := range 50 {
				opts := []tinymq.PublishOption{tinymq.WithRoutingKey(fmt.Sprint("rk", i)), tinymq.WithHeaders(map[string]any{"n": int64(i)})}
				if i%2 == 0 {
					opts = append(opts, tinymq.WithExpiration(400*time.Millisecond))
				}
				require.NoError(t, m.Publish("ev", i, opts...))
			}
			// Every TTL counts from before the last Publish returned,
			// however long the publishes took under load.
			published := time.Now()
			require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)
			<-time.After(time.Until(published.Add(450 * time.Millisecond))) // the TTLs pass (time, not synchronisation)

			dead := newRecorder(25)
			live := newRecorder(26)
			m2 := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m2.RegisterQueue("dlx", tinymq.Fanout, dead.consumer(t), 1, tinymq.WithQueueName("dead"), tinymq.WithDurable()))
			require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, live.consumer(t), conc, tinymq.WithQueueName("q"), tinymq.WithDurable(),
				tinymq.WithDeadLetter("dlx", "")))
			require.NoError(t, m2.Start(context.Background()))
			dead.mq, live.mq = m2, m2
			dead.waitAll(t)
			live.waitAll(t)
			stopWithin(t, m2)
			checkLedger(t, m2, "q", "dead")
			var liveN []int
			for _, g := range live.snapshot() {
				liveN = append(liveN, g.N)
				assert.True(t, g.N == -1 || g.N%2 == 1, "expired message %d was delivered", g.N)
			}
			var deadN []int
			for _, g := range dead.snapshot() {
				deadN = append(deadN, g.N)
				assert.Equal(t, fmt.Sprint("rk", g.N), g.RoutingKey)
				assert.Equal(t, int64(g.N), g.Headers["n"])
				if assert.Len(t, g.Deaths, 1) {
					assert.Equal(t, tinymq.ReasonExpired, g.Deaths[0].Reason)
					assert.Equal(t, "q", g.Deaths[0].Queue)
					assert.Equal(t, fmt.Sprint("rk", g.N), g.Deaths[0].RoutingKey)
				}
			}
			assert.Len(t, sorted(liveN), 26)
			var even []int
			for i := 0; i < 50; i += 2 {
				even = append(even, i)
			}
			assert.Equal(t, even, sorted(deadN))
		})
	}
	t.Run("queue TTL on restore", func(t *testing.T) {
		dir := t.TempDir()
		leaveBacklog(t, dir, 0, 30)
		left := time.Now() // after every message's publish
		<-time.After(time.Until(left.Add(300 * time.Millisecond)))
		dead := newRecorder(30)
		m2 := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m2.RegisterQueue("dlx", tinymq.Fanout, dead.consumer(t), 1, tinymq.WithQueueName("dead"), tinymq.WithDurable()))
		require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return errors.New("an expired message was delivered")
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithMessageTTL(100*time.Millisecond), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m2.Start(context.Background()))
		dead.waitAll(t)
		stopWithin(t, m2)
		assert.Equal(t, seq(0, 30), sorted(dead.ns()))
		st := m2.Stats().Queues["q"]
		assert.Equal(t, uint64(30), st.Expired)
		assert.Equal(t, uint64(0), st.Delivered)
		checkLedger(t, m2, "q", "dead")
	})
}

// Promise: a delay survives a restart: a delayed restored message is not
// delivered before its delay ends, with its data, headers and key.
func TestRestoredDelayed(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	start := time.Now()
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithDelay(500*time.Millisecond), tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"h": "v"})))
	}
	require.NoError(t, m.Publish("ev", 100)) // ready at once
	require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)

	r := newRecorder(11)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r.consumer(t), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m2.Start(context.Background()))
	r.waitAll(t)
	stopWithin(t, m2)
	gs := r.snapshot()
	require.Equal(t, 100, gs[0].N)
	for _, g := range gs[1:] {
		assert.False(t, g.At.Before(start.Add(500*time.Millisecond)), "delayed %d delivered %v after publish", g.N, g.At.Sub(start))
		assert.Equal(t, "k", g.RoutingKey)
		assert.Equal(t, "v", g.Headers["h"])
		assert.True(t, g.Redelivered)
	}
	checkLedger(t, m2, "q")
}

// Promise: retry attempts, backoffs and last error survive; a restored
// message that then exhausts its retries is dead-lettered into a durable
// queue with data, key, headers and a rejected death (Attempts = 2).
func TestRestoredRetryStateThenDeadLetter(t *testing.T) {
	dir := t.TempDir()
	pol := tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 400 * time.Millisecond}
	failed := make(chan struct{}, 10)
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		failed <- struct{}{}
		return errors.New("first failure")
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithRetry(pol), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 5 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithRoutingKey("rk"), tinymq.WithHeaders(map[string]any{"h": int64(i)})))
	}
	for range 5 {
		select {
		case <-failed:
		case <-time.After(bound):
			t.Fatal("first attempts did not happen")
		}
	}
	firstFail := time.Now()
	require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)

	r := newRecorder(5)
	r.fail = func(int, int) error { return errors.New("second failure") }
	dead := newRecorder(5)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m2.RegisterQueue("dlx", tinymq.Fanout, dead.consumer(t), 1, tinymq.WithQueueName("dead"), tinymq.WithDurable()))
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r.consumer(t), 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithRetry(pol), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m2.Start(context.Background()))
	r.waitAll(t)
	dead.waitAll(t)
	stopWithin(t, m2)
	for _, g := range r.snapshot() {
		assert.Equal(t, 2, g.Attempt, "attempt of restored %d", g.N)
		assert.True(t, g.Redelivered)
		assert.False(t, g.At.Before(firstFail.Add(300*time.Millisecond)), "retry of %d came %v after the failure", g.N, g.At.Sub(firstFail))
		assert.Equal(t, "rk", g.RoutingKey)
		assert.Equal(t, int64(g.N), g.Headers["h"])
	}
	assert.Equal(t, seq(0, 5), sorted(dead.ns()))
	for _, g := range dead.snapshot() {
		assert.Equal(t, "rk", g.RoutingKey)
		assert.Equal(t, int64(g.N), g.Headers["h"])
		if assert.Len(t, g.Deaths, 1) {
			assert.Equal(t, tinymq.ReasonRejected, g.Deaths[0].Reason)
			assert.Equal(t, 2, g.Deaths[0].Attempts)
			assert.Equal(t, "second failure", g.Deaths[0].LastError)
		}
	}
	checkLedger(t, m2, "q", "dead")
}

// Promise: a restored message keeps its death records, and dying again adds one.
func TestRestoredDeathsAccumulate(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("dlx1", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("d1"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx2", "")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return tinymq.Permanent(errors.New("nope"))
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx1", "")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithRoutingKey("rk")))
	}
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].DeadLettered >= 10 }, bound, time.Millisecond, "not dead-lettered")
	require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)

	dead2 := newRecorder(10)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m2.RegisterQueue("dlx2", tinymq.Fanout, dead2.consumer(t), 1, tinymq.WithQueueName("d2"), tinymq.WithDurable()))
	require.NoError(t, m2.RegisterQueue("dlx1", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if len(msg.Deaths) != 1 || msg.Deaths[0].Queue != "q" {
			return fmt.Errorf("restored deaths %+v", msg.Deaths)
		}
		return tinymq.Permanent(errors.New("again"))
	}, 1, tinymq.WithQueueName("d1"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx2", "")))
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx1", "")))
	require.NoError(t, m2.Start(context.Background()))
	dead2.waitAll(t)
	stopWithin(t, m2)
	assert.Equal(t, seq(0, 10), sorted(dead2.ns()))
	for _, g := range dead2.snapshot() {
		if assert.Len(t, g.Deaths, 2, "deaths of %d", g.N) {
			assert.Equal(t, "d1", g.Deaths[0].Queue)
			assert.Equal(t, "again", g.Deaths[0].LastError)
			assert.Equal(t, "q", g.Deaths[1].Queue)
			assert.Equal(t, "nope", g.Deaths[1].LastError)
		}
		assert.Equal(t, "rk", g.RoutingKey)
	}
	checkLedger(t, m2, "q", "d1", "d2")
}

// Promise: a message shared by several durable queues is restored in each
// that did not acknowledge it, and only there.
func TestRestoredSharedBySeveralQueues(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	acked := newRecorder(40)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, acked.consumer(t), 2, tinymq.WithQueueName("a"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("b"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("c"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := range 40 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithHeaders(map[string]any{"i": int64(i)})))
	}
	acked.waitAll(t)
	// an acknowledgement is durable once a later durable publish returned
	require.NoError(t, m.Publish("ev", 1000))
	require.ErrorIs(t, shutdownShort(t, m, 50*time.Millisecond), tinymq.ErrUndelivered)

	ra, rb, rc := newRecorder(0), newRecorder(41), newRecorder(41)
	m2 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, ra.consumer(t), 8, tinymq.WithQueueName("a"), tinymq.WithDurable()))
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, rb.consumer(t), 1, tinymq.WithQueueName("b"), tinymq.WithDurable()))
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, rc.consumer(t), 8, tinymq.WithQueueName("c"), tinymq.WithDurable()))
	require.NoError(t, m2.Start(context.Background()))
	rb.waitAll(t)
	rc.waitAll(t)
	stopWithin(t, m2)
	assert.Subset(t, []int{1000}, ra.ns(), "queue a got back what it acknowledged")
	want := append(seq(0, 40), 1000)
	assert.Equal(t, want, rb.ns())
	assert.Equal(t, want, sorted(rc.ns()))
	for _, g := range rc.snapshot() {
		if g.N < 1000 {
			assert.Equal(t, int64(g.N), g.Headers["i"])
		}
	}
	checkLedger(t, m2, "a", "b", "c")
}

// Promise: DropHead applies to a restored backlog and to publishes after it:
// the evicted restored messages are dead-lettered (maxlen) with their data.
func TestRestoredDropHead(t *testing.T) {
	dir := t.TempDir()
	leaveBacklog(t, dir, 0, 20, tinymq.WithRoutingKey("rk"))
	gate := make(chan struct{})
	live := newRecorder(1)
	first := make(chan struct{})
	var once sync.Once
	dead := newRecorder(20 - 5 + 3)
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, dead.consumer(t), 1, tinymq.WithQueueName("dead"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		once.Do(func() { close(first) })
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return live.consumer(t)(ctx, msg)
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithMaxLen(5, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	select {
	case <-first:
	case <-time.After(bound):
		t.Fatal("no delivery")
	}
	// restore evicts 0..14; 15 in the consumer, 16..19 wait; 100 fills the
	// queue, 101..103 evict 16, 17, 18
	for i := 100; i < 104; i++ {
		require.NoError(t, m.Publish("ev", i))
	}
	close(gate)
	dead.waitAll(t)
	stopWithin(t, m)
	d := dead.ns()
	assert.Equal(t, append(seq(0, 15), 16, 17, 18), sorted(d), "dead-lettered")
	for _, g := range dead.snapshot() {
		assert.Equal(t, "rk", g.RoutingKey)
		if assert.Len(t, g.Deaths, 1) {
			assert.Equal(t, tinymq.ReasonMaxLen, g.Deaths[0].Reason)
		}
	}
	assert.Equal(t, []int{15, 19, 100, 101, 102, 103}, live.ns())
	checkLedger(t, m, "q", "dead")
}

type payload struct {
	N    int
	Name string
}

// Promise: a typed consumer (Handler[T], RegisterHandler[T],
// RegisterDeliveryHandler[T]) gets its T from a restored message.
func TestRestoredTypedHandlers(t *testing.T) {
	for _, form := range []string{"Handler", "RegisterHandler", "RegisterDeliveryHandler"} {
		t.Run(form, func(t *testing.T) {
			dir := t.TempDir()
			m := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
			require.NoError(t, m.Start(context.Background()))
			for i := range 30 {
				require.NoError(t, m.Publish("ev", payload{N: i, Name: fmt.Sprint("n", i)}, tinymq.WithRoutingKey("rk")))
			}
			require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)

			var mu sync.Mutex
			var gotN []int
			done := make(chan struct{})
			rec := func(p payload, redelivered bool, rk string) error {
				mu.Lock()
				defer mu.Unlock()
				if p.Name != fmt.Sprint("n", p.N) {
					return fmt.Errorf("bad payload %+v", p)
				}
				if form == "RegisterDeliveryHandler" && (!redelivered || rk != "rk") {
					return fmt.Errorf("bad delivery %v %q", redelivered, rk)
				}
				gotN = append(gotN, p.N)
				if len(gotN) == 30 {
					close(done)
				}
				return nil
			}
			m2 := tinymq.New(tinymq.WithDataDir(dir))
			opts := []tinymq.QueueOption{tinymq.WithQueueName("q"), tinymq.WithDurable()}
			switch form {
			case "Handler":
				require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, p payload) error { return rec(p, true, "rk") }), 4, opts...))
			case "RegisterHandler":
				require.NoError(t, tinymq.RegisterHandler(m2, "ev", tinymq.Fanout, func(_ context.Context, p payload) error { return rec(p, true, "rk") }, 4, opts...))
			default:
				require.NoError(t, tinymq.RegisterDeliveryHandler(m2, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[payload]) error {
					return rec(d.Data, d.Redelivered, d.RoutingKey)
				}, 4, opts...))
			}
			require.NoError(t, m2.Start(context.Background()))
			select {
			case <-done:
			case <-time.After(bound):
				t.Fatalf("typed consumer got %d of 30", len(gotN))
			}
			stopWithin(t, m2)
			st := m2.Stats().Queues["q"]
			assert.Equal(t, uint64(30), st.Succeeded)
			assert.Equal(t, uint64(0), st.Failed)
			mu.Lock()
			assert.Equal(t, seq(0, 30), sorted(gotN))
			mu.Unlock()
			checkLedger(t, m2, "q")
		})
	}
}

// Promise: a Shutdown deadline while draining a restored backlog keeps the
// ledger exact; the undelivered come back after the next restart, nothing
// acknowledged comes back, and nothing is lost.
func TestShutdownWhileDrainingRestored(t *testing.T) {
	for _, conc := range []int{1, 8} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			dir := t.TempDir()
			const n = 4000
			leaveBacklog(t, dir, 0, n)
			all := map[int]int{}
			for round := 0; round < 4; round++ {
				r := newRecorder(-1)
				m := tinymq.New(tinymq.WithDataDir(dir))
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, r.consumer(t), conc, tinymq.WithQueueName("q"), tinymq.WithDurable()))
				require.NoError(t, m.Start(context.Background()))
				d := time.Duration(2+round*3) * time.Millisecond
				if round == 3 {
					d = bound
				}
				err := shutdownShort(t, m, d)
				st := m.Stats().Queues["q"]
				checkLedger(t, m, "q")
				ns := r.ns()
				assert.Equal(t, uint64(len(ns)), st.Succeeded)
				for _, x := range ns {
					all[x]++
				}
				t.Logf("round %d: accepted %d succeeded %d undelivered %d err %v", round, st.Accepted, st.Succeeded, st.Undelivered, err)
				if round == 3 {
					require.NoError(t, err)
				}
			}
			dups := 0
			for i := range n {
				if all[i] == 0 {
					t.Errorf("message %d never delivered over the rounds", i)
				}
				dups += max(all[i]-1, 0)
			}
			// only a message in its consumer at a deadline may come again
			assert.LessOrEqual(t, dups, 3*conc, "messages delivered twice")
		})
	}
}
