package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
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

// grouped is the payload of the group tests: message N of group G.
type grouped struct{ G, N int }

func groupID(g int) string { return "g" + strconv.Itoa(g) }

// releaser returns a channel that held consumers wait on, and the function
// that closes it, once however often it is called. Deferred, it lets the
// held calls go when a test fails, so that stopping the MQ then does not
// wait for them forever.
func releaser() (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
}

// TestGroupOrderingDeliversEachGroupInPublishOrder: with 8 workers and 1,000
// groups, each group's messages arrive one at a time, in publish order.
func TestGroupOrderingDeliversEachGroupInPublishOrder(t *testing.T) {
	const groups, per = 1000, 10
	var mu sync.Mutex
	next := make([]int, groups)
	var busy [groups]atomic.Int32
	var overlaps, disorders atomic.Int64
	done := make(chan struct{}, groups*per)
	m := started(t)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		p := msg.Data.(grouped)
		if busy[p.G].Add(1) != 1 {
			overlaps.Add(1)
		}
		if msg.Group() != groupID(p.G) {
			disorders.Add(1)
		}
		mu.Lock()
		if next[p.G] != p.N {
			disorders.Add(1)
		}
		next[p.G] = p.N + 1
		mu.Unlock()
		busy[p.G].Add(-1)
		done <- struct{}{}
		return nil
	}, 8, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
	for n := range per {
		for g := range groups {
			require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
		}
	}
	recv(t, done, groups*per)
	assert.Zero(t, overlaps.Load(), "two messages of one group in consumers at once")
	assert.Zero(t, disorders.Load(), "a group's messages out of publish order")
	waitDrained(t, m, "q")
	m.Stop()
	assertLedger(t, "q", m.Stats().Queues["q"])
}

// TestGroupOrderingSlowGroupDoesNotHoldBackOthers: while the consumer of one
// group's message is held, every other group's messages are delivered.
func TestGroupOrderingSlowGroupDoesNotHoldBackOthers(t *testing.T) {
	release, free := releaser()
	defer free()
	held := make(chan struct{})
	others := make(chan grouped, 100)
	var slowAfter atomic.Int32
	m := started(t)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		p := msg.Data.(grouped)
		if p.G == 0 {
			if p.N == 0 {
				close(held)
				<-release
			} else {
				slowAfter.Add(1)
			}
			return nil
		}
		others <- p
		return nil
	}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
	for n := range 5 {
		require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
	}
	closedWithin(t, held, "the slow group's first delivery")
	for n := range 10 {
		for g := 1; g <= 9; g++ {
			require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
		}
	}
	recv(t, others, 90) // all while the slow one is held
	assert.Zero(t, slowAfter.Load(), "a later message of the held group was delivered")
	st := m.Stats().Queues["q"]
	assert.Equal(t, 4, st.Depth, "the held group's backlog waits, and counts")
	assert.Equal(t, 4, st.Ready)
	free()
	require.Eventually(t, func() bool { return slowAfter.Load() == 4 }, wait, time.Millisecond)
}

// TestGroupOrderingRetryHoldsBackOnlyItsGroup: a message waiting for its
// retry keeps its group's later messages waiting until it succeeds, while
// other groups go on at once.
func TestGroupOrderingRetryHoldsBackOnlyItsGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		type seen struct {
			p       grouped
			at      time.Duration
			attempt int
		}
		var mu sync.Mutex
		var got []seen
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			mu.Lock()
			got = append(got, seen{p, time.Since(start), msg.Attempt})
			mu.Unlock()
			if p == (grouped{0, 0}) && msg.Attempt < 3 {
				return errors.New("not yet")
			}
			return nil
		}, 4, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, MaxBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		for n := range 3 {
			for g := range 3 {
				require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
			}
		}
		synctest.Wait()
		mu.Lock()
		for _, s := range got {
			assert.False(t, s.p.G == 0 && s.p.N > 0, "group 0 went past its retrying message: %+v", s)
			assert.Equal(t, time.Duration(0), s.at, "%+v", s)
		}
		assert.Len(t, got, 7, "groups 1 and 2 all delivered at once, group 0 only its first")
		mu.Unlock()
		m.Stop()
		var g0 []seen
		for _, s := range got {
			if s.p.G == 0 {
				g0 = append(g0, s)
			}
		}
		require.Len(t, g0, 5)
		assert.Equal(t, []seen{{grouped{0, 0}, 0, 1}, {grouped{0, 0}, time.Second, 2}, {grouped{0, 0}, 2 * time.Second, 3},
			{grouped{0, 1}, 2 * time.Second, 1}, {grouped{0, 2}, 2 * time.Second, 1}}, g0)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingDeadLetterReleasesTheGroup: a message dead-lettered after
// its last attempt lets the next of its group through.
func TestGroupOrderingDeadLetterReleasesTheGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []string
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			order = append(order, msg.Data.(string)+"#"+strconv.Itoa(msg.Attempt))
			mu.Unlock()
			if msg.Data == "bad" {
				return errors.New("no")
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		for _, d := range []string{"bad", "after1", "after2"} {
			require.NoError(t, m.Publish("ev", d, tinymq.WithMessageGroup("a")))
		}
		m.Stop()
		assert.Equal(t, []string{"bad#1", "bad#2", "after1#1", "after2#1"}, order)
		require.Len(t, dead, 1)
		d := <-dead
		assert.Equal(t, "bad", d.Data)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingSurvivesARestart: a durable queue's groups keep their
// order across a restart, the message that was retrying first.
func TestGroupOrderingSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	failedOnce := make(chan struct{})
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if string(msg.Data.(tinymq.Encoded).Body) == `{"G":0,"N":0}` {
			close(failedOnce)
			return errors.New("retry me")
		}
		return errors.New("only g0/0 may be delivered before the restart")
	}, 4, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithGroupOrdering(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 200 * time.Millisecond})))
	require.NoError(t, m.Publish("ev", grouped{0, 0}, tinymq.WithMessageGroup("g0")))
	require.NoError(t, m.Start(context.Background()))
	closedWithin(t, failedOnce, "the first delivery")
	// Group 0's first message now waits for its retry; the rest join behind.
	require.NoError(t, m.PauseQueue("q"))
	for n := range 5 {
		for g := range 4 {
			if g == 0 && n == 0 {
				continue
			}
			require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
		}
	}
	m.Stop() // paused: what waits stays in the log

	var mu sync.Mutex
	got := map[string][]string{}
	attempts := map[string]int{}
	all := make(chan struct{}, 20)
	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		mu.Lock()
		got[msg.Group()] = append(got[msg.Group()], string(msg.Data.(tinymq.Encoded).Body))
		if string(msg.Data.(tinymq.Encoded).Body) == `{"G":0,"N":0}` {
			attempts["g0"] = msg.Attempt
		}
		mu.Unlock()
		all <- struct{}{}
		return nil
	}, 4, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithGroupOrdering(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 200 * time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	recv(t, all, 20)
	m.Stop()
	for g := range 4 {
		var want []string
		for n := range 5 {
			want = append(want, `{"G":`+strconv.Itoa(g)+`,"N":`+strconv.Itoa(n)+`}`)
		}
		assert.Equal(t, want, got[groupID(g)], "group %d", g)
	}
	assert.Equal(t, 2, attempts["g0"], "the retrying message kept its attempt count")
}

// TestGroupOrderingBacklogsCountAndGo: Depth, Ready, Peek, PurgeQueue,
// DeleteQueue and Stop all see the messages waiting behind their group's
// message, and the ledger holds.
func TestGroupOrderingBacklogsCountAndGo(t *testing.T) {
	publish := func(t *testing.T, m *tinymq.MQ, ex string) {
		for n := range 4 {
			for g := range 3 {
				require.NoError(t, m.Publish(ex, grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
			}
		}
		require.NoError(t, m.Publish(ex, grouped{-1, 0})) // no group
	}
	t.Run("depth and peek", func(t *testing.T) {
		m := started(t)
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		publish(t, m, "ev")
		st := m.Stats().Queues["q"]
		assert.Equal(t, 13, st.Depth)
		assert.Equal(t, 13, st.Ready)
		msgs, err := m.Peek("q", 100)
		require.NoError(t, err)
		require.Len(t, msgs, 13)
		// The head of each group and the ungrouped message first, then the backlogs group by group.
		var heads []grouped
		for _, msg := range msgs[:4] {
			heads = append(heads, msg.Data.(grouped))
		}
		assert.Equal(t, []grouped{{0, 0}, {1, 0}, {2, 0}, {-1, 0}}, heads)
		for i, msg := range msgs[4:7] {
			assert.Equal(t, grouped{0, i + 1}, msg.Data)
		}
	})
	t.Run("purge", func(t *testing.T) {
		m := started(t)
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		publish(t, m, "ev")
		n, err := m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 13, n)
		assert.Zero(t, m.Stats().Queues["q"].Depth)
		// The groups are free again: a consumer gets a new message of each.
		got := make(chan *tinymq.Msg, 4)
		_, err = m.Consume("q", sink(got), 2)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", grouped{0, 9}, tinymq.WithMessageGroup("g0")))
		assert.Equal(t, grouped{0, 9}, recv(t, got, 1)[0].Data)
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
	t.Run("purge with a group's message in a consumer", func(t *testing.T) {
		m := started(t)
		held := make(chan struct{})
		release, free := releaser()
		defer free()
		got := make(chan grouped, 10)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			if p == (grouped{0, 0}) {
				close(held)
				<-release
			}
			got <- p
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.Publish("ev", grouped{0, 0}, tinymq.WithMessageGroup("g0")))
		closedWithin(t, held, "the first delivery")
		for n := 1; n < 4; n++ {
			require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
		}
		n, err := m.PurgeQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 3, n, "the group's backlog is purged, not its message in the consumer")
		free()
		assert.Equal(t, grouped{0, 0}, recv(t, got, 1)[0])
		require.NoError(t, m.Publish("ev", grouped{0, 9}, tinymq.WithMessageGroup("g0")))
		assert.Equal(t, grouped{0, 9}, recv(t, got, 1)[0])
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(3), st.Purged)
		assertLedger(t, "q", st)
	})
	t.Run("delete", func(t *testing.T) {
		m := started(t)
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		publish(t, m, "ev")
		n, err := m.DeleteQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 13, n)
	})
	t.Run("stop", func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		publish(t, m, "ev")
		m.Stop() // no consumer: what waits stays, counted undelivered
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(13), st.Undelivered)
		assertLedger(t, "q", st)
	})
	t.Run("paused", func(t *testing.T) {
		got := make(chan *tinymq.Msg, 20)
		m := started(t)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.PauseQueue("q"))
		publish(t, m, "ev")
		assert.Equal(t, 13, m.Stats().Queues["q"].Depth)
		require.NoError(t, m.ResumeQueue("q"))
		recv(t, got, 13)
		waitDrained(t, m, "q")
	})
}

// TestGroupOrderingRefusesBadInput: a group ID is 1 to 255 bytes; an engine
// refuses group ordering and grouped publishes rather than ignore them.
func TestGroupOrderingRefusesBadInput(t *testing.T) {
	m := started(t)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
	for _, id := range []string{"", strings.Repeat("x", 256)} {
		assert.ErrorIs(t, m.Publish("ev", 1, tinymq.WithMessageGroup(id)), tinymq.ErrInvalidOption, "group of %d bytes", len(id))
	}
	assert.NoError(t, m.Publish("ev", 1, tinymq.WithMessageGroup(strings.Repeat("x", 255))))
	assert.Equal(t, 1, m.Stats().Queues["q"].Depth, "only the valid publish was accepted")

	e := &hEngine{specs: map[string]tinymq.QueueSpec{}}
	em := tinymq.New(tinymq.WithEngine(e))
	err := em.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithGroupOrdering())
	assert.ErrorIs(t, err, tinymq.ErrUnsupported)
	assert.ErrorIs(t, em.Publish("ev", 1, tinymq.WithMessageGroup("g")), tinymq.ErrUnsupported)
}

// TestGroupIsCarriedByQueuesWithoutGroupOrdering: a queue without group
// ordering ignores the group, but its consumer sees it.
func TestGroupIsCarriedByQueuesWithoutGroupOrdering(t *testing.T) {
	got := make(chan *tinymq.Msg, 4)
	m := started(t)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 2, tinymq.WithQueueName("a")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 2, tinymq.WithQueueName("b")))
	require.NoError(t, m.Publish("ev", "x", tinymq.WithMessageGroup("g")))
	require.NoError(t, m.Publish("ev", "y"))
	groups := map[string]int{}
	for _, msg := range recv(t, got, 4) {
		groups[msg.Data.(string)+"/"+msg.Group()]++
	}
	assert.Equal(t, map[string]int{"x/g": 2, "y/": 2}, groups)
}

// groupLog records what the consumer of a group-ordered queue saw, group by
// group: each call (the message's number in its group and its attempt, with
// a sequence number across all groups), each success, in the order they
// happened, and every time two messages of one group were in consumers at
// once. It is safe for concurrent use.
type groupLog struct {
	mu        sync.Mutex
	seq       int
	calls     map[string][]groupCall
	successes map[string][]int
	busy      map[string]int
	overlaps  int
}

// groupCall is one call of a consumer: message N of its group, its attempt,
// and Seq, its place among the calls of every group. Late says that the
// call's context had ended when it was recorded (see beginCtx).
type groupCall struct {
	N, Attempt, Seq int
	Late            bool
}

func newGroupLog() *groupLog {
	return &groupLog{calls: map[string][]groupCall{}, successes: map[string][]int{}, busy: map[string]int{}}
}

// begin records a call of message n of group g, and returns how many calls
// of it came before and the function that ends the call, to defer (it runs
// on a panic too).
func (l *groupLog) begin(g string, n, attempt int) (int, func()) {
	return l.beginCtx(context.Background(), g, n, attempt)
}

// beginCtx is begin for a queue with a delivery timeout: a call recorded
// once its context ended is Late. One that is not Late was recorded before
// its deadline, so before its message could end by a timeout and let its
// group's next message go: it is in its place among its group's calls.
func (l *groupLog) beginCtx(ctx context.Context, g string, n, attempt int) (int, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	before := 0
	for _, c := range l.calls[g] {
		if c.N == n {
			before++
		}
	}
	l.calls[g] = append(l.calls[g], groupCall{N: n, Attempt: attempt, Seq: l.seq, Late: ctx.Err() != nil})
	if g == "" {
		return before, func() {} // messages without a group run side by side
	}
	if l.busy[g]++; l.busy[g] > 1 {
		l.overlaps++
	}
	return before, func() {
		l.mu.Lock()
		l.busy[g]--
		l.mu.Unlock()
	}
}

// succeeded records that the call of message n of group g succeeds.
func (l *groupLog) succeeded(g string, n int) {
	l.succeededCtx(context.Background(), g, n)
}

// succeededCtx is succeeded for a queue with a delivery timeout: it records
// the success only while the call's context lasts, so that the success is
// in its place among its group's (the call may still time out before it
// returns, and its message be delivered again).
func (l *groupLog) succeededCtx(ctx context.Context, g string, n int) {
	l.mu.Lock()
	if ctx.Err() == nil {
		l.successes[g] = append(l.successes[g], n)
	}
	l.mu.Unlock()
}

// successCount is the number of successes recorded.
func (l *groupLog) successCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.successes {
		n += len(s)
	}
	return n
}

// assertCallsInOrder checks that the calls of group g (other than Late ones)
// come in publish order, a message's attempts one after the other: each N is
// the one before or a later one, an N's attempts count up by one, and a new
// N's attempt is 1 unless firstAttempt (nil: always 1) says otherwise, for a
// message attempted before a restart.
func assertCallsInOrder(t *testing.T, g string, calls []groupCall, firstAttempt func(n int) int) {
	t.Helper()
	prev := groupCall{N: -1}
	for _, c := range calls {
		if c.Late {
			continue
		}
		switch {
		case c.N == prev.N:
			if !assert.Equal(t, prev.Attempt+1, c.Attempt, "group %s: message %d's attempts out of turn in %v", g, c.N, calls) {
				return
			}
		case c.N > prev.N:
			want := 1
			if firstAttempt != nil {
				want = firstAttempt(c.N)
			}
			if !assert.Equal(t, want, c.Attempt, "group %s: message %d's first call here in %v", g, c.N, calls) {
				return
			}
		default:
			assert.Fail(t, "a group's message delivered after a later one", "group %s: message %d after %d in %v", g, c.N, prev.N, calls)
			return
		}
		prev = c
	}
}

// abortMQ ends m at once, its consumers' contexts cancelled, when a test that
// holds a call in its consumer until then fails (after a Stop it does
// nothing).
func abortMQ(m *tinymq.MQ) {
	_ = m.Shutdown(canceledCtx())
	m.Stop()
}

// decodeGrouped is the grouped payload of a durable queue's message.
func decodeGrouped(t *testing.T, msg *tinymq.Msg) grouped {
	var p grouped
	if err := msg.Data.(tinymq.Encoded).Decode(&p); err != nil {
		t.Errorf("message %d: %v", msg.ID, err)
	}
	return p
}

// TestGroupOrderingThousandGroupsKeepTheirPaceAndOrderWhileOneIsHeld: with
// 1,000 groups on 8 workers, each call taking 1ms (fake time), the queue
// delivers 8 messages a millisecond, and the other groups still 7 a
// millisecond while one group's consumer is held: the held group costs its
// own worker and nothing more, its later messages wait, and all the other
// groups complete meanwhile. Messages of other groups fail and retry (an
// error twice, a panic once), each holding back only its own group's later
// messages while the rest go on; every group's calls and successes come in
// publish order.
func TestGroupOrderingThousandGroupsKeepTheirPaceAndOrderWhileOneIsHeld(t *testing.T) {
	const groups, per, conc = 1000, 5, 8
	const work, backoff = time.Millisecond, 5 * time.Millisecond
	const at = 500 * time.Millisecond // well before the work runs out (about 5,300 calls)
	// fails says how a call of message n of group g fails: twice with an
	// error for message 1 of groups 3, 13, ...; once with a panic for
	// message 3 of groups 7, 17, ...
	fails := func(g, n, attempt int) (err, panics bool) {
		return g%10 == 3 && n == 1 && attempt < 3, g%10 == 7 && n == 3 && attempt == 1
	}
	others := (groups - 1) * per // the calls of every group but 0
	for g := 1; g < groups; g++ {
		for n := range per {
			for a := 1; ; a++ {
				err, panics := fails(g, n, a)
				if !err && !panics {
					break
				}
				others++
			}
		}
	}
	for _, held := range []bool{false, true} {
		name := "none held"
		if held {
			name = "group 0 held"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				heldCall, othersDone := make(chan struct{}), make(chan struct{})
				release, free := releaser()
				var returned atomic.Int64 // calls of groups other than 0 that returned
				log := newGroupLog()
				m := tinymq.New(quiet())
				defer m.Stop()
				defer free() // before the Stop, should the test fail
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
					p := msg.Data.(grouped)
					_, end := log.begin(msg.Group(), p.N, msg.Attempt)
					defer end()
					if p.G == 0 {
						if held && p.N == 0 {
							close(heldCall)
							<-release
						} else {
							time.Sleep(work)
						}
						log.succeeded(msg.Group(), p.N)
						return nil
					}
					defer func() {
						if returned.Add(1) == int64(others) {
							close(othersDone)
						}
					}()
					time.Sleep(work)
					switch err, panics := fails(p.G, p.N, msg.Attempt); {
					case err:
						return errors.New("not yet")
					case panics:
						panic("once")
					}
					log.succeeded(msg.Group(), p.N)
					return nil
				}, conc, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: backoff, MaxBackoff: backoff})))
				for n := range per {
					for g := range groups {
						require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
					}
				}
				require.NoError(t, m.Start(context.Background()))
				if held {
					closedWithin(t, heldCall, "the held group's first call")
				}

				// Halfway through a millisecond, every worker is inside a call.
				time.Sleep(at + work/2)
				unheld := conc
				if held {
					unheld--
				}
				want := float64(unheld) * float64(at/work)
				assert.GreaterOrEqual(t, float64(returned.Load()), 0.95*want,
					"calls of the other groups by %v: the %d workers not held, 1 a millisecond each", at, unheld)

				closedWithin(t, othersDone, "every other group's last call")
				if held {
					log.mu.Lock()
					assert.Len(t, log.calls[groupID(0)], 1, "the held group's later messages wait")
					log.mu.Unlock()
					assert.Equal(t, per-1, m.Stats().Queues["q"].Depth, "and count in Depth")
					free()
				}
				stopWithin(t, m)

				log.mu.Lock()
				defer log.mu.Unlock()
				assert.Zero(t, log.overlaps, "two messages of one group in consumers at once")
				var all []int
				for n := range per {
					all = append(all, n)
				}
				for g := range groups {
					id := groupID(g)
					calls := log.calls[id]
					assertCallsInOrder(t, id, calls, nil)
					if !assert.Equal(t, all, log.successes[id], "group %s: successes", id) {
						continue
					}
					// Between a message's attempts, other groups went on.
					for i := 1; i < len(calls); i++ {
						if calls[i].N == calls[i-1].N {
							assert.Greater(t, calls[i].Seq-calls[i-1].Seq, conc,
								"group %s: calls of other groups while message %d waited for its retry", id, calls[i].N)
						}
					}
				}
				st := m.Stats().Queues["q"]
				assert.Equal(t, uint64(groups*per), st.Succeeded)
				assert.Equal(t, uint64(others-(groups-1)*per), st.Retried)
				assertLedger(t, "q", st)
			})
		})
	}
}

// TestGroupOrderingThousandGroupsKeepTheirOrderAcrossARestart: a durable
// queue of 1,000 groups stopped midway (paused and stopped, or paused and
// shut down at a deadline while a message of group 1 is in its consumer),
// with messages waiting for their retry, delivers after a restart each
// group's remaining messages in publish order: the message that was out
// first (a retry keeps its attempt count), its group's later ones behind
// it; a retry after the restart holds back only its own group again, and
// every message succeeds once across both runs.
func TestGroupOrderingThousandGroupsKeepTheirOrderAcrossARestart(t *testing.T) {
	const groups, per, conc = 1000, 4, 8
	// Message 2 of groups 0, 10, ... fails for as long as the first run
	// lasts; message 1 of groups 5, 15, ... fails once in the first run,
	// message 3 of the same groups once in the second.
	const stuck = groups / 10
	for _, mode := range []string{"paused Stop", "Shutdown deadline with a call held"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			register := func(m *tinymq.MQ, consume tinymq.ConsumerFunc) {
				t.Helper()
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consume, conc, tinymq.WithQueueName("q"),
					tinymq.WithDurable(), tinymq.WithGroupOrdering(),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})))
			}
			shutdown := mode != "paused Stop"
			open := func() *tinymq.MQ {
				m := tinymq.New(tinymq.WithDataDir(dir), quiet())
				t.Cleanup(func() { abortMQ(m) })
				return m
			}

			// Run 1.
			log1 := newGroupLog()
			var stuckFailed atomic.Int64
			allStuck, held := make(chan struct{}), make(chan struct{})
			m := open()
			register(m, func(ctx context.Context, msg *tinymq.Msg) error {
				p := decodeGrouped(t, msg)
				_, end := log1.begin(msg.Group(), p.N, msg.Attempt)
				defer end()
				switch {
				case shutdown && p == (grouped{1, 1}):
					close(held)
					<-ctx.Done()
					return ctx.Err()
				case p.G%10 == 0 && p.N == 2:
					if msg.Attempt == 1 && stuckFailed.Add(1) == stuck {
						close(allStuck)
					}
					return errors.New("not before the restart")
				case p.G%10 == 5 && p.N == 1 && msg.Attempt == 1:
					return errors.New("once")
				}
				log1.succeeded(msg.Group(), p.N)
				return nil
			})
			for n := range per {
				for g := range groups {
					require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
				}
			}
			require.NoError(t, m.Start(context.Background()))
			closedWithin(t, allStuck, "the first failure of every stuck message")
			require.NoError(t, m.PauseQueue("q"))
			if shutdown {
				closedWithin(t, held, "the held call")
				require.Eventually(t, func() bool { return m.Stats().Queues["q"].InFlight == 1 }, wait, time.Millisecond,
					"every call but the held one returned")
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				err := m.Shutdown(ctx)
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
			stopWithin(t, m)
			st := m.Stats().Queues["q"]
			assertLedger(t, "q", st)
			left := groups*per - log1.successCount()
			require.Equal(t, uint64(left), st.Undelivered, "what waited stayed in the log")

			// Run 2.
			log2 := newGroupLog()
			var succeeded atomic.Int64
			all := make(chan struct{})
			m = open()
			register(m, func(ctx context.Context, msg *tinymq.Msg) error {
				p := decodeGrouped(t, msg)
				before, end := log2.begin(msg.Group(), p.N, msg.Attempt)
				defer end()
				if shutdown && p == (grouped{1, 1}) && !msg.Redelivered {
					t.Errorf("the message in its consumer at the deadline is not marked redelivered")
				}
				if p.G%10 == 5 && p.N == 3 && before == 0 {
					return errors.New("once more")
				}
				log2.succeeded(msg.Group(), p.N)
				if succeeded.Add(1) == int64(left) {
					close(all)
				}
				return nil
			})
			require.Equal(t, left, m.Stats().Queues["q"].Depth, "restored")
			require.NoError(t, m.Start(context.Background()))
			closedWithin(t, all, "every message left")
			stopWithin(t, m)
			st = m.Stats().Queues["q"]
			assert.Equal(t, uint64(left), st.Succeeded)
			assertLedger(t, "q", st)

			log1.mu.Lock()
			defer log1.mu.Unlock()
			log2.mu.Lock()
			defer log2.mu.Unlock()
			assert.Zero(t, log1.overlaps, "before the restart: two messages of one group in consumers at once")
			assert.Zero(t, log2.overlaps, "after the restart: two messages of one group in consumers at once")
			var want []int
			for n := range per {
				want = append(want, n)
			}
			for g := range groups {
				id := groupID(g)
				before := log1.calls[id]
				assertCallsInOrder(t, id, before, nil)
				// Run 2 begins where run 1 ended: a message attempted in run 1
				// goes on with its attempt count.
				lastAttempt := map[int]int{}
				for _, c := range before {
					lastAttempt[c.N] = c.Attempt
				}
				if shutdown && g == 1 {
					// The call the deadline cut short is not an attempt: the
					// message is delivered again as a broker requeues what a
					// closing consumer did not acknowledge.
					delete(lastAttempt, 1)
				}
				assertCallsInOrder(t, id, log2.calls[id], func(n int) int { return lastAttempt[n] + 1 })
				if after := log2.calls[id]; len(after) > 0 {
					assert.Equal(t, len(log1.successes[id]), after[0].N, "group %s: the first call after the restart", id)
				}
				if g%10 == 0 {
					assert.Equal(t, []int{0, 1}, log1.successes[id], "group %s: before the restart", id)
				}
				assert.Equal(t, want, append(slices.Clone(log1.successes[id]), log2.successes[id]...),
					"group %s: successes before and after the restart", id)
			}
		})
	}
}

// groupConsumer is the consumer of the group tests below: it records each
// call in log, holds message hold (if any) of every group until release is
// closed, fails the first attempt of message failFirst (if any), and records
// every other call's success.
func groupConsumer(log *groupLog, hold int, release <-chan struct{}, failFirst int) tinymq.ConsumerFunc {
	return func(_ context.Context, msg *tinymq.Msg) error {
		p := msg.Data.(grouped)
		_, end := log.begin(msg.Group(), p.N, msg.Attempt)
		defer end()
		if p.N == hold {
			<-release
		}
		if p.N == failFirst && msg.Attempt == 1 {
			return errors.New("again")
		}
		log.succeeded(msg.Group(), p.N)
		return nil
	}
}

// TestGroupOrderingDropHeadEvictsWithoutStickingTheGroup: DropHead on a
// group-ordered queue whose group's earlier message waits, is in a consumer
// or backs off evicts one message per message too many and sticks nothing:
// the group goes on with what is left, in order and one at a time, and the
// ledger holds. (Which message goes is
// TestGroupOrderingDropHeadEvictsTheOldestReadyMessage.)
func TestGroupOrderingDropHeadEvictsWithoutStickingTheGroup(t *testing.T) {
	t.Run("waiting", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			log := newGroupLog()
			m := tinymq.New(quiet())
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, groupConsumer(log, 0, nil, 0), 2,
				tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithMaxLen(2, tinymq.DropHead)))
			require.NoError(t, m.PauseQueue("q"))
			require.NoError(t, m.Start(context.Background()))
			for n := 1; n <= 5; n++ {
				require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
			}
			require.NoError(t, m.ResumeQueue("q"))
			m.Stop()
			assert.Zero(t, log.overlaps)
			assert.Equal(t, []int{4, 5}, log.successes["g0"], "the oldest evicted")
			st := m.Stats().Queues["q"]
			assert.Equal(t, uint64(3), st.Overflowed)
			assertLedger(t, "q", st)
		})
	})
	t.Run("in a consumer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			log := newGroupLog()
			release, free := releaser()
			defer free()
			m := tinymq.New(quiet())
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, groupConsumer(log, 1, release, 0), 2,
				tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithMaxLen(1, tinymq.DropHead)))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
			synctest.Wait() // g0/1 in the consumer
			require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
			require.NoError(t, m.Publish("ev", grouped{0, 3}, tinymq.WithMessageGroup("g0")))
			require.NoError(t, m.Publish("ev", grouped{1, 1}, tinymq.WithMessageGroup("g1")))
			synctest.Wait()
			free()
			m.Stop()
			assert.Zero(t, log.overlaps)
			assertCallsInOrder(t, "g0", log.calls["g0"], nil)
			assert.Equal(t, 2, log.successCount(), "g0/1 and the one message the limit kept")
			st := m.Stats().Queues["q"]
			assert.Equal(t, uint64(2), st.Overflowed)
			assertLedger(t, "q", st)
		})
	})
	t.Run("backing off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			log := newGroupLog()
			m := tinymq.New(quiet())
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, groupConsumer(log, 0, nil, 1), 2,
				tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithMaxLen(2, tinymq.DropHead),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second})))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
			synctest.Wait() // g0/1 failed and backs off, counted in the limit
			for n := 2; n <= 4; n++ {
				require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
			}
			synctest.Wait()
			m.Stop()
			assert.Zero(t, log.overlaps)
			assertCallsInOrder(t, "g0", log.calls["g0"], nil)
			assert.Len(t, log.successes["g0"], 2, "the retry, and the one message the limit kept")
			assert.Equal(t, 1, log.successes["g0"][0])
			st := m.Stats().Queues["q"]
			assert.Equal(t, uint64(2), st.Overflowed)
			assertLedger(t, "q", st)
		})
	})
}

// TestGroupOrderingDropHeadEvictsTheOldestReadyMessage: DropHead dead-letters
// the oldest ready message, and a message held back behind its group's
// earlier one is ready (it counts in Ready): when every ready message of the
// queue waits behind its group's earlier one (in a consumer, or backing
// off), one message too many evicts the oldest of them, not the newcomer.
func TestGroupOrderingDropHeadEvictsTheOldestReadyMessage(t *testing.T) {
	for _, held := range []string{"in a consumer", "backing off"} {
		t.Run(held, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newGroupLog()
				release, free := releaser()
				defer free()
				m := tinymq.New(quiet())
				dead := deadLetters(t, m)
				consume := groupConsumer(log, 1, release, 0)
				if held == "backing off" {
					consume = groupConsumer(log, 0, nil, 1)
				}
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consume, 2, tinymq.WithQueueName("q"),
					tinymq.WithGroupOrdering(), tinymq.WithMaxLen(2, tinymq.DropHead), tinymq.WithDeadLetter("dlx", ""),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second})))
				require.NoError(t, m.Start(context.Background()))
				require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
				synctest.Wait() // g0/1 in the consumer, or backing off
				// Fill the queue to its limit: two held-back messages (g0/2,
				// g0/3) behind the one in the consumer, or one (g0/2) behind
				// the one backing off, which counts too.
				last := 3
				if held == "in a consumer" {
					last = 4
				}
				for n := 2; n < last; n++ {
					require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
				}
				st := m.Stats().Queues["q"]
				require.Equal(t, 2, st.Ready+st.Scheduled, "at the limit")
				require.NoError(t, m.Publish("ev", grouped{0, last}, tinymq.WithMessageGroup("g0")))
				synctest.Wait()
				require.Len(t, dead, 1)
				d := <-dead
				assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
				assert.Equal(t, grouped{0, 2}, d.Data, "the oldest ready message goes, not the newcomer")
				free()
				m.Stop()
				want := []int{1}
				for n := 3; n <= last; n++ {
					want = append(want, n)
				}
				assert.Equal(t, want, log.successes["g0"])
				assertLedger(t, "q", m.Stats().Queues["q"])
			})
		})
	}
}

// TestGroupOrderingChecksAHeldBackMessagesTTLWhenItsTurnComes: a message
// whose TTL passes while an earlier message of its group is in a consumer is
// checked when it is its group's next: it is then dead-lettered as expired,
// never handed to a consumer, and the group goes on.
func TestGroupOrderingChecksAHeldBackMessagesTTLWhenItsTurnComes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release, free := releaser()
		defer free()
		var mu sync.Mutex
		var delivered []int
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			mu.Lock()
			delivered = append(delivered, p.N)
			mu.Unlock()
			if p.N == 1 {
				<-release
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0"), tinymq.WithExpiration(time.Second)))
		require.NoError(t, m.Publish("ev", grouped{0, 3}, tinymq.WithMessageGroup("g0")))
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		free()
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.Expired, "g0/2's TTL passed while its group held it")
		m.Stop()
		mu.Lock()
		assert.Equal(t, []int{1, 3}, delivered, "an expired message never reaches a consumer")
		mu.Unlock()
		require.Len(t, dead, 1)
		d := <-dead
		assert.Equal(t, grouped{0, 2}, d.Data)
		assert.Equal(t, tinymq.ReasonExpired, d.Deaths[0].Reason)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingPurgedRetryReleasesItsGroup: a message waiting for its
// retry holds its group; PurgeQueue removes it and releases the group: the
// group's next message is delivered, and Stop returns.
func TestGroupOrderingPurgedRetryReleasesItsGroup(t *testing.T) {
	for _, next := range []bool{true, false} {
		name := "then Stop"
		if next {
			name = "then the group's next message"
		}
		t.Run(name, func(t *testing.T) {
			failed := make(chan struct{}, 1)
			got := make(chan grouped, 10)
			m := tinymq.New(quiet())
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
				p := msg.Data.(grouped)
				if p.N == 1 {
					failed <- struct{}{}
					return errors.New("retry me")
				}
				got <- p
				return nil
			}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
			recv(t, failed, 1)
			require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, wait, time.Millisecond)
			n, err := m.PurgeQueue("q")
			require.NoError(t, err)
			require.Equal(t, 1, n, "the retry is purged")
			if next {
				require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
				assert.Equal(t, grouped{0, 2}, recv(t, got, 1)[0], "the group goes on")
			}
			stopWithin(t, m)
			st := m.Stats().Queues["q"]
			assert.Equal(t, uint64(1), st.Purged)
			assertLedger(t, "q", st)
		})
	}
}

// TestGroupOrderingPurgedRetryOfADurableQueueStaysPurgedAcrossARestart: the
// purge of a durable group's retry releases the group at once and holds
// after a restart: the purged message never comes back, and the group's
// later messages are delivered in order.
func TestGroupOrderingPurgedRetryOfADurableQueueStaysPurgedAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	got := make(chan int, 10)
	failed := make(chan struct{}, 1)
	register := func(m *tinymq.MQ) {
		t.Helper()
		require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, p grouped) error {
			if p.N == 1 {
				failed <- struct{}{}
				return errors.New("retry me")
			}
			got <- p.N
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithDurable(), tinymq.WithGroupOrdering(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})))
	}
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	register(m)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
	recv(t, failed, 1)
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, wait, time.Millisecond)
	n, err := m.PurgeQueue("q")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
	assert.Equal(t, 2, recv(t, got, 1)[0], "the group goes on at once")
	require.NoError(t, m.PauseQueue("q"))
	require.NoError(t, m.Publish("ev", grouped{0, 3}, tinymq.WithMessageGroup("g0")))
	stopWithin(t, m) // paused: g0/3 stays in the log

	m = tinymq.New(tinymq.WithDataDir(dir), quiet())
	register(m)
	assert.Equal(t, 1, m.Stats().Queues["q"].Depth, "only g0/3 is restored")
	require.NoError(t, m.Start(context.Background()))
	assert.Equal(t, 3, recv(t, got, 1)[0])
	stopWithin(t, m)
	assert.Empty(t, failed, "the purged message never came back")
	assert.Empty(t, got)
	assertLedger(t, "q", m.Stats().Queues["q"])
}

// TestGroupOrderingRetryThatExpiresWhileBackingOffReleasesItsGroup: a
// message whose TTL passes while it waits for its retry is dead-lettered as
// expired, not delivered again, and its group's next message goes on once
// it died.
func TestGroupOrderingRetryThatExpiresWhileBackingOffReleasesItsGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		type call struct {
			N, Attempt int
			At         time.Duration
		}
		var mu sync.Mutex
		var calls []call
		m := tinymq.New(quiet())
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			mu.Lock()
			calls = append(calls, call{p.N, msg.Attempt, time.Since(start)})
			mu.Unlock()
			if p.N == 1 {
				return errors.New("retry me")
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 300 * time.Millisecond, MaxBackoff: 300 * time.Millisecond})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0"), tinymq.WithExpiration(50*time.Millisecond)))
		synctest.Wait() // g0/1 failed and backs off
		require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
		time.Sleep(time.Second)
		synctest.Wait()
		require.Len(t, dead, 1)
		d := <-dead
		assert.Equal(t, grouped{0, 1}, d.Data)
		assert.Equal(t, tinymq.ReasonExpired, d.Deaths[0].Reason)
		mu.Lock()
		assert.Equal(t, []call{{1, 1, 0}, {2, 1, d.Deaths[0].Time.Sub(start)}}, calls,
			"g0/1 is not delivered again; g0/2 goes on as g0/1 dies")
		mu.Unlock()
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Expired)
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingRedeclaredQueueStartsWithNoGroupHeld: a queue deleted
// while a group's message is in its consumer, and declared again, holds no
// group: the group's new message does not wait for the old queue's call.
func TestGroupOrderingRedeclaredQueueStartsWithNoGroupHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release, free := releaser()
		defer free()
		var mu sync.Mutex
		var got []int
		consume := func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			mu.Lock()
			got = append(got, p.N)
			mu.Unlock()
			if p.N == 1 {
				<-release
			}
			return nil
		}
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		_, err := m.Consume("q", consume, 2)
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		for n := 1; n <= 5; n++ {
			require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
		}
		synctest.Wait()
		removed, err := m.DeleteQueue("q")
		require.NoError(t, err)
		assert.Equal(t, 4, removed, "the group's backlog, not its message in the consumer")
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		_, err = m.Consume("q", consume, 2)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", grouped{0, 6}, tinymq.WithMessageGroup("g0")))
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []int{1, 6}, got, "the new queue's message did not wait for the old queue's call")
		mu.Unlock()
		free()
		m.Stop()
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingPauseHoldsTheGroupsNextUntilResumed: a queue paused while
// a group's message is in its consumer hands over nothing more of the group
// when that call returns; resumed, the group goes on in order.
func TestGroupOrderingPauseHoldsTheGroupsNextUntilResumed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newGroupLog()
		release, free := releaser()
		defer free()
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			if p.G != 0 {
				return groupConsumer(log, 0, nil, 0)(ctx, msg)
			}
			return groupConsumer(log, 1, release, 0)(ctx, msg)
		}, 3, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.Start(context.Background()))
		for n := 1; n <= 5; n++ {
			require.NoError(t, m.Publish("ev", grouped{0, n}, tinymq.WithMessageGroup("g0")))
			require.NoError(t, m.Publish("ev", grouped{1, n}, tinymq.WithMessageGroup("g1")))
		}
		synctest.Wait()
		require.NoError(t, m.PauseQueue("q"))
		free()
		synctest.Wait()
		log.mu.Lock()
		assert.Len(t, log.calls["g0"], 1, "a paused queue handed over the group's next")
		log.mu.Unlock()
		require.NoError(t, m.ResumeQueue("q"))
		m.Stop()
		assert.Zero(t, log.overlaps)
		assert.Equal(t, []int{1, 2, 3, 4, 5}, log.successes["g0"])
		assert.Equal(t, []int{1, 2, 3, 4, 5}, log.successes["g1"])
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingPauseWhileARetryBacksOff: a queue paused while a group's
// message backs off, and resumed after its backoff, goes on with the retry,
// then the group's next.
func TestGroupOrderingPauseWhileARetryBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newGroupLog()
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, groupConsumer(log, 0, nil, 1), 2,
			tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
		require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
		synctest.Wait()
		require.NoError(t, m.PauseQueue("q"))
		time.Sleep(5 * time.Second)
		synctest.Wait()
		log.mu.Lock()
		assert.Len(t, log.calls["g0"], 1, "nothing while paused")
		log.mu.Unlock()
		require.NoError(t, m.ResumeQueue("q"))
		m.Stop()
		assert.Equal(t, []groupCall{{N: 1, Attempt: 1, Seq: 1}, {N: 1, Attempt: 2, Seq: 2}, {N: 2, Attempt: 1, Seq: 3}}, log.calls["g0"])
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingHoldsAcrossCompetingSubscriptions: two subscriptions of a
// rate-limited group-ordered queue, one cancelled midway, still hand each
// group's messages over one at a time, in publish order.
func TestGroupOrderingHoldsAcrossCompetingSubscriptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const per = 40
		log := newGroupLog()
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering(),
			tinymq.WithRateLimit(100, 5), tinymq.WithMessageTTL(time.Hour)))
		consume := func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			_, end := log.begin(msg.Group(), p.N, msg.Attempt)
			defer end()
			time.Sleep(30 * time.Millisecond)
			log.succeeded(msg.Group(), p.N)
			return nil
		}
		_, err := m.Consume("q", consume, 3)
		require.NoError(t, err)
		s2, err := m.Consume("q", consume, 3)
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		for n := range per {
			for g := range 3 {
				require.NoError(t, m.Publish("ev", grouped{g, n}, tinymq.WithMessageGroup(groupID(g))))
			}
		}
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, s2.Cancel(context.Background()))
		m.Stop()
		assert.Zero(t, log.overlaps, "two messages of one group in consumers at once")
		var want []int
		for n := range per {
			want = append(want, n)
		}
		for g := range 3 {
			assert.Equal(t, want, log.successes[groupID(g)], "group %d", g)
		}
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingCancelledSubscriptionsCallStillHoldsItsGroup: a
// subscription cancelled while its call of a group's message still runs
// (Cancel's context ended first) holds the group until that call returns:
// the group's next message does not go to the other subscription meanwhile.
func TestGroupOrderingCancelledSubscriptionsCallStillHoldsItsGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newGroupLog()
		release, free := releaser()
		defer free()
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithGroupOrdering()))
		sub1, err := m.Consume("q", groupConsumer(log, 1, release, 0), 1)
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
		synctest.Wait()
		_, err = m.Consume("q", groupConsumer(log, 1, release, 0), 2)
		require.NoError(t, err)
		require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		assert.ErrorIs(t, sub1.Cancel(ctx), context.DeadlineExceeded)
		cancel()
		synctest.Wait()
		log.mu.Lock()
		assert.Len(t, log.calls["g0"], 1, "g0/2 began while g0/1 still ran in the cancelled subscription")
		log.mu.Unlock()
		free()
		m.Stop()
		assert.Zero(t, log.overlaps)
		assert.Equal(t, []int{1, 2}, log.successes["g0"])
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupOrderingForgetsDrainedGroups: a group costs memory only while it
// has messages; 200,000 one-message groups, drained, give theirs back.
func TestGroupOrderingForgetsDrainedGroups(t *testing.T) {
	const n = 200_000
	m := tinymq.New(quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 4,
		tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := heap()
	for i := range n {
		require.NoError(t, m.Publish("ev", nil, tinymq.WithMessageGroup(fmt.Sprintf("group-%040d", i))))
	}
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Succeeded == n }, wait, time.Millisecond)
	grown := int64(heap()) - int64(base)
	t.Logf("the heap grew %d bytes for %d drained groups", grown, n)
	assert.Less(t, grown, int64(4<<20), "drained groups are kept")
}

// TestGroupOrderingShutdownDeadlineCountsEveryMessage: a Shutdown deadline
// on a rate-limited group-ordered queue whose group waits behind a retry
// counts every message that waits (the retry, its group's backlog) as
// undelivered, once the other group had all its messages delivered at the
// rate.
func TestGroupOrderingShutdownDeadlineCountsEveryMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			if msg.Data == 0 {
				return errors.New("retry")
			}
			return nil
		}, 3, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithRateLimit(1, 1),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Minute})))
		require.NoError(t, m.Start(context.Background()))
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i, tinymq.WithMessageGroup(strconv.Itoa(i%2))))
		}
		time.Sleep(5 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(5), st.Succeeded, "group 1, one a second")
		assert.Equal(t, uint64(5), st.Undelivered, "group 0: the retry and its backlog")
		assertLedger(t, "q", st)
	})
}

// TestGroupOrderingTimedOutMessageEndsItsTurn: in a group-ordered queue a
// message whose call timed out has ended its turn: its retry, or without
// one the group's next message, is handed over at once, beside the
// abandoned call that still runs.
func TestGroupOrderingTimedOutMessageEndsItsTurn(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry %v", retry), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const d, backoff = time.Second, time.Millisecond
				type call struct {
					N, Attempt int
					At         time.Duration
					Beside     int32 // other calls running when it began
				}
				start := time.Now()
				release, free := releaser()
				defer free()
				var mu sync.Mutex
				var calls []call
				var running atomic.Int32
				opts := []tinymq.QueueOption{tinymq.WithQueueName("q"), tinymq.WithGroupOrdering(), tinymq.WithDeliveryTimeout(d)}
				if retry {
					opts = append(opts, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: backoff, MaxBackoff: backoff}))
				}
				m := tinymq.New(quiet())
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
					p := msg.Data.(grouped)
					beside := running.Add(1) - 1
					defer running.Add(-1)
					mu.Lock()
					calls = append(calls, call{p.N, msg.Attempt, time.Since(start), beside})
					mu.Unlock()
					if p.N == 1 && msg.Attempt == 1 {
						<-release // ignores ctx
					}
					return nil
				}, 2, opts...))
				require.NoError(t, m.Start(context.Background()))
				require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0")))
				require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
				time.Sleep(2 * d)
				synctest.Wait()
				want := []call{{1, 1, 0, 0}, {2, 1, d, 1}}
				if retry {
					want = []call{{1, 1, 0, 0}, {1, 2, d + backoff, 1}, {2, 1, d + backoff, 1}}
				}
				mu.Lock()
				assert.Equal(t, want, calls)
				mu.Unlock()
				free()
				m.Stop()
				st := m.Stats().Queues["q"]
				assert.Equal(t, uint64(1), st.TimedOut)
				assertLedger(t, "q", st)
			})
		})
	}
}

// TestGroupOrderingDelayedMessageJoinsItsGroupWhenItsDelayEnds: a message
// published WithDelay joins its group when its delay ends, behind the
// messages of the group that joined before, here one published after it
// and still in its consumer then.
func TestGroupOrderingDelayedMessageJoinsItsGroupWhenItsDelayEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type call struct {
			N  int
			At time.Duration
		}
		start := time.Now()
		var mu sync.Mutex
		var calls []call
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			p := msg.Data.(grouped)
			mu.Lock()
			calls = append(calls, call{p.N, time.Since(start)})
			mu.Unlock()
			if p.N == 2 {
				time.Sleep(2 * time.Second)
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithGroupOrdering()))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", grouped{0, 1}, tinymq.WithMessageGroup("g0"), tinymq.WithDelay(time.Second)))
		require.NoError(t, m.Publish("ev", grouped{0, 2}, tinymq.WithMessageGroup("g0")))
		m.Stop()
		assert.Equal(t, []call{{2, 0}, {1, 2 * time.Second}}, calls,
			"g0/1 joined at 1s, behind g0/2, and waited for its call")
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// TestGroupIsCarriedByADeliveryAndItsRetry: a RegisterDeliveryHandler
// consumer sees the message's group in Delivery.Group, with the rest of its
// metadata, on every attempt.
func TestGroupIsCarriedByADeliveryAndItsRetry(t *testing.T) {
	type payload struct{ A int }
	got := make(chan tinymq.Delivery[payload], 2)
	m := tinymq.New(quiet())
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Direct, func(_ context.Context, d tinymq.Delivery[payload]) error {
		got <- d
		if d.Attempt == 1 {
			return errors.New("again")
		}
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithBindingKey("k"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", payload{3}, tinymq.WithRoutingKey("k"),
		tinymq.WithHeaders(map[string]any{"h": "v"}), tinymq.WithMessageGroup("g")))
	for i, d := range recv(t, got, 2) {
		assert.Equal(t, uint64(1), d.ID)
		assert.Equal(t, "ev", d.Exchange)
		assert.Equal(t, "q", d.Queue)
		assert.Equal(t, "k", d.RoutingKey)
		assert.Equal(t, "v", d.Headers["h"])
		assert.Equal(t, payload{3}, d.Data)
		assert.Equal(t, i+1, d.Attempt)
		assert.Equal(t, "g", d.Group)
		assert.False(t, d.Redelivered)
	}
	stopWithin(t, m)
}
