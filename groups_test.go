package tinymq_test

import (
	"context"
	"errors"
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
	release := make(chan struct{})
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
	close(release)
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
		held, release := make(chan struct{}), make(chan struct{})
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
		close(release)
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
