package tinymq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// walked is what one WalkStats saw: the two maps of Stats, rebuilt, the
// queues in the order they came, and what it returned.
type walked struct {
	stats  tinymq.Stats
	queues []string
}

func walk(m *tinymq.MQ) walked {
	w := walked{stats: tinymq.Stats{Exchanges: map[string]tinymq.ExchangeStats{}, Queues: map[string]tinymq.QueueStats{}}}
	rest := m.WalkStats(func(name string, es *tinymq.ExchangeStats) bool {
		w.stats.Exchanges[name] = *es
		return true
	}, func(name string, qs *tinymq.QueueStats) bool {
		w.stats.Queues[name] = *qs
		w.queues = append(w.queues, name)
		return true
	})
	if rest.Exchanges != nil || rest.Queues != nil {
		panic("WalkStats returned maps")
	}
	w.stats.Deleted, w.stats.DeletedQueues, w.stats.ExpiredQueues = rest.Deleted, rest.DeletedQueues, rest.ExpiredQueues
	return w
}

// walkStatsMQ returns a stopped MQ whose Stats has a bit of everything: busy
// and idle queues, a deleted one, an unroutable exchange, a backlog in the
// log under an in-memory queue (Stored) and two queues only the log knows
// (Unregistered, one with messages and one without).
func walkStatsMQ(t *testing.T) *tinymq.MQ {
	t.Helper()
	ok := func(context.Context, *tinymq.Msg) error { return nil }
	dir := t.TempDir()
	m0 := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m0.RegisterQueue("ev", tinymq.Fanout, ok, 1, tinymq.WithQueueName("stored"), tinymq.WithDurable()))
	require.NoError(t, m0.RegisterQueue("held", tinymq.Fanout, ok, 1, tinymq.WithQueueName("held"), tinymq.WithDurable()))
	require.NoError(t, m0.DeclareQueue("idle", "idle", tinymq.Fanout, tinymq.WithDurable()))
	for i := range 3 {
		require.NoError(t, m0.Publish("ev", i))
	}
	require.NoError(t, m0.Publish("held", 1))
	_ = m0.Shutdown(context.Background()) // before Start: the messages stay in the log

	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, ok, 1, tinymq.WithQueueName("stored")))
	for i := range 5 {
		require.NoError(t, m.RegisterQueue(fmt.Sprintf("ex%d", i), tinymq.Fanout, ok, 1, tinymq.WithQueueName(fmt.Sprintf("q%d", i))))
	}
	require.NoError(t, m.DeclareQueue("gone", "ex0", tinymq.Fanout))
	require.NoError(t, m.DeclareExchange("nowhere", tinymq.Direct))
	require.NoError(t, m.Start(context.Background()))
	for i := range 5 {
		for range i + 1 {
			require.NoError(t, m.Publish(fmt.Sprintf("ex%d", i), i))
		}
	}
	require.ErrorIs(t, m.Publish("nowhere", 1), tinymq.ErrNoRoute)
	_, err := m.DeleteQueue("gone")
	require.NoError(t, err)
	m.Stop()
	return m
}

// WalkStats hands each exchange and queue the stats that Stats has for it,
// queues in registration order and then those only the log knows by name,
// and returns the rest of Stats.
func TestWalkStatsIsStatsWithoutItsMaps(t *testing.T) {
	m := walkStatsMQ(t)
	want := m.Stats()
	got := walk(m)
	// The held queue's oldest message ages between the two reads.
	held, walked := want.Queues["held"], got.stats.Queues["held"]
	assert.Positive(t, held.OldestAge)
	assert.GreaterOrEqual(t, walked.OldestAge, held.OldestAge)
	held.OldestAge, walked.OldestAge = 0, 0
	want.Queues["held"], got.stats.Queues["held"] = held, walked
	assert.Equal(t, want, got.stats)
	assert.Equal(t, []string{"stored", "q0", "q1", "q2", "q3", "q4", "held", "idle"}, got.queues)

	// What the scenario was for, so that the comparison compares something.
	assert.Equal(t, 3, want.Queues["stored"].Stored)
	assert.True(t, want.Queues["held"].Unregistered)
	assert.Equal(t, 1, want.Queues["held"].Depth)
	assert.True(t, want.Queues["idle"].Unregistered)
	assert.Equal(t, uint64(5), want.Queues["q4"].Succeeded)
	assert.Equal(t, uint64(1), want.Exchanges["nowhere"].Unroutable)
	assert.Equal(t, uint64(1), want.DeletedQueues)
}

// A walk ends when its function returns false, or is skipped when it is nil;
// the other walk goes on.
func TestWalkStatsStopsWhereItIsTold(t *testing.T) {
	m := walkStatsMQ(t)
	var queues, exchanges int
	rest := m.WalkStats(func(string, *tinymq.ExchangeStats) bool {
		exchanges++
		return false
	}, func(string, *tinymq.QueueStats) bool {
		queues++
		return queues < 3
	})
	assert.Equal(t, 1, exchanges)
	assert.Equal(t, 3, queues)
	assert.Equal(t, uint64(1), rest.DeletedQueues)

	queues = 0
	m.WalkStats(nil, func(string, *tinymq.QueueStats) bool { queues++; return true })
	assert.Equal(t, 8, queues)
	exchanges = 0
	m.WalkStats(func(string, *tinymq.ExchangeStats) bool { exchanges++; return true }, nil)
	assert.Equal(t, len(m.Stats().Exchanges), exchanges)
	assert.Equal(t, m.Stats().Deleted, m.WalkStats(nil, nil).Deleted)

	var zero tinymq.MQ
	assert.Equal(t, tinymq.Stats{}, zero.WalkStats(func(string, *tinymq.ExchangeStats) bool { panic("no exchange") },
		func(string, *tinymq.QueueStats) bool { panic("no queue") }), "the zero MQ")
	assert.Zero(t, zero.TopologyVersion())
}

// The walk's functions run with no lock of the MQ held: they may change it,
// and a queue deleted meanwhile is not walked.
func TestWalkStatsFunctionsMayCallTheMQ(t *testing.T) {
	m := started(t)
	ok := func(context.Context, *tinymq.Msg) error { return nil }
	for _, q := range []string{"a", "b", "c"} {
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, ok, 1, tinymq.WithQueueName(q)))
	}
	var seen []string
	m.WalkStats(func(string, *tinymq.ExchangeStats) bool {
		require.NoError(t, m.DeclareExchange("new", tinymq.Fanout)) // the write lock
		return true
	}, func(name string, qs *tinymq.QueueStats) bool {
		seen = append(seen, name)
		if name == "a" {
			_, err := m.DeleteQueue("b")
			require.NoError(t, err)
			assert.Len(t, m.Stats().Queues, 2)
		}
		return true
	})
	assert.Equal(t, []string{"a", "c"}, seen)
}

// WalkStats allocates the same few times whatever the number of queues: no
// map, no value per queue.
func TestWalkStatsAllocatesNoMap(t *testing.T) {
	allocs := func(queues int) float64 {
		m := tinymq.New()
		for i := range queues {
			require.NoError(t, m.DeclareQueue(fmt.Sprintf("q%d", i), fmt.Sprintf("ex%d", i), tinymq.Fanout))
		}
		var n int
		return testing.AllocsPerRun(10, func() {
			m.WalkStats(func(string, *tinymq.ExchangeStats) bool { n++; return true },
				func(string, *tinymq.QueueStats) bool { n++; return true })
		})
	}
	small, large := allocs(10), allocs(1000)
	assert.Equal(t, small, large, "allocations do not grow with the queues")
	assert.LessOrEqual(t, large, 4.0)
}

// WalkStats on an engine walks the engine's Stats, by name.
func TestWalkStatsOnAnEngine(t *testing.T) {
	e := &statsEngine{hEngine: &hEngine{specs: map[string]tinymq.QueueSpec{}}, stats: tinymq.Stats{
		Exchanges: map[string]tinymq.ExchangeStats{"y": {Published: 2}, "x": {Published: 1}},
		Queues:    map[string]tinymq.QueueStats{"b": {Accepted: 2}, "a": {Accepted: 1}},
		Deleted:   tinymq.QueueStats{Removed: 7}, DeletedQueues: 3, ExpiredQueues: 1,
	}}
	m := tinymq.New(tinymq.WithEngine(e))
	got := walk(m)
	assert.Equal(t, e.stats, got.stats)
	assert.Equal(t, []string{"a", "b"}, got.queues)
}

type statsEngine struct {
	*hEngine
	stats tinymq.Stats
}

func (e *statsEngine) Stats() tinymq.Stats { return e.stats }

// TopologyVersion moves with every change of the exchanges, queues and
// bindings, before the call that made it returns, and stays put otherwise.
func TestTopologyVersionMovesWithTheTopology(t *testing.T) {
	m := tinymq.New()
	defer m.Stop()
	ok := func(context.Context, *tinymq.Msg) error { return nil }
	last := m.TopologyVersion()
	moved := func(what string) {
		t.Helper()
		v := m.TopologyVersion()
		assert.Greater(t, v, last, what)
		last = v
	}
	require.NoError(t, m.DeclareExchange("ex", tinymq.Topic))
	moved("DeclareExchange")
	require.NoError(t, m.RegisterQueue("ex", tinymq.Topic, ok, 1, tinymq.WithQueueName("q"), tinymq.WithBindingKey("a")))
	moved("RegisterQueue")
	require.NoError(t, m.DeclareQueue("d", "ex", tinymq.Topic, tinymq.WithBindingKey("d")))
	moved("DeclareQueue")
	require.NoError(t, m.Bind("q", "ex", tinymq.Topic, tinymq.WithBindingKey("b")))
	moved("Bind")
	require.NoError(t, m.Unbind("q", "ex", tinymq.WithBindingKey("b")))
	moved("Unbind")
	sub, err := m.Consume("d", ok, 1)
	require.NoError(t, err)
	moved("Consume")
	require.NoError(t, m.Start(context.Background()))
	moved("Start")
	_, err = m.DeleteQueue("q")
	require.NoError(t, err)
	moved("DeleteQueue")

	for range 3 { // reads, publishes and stats leave it alone
		m.Topology()
		m.Stats()
		m.WalkStats(nil, nil)
		require.NoError(t, m.Publish("ex", 1, tinymq.WithRoutingKey("d")))
	}
	assert.Equal(t, last, m.TopologyVersion(), "nothing changed")
	require.NoError(t, sub.Cancel(context.Background()))
	moved("Cancel")
	assert.Zero(t, testing.AllocsPerRun(10, func() { m.TopologyVersion() }))
}

// A reader that keeps a Topology while TopologyVersion stays put never
// misses a binding: racing writers, each reader re-reads on a move and
// finally holds what Topology returns.
func TestTopologyVersionNeverHidesAChange(t *testing.T) {
	m := tinymq.New()
	defer m.Stop()
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range 50 {
				q := fmt.Sprintf("q%d-%d", w, i)
				if err := m.DeclareQueue(q, "ex", tinymq.Fanout); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					if _, err := m.DeleteQueue(q); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	var kept tinymq.Topology
	lastRead := ^uint64(0) // no version read yet
	read := func() {
		if v := m.TopologyVersion(); v != lastRead {
			kept, lastRead = m.Topology(), v
		}
	}
	for range 200 {
		read()
	}
	wg.Wait()
	read()
	assert.Equal(t, m.Topology(), kept)
	assert.Len(t, kept.Queues, 50)
}
