package tinymq_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

func TestPeekShowsTheHeadInOrderAndChangesNothing(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	for i := range 5 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithHeaders(map[string]any{"n": int64(i)})))
	}
	before := m.Stats().Queues["q"]
	got, err := m.Peek("q", 3)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i, msg := range got {
		assert.Equal(t, i, msg.Data, "message %d", i)
		assert.Equal(t, "q", msg.Queue)
		assert.False(t, msg.Redelivered)
		msg.Headers["n"] = int64(-1) // a copy: the queue's message keeps its own
	}
	all, err := m.Peek("q", 100)
	require.NoError(t, err)
	assert.Len(t, all, 5, "at most what waits")
	after := m.Stats().Queues["q"]
	assert.GreaterOrEqual(t, after.OldestAge, before.OldestAge, "the head stays the head")
	before.OldestAge, after.OldestAge = 0, 0 // the time passes
	assert.Equal(t, before, after, "Peek changes no count")
	none, err := m.Peek("q", 0)
	require.NoError(t, err)
	assert.Empty(t, none)

	ch := make(chan *tinymq.Msg, 5)
	_, err = m.Consume("q", sink(ch), 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	for i, msg := range recv(t, ch, 5) {
		assert.Equal(t, i, msg.Data, "delivered in order after a Peek")
		assert.Equal(t, int64(i), msg.Headers["n"], "the peeked copy's change did not reach the queue")
		assert.Equal(t, 1, msg.Attempt)
	}
	stopWithin(t, m)
}

func TestPeekSeesMessagesTakenInABatch(t *testing.T) {
	m := tinymq.New(quiet())
	release := make(chan struct{})
	entered := make(chan int, 1)
	got := make(chan int, 100)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	_, err := tinymq.ConsumeHandler(m, "q", func(_ context.Context, n int) error {
		if n == 0 {
			entered <- n
			<-release
		}
		got <- n
		return nil
	}, 1)
	require.NoError(t, err)
	for i := range 20 {
		require.NoError(t, m.Publish("ev", i))
	}
	require.NoError(t, m.Start(context.Background()))
	recv(t, entered, 1) // the worker holds a batch: 0 in the consumer, the rest taken and not begun
	peeked, err := m.Peek("q", 5)
	require.NoError(t, err)
	var ns []any
	for _, msg := range peeked {
		ns = append(ns, msg.Data)
	}
	assert.Equal(t, []any{1, 2, 3, 4, 5}, ns, "the head is what the worker took and has not begun")
	close(release)
	want := make([]int, 20)
	for i := range want {
		want[i] = i
	}
	assert.Equal(t, want, recv(t, got, 20), "still delivered once each, in order")
	stopWithin(t, m)
}

func TestPeekRefusesBadInput(t *testing.T) {
	m := tinymq.New(quiet())
	_, err := m.Peek("nope", 1)
	assert.ErrorIs(t, err, tinymq.ErrUnknownQueue)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	_, err = m.Peek("q", -1)
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	m.Stop()
	_, err = m.Peek("q", 1)
	assert.NoError(t, err, "Peek works after Stop")
}

func TestPeekReadsADurableQueueFromTheLog(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(quiet(), tinymq.WithDataDir(dir))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	for i := range 3 {
		require.NoError(t, m.Publish("ev", i, tinymq.WithRoutingKey("k")))
	}
	stopWithin(t, m)

	m = tinymq.New(quiet(), tinymq.WithDataDir(dir))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable()))
	got, err := m.Peek("q", 10)
	require.NoError(t, err)
	require.Len(t, got, 3, "the restored backlog, read from the log")
	for i, msg := range got {
		var n int
		require.NoError(t, msg.Data.(tinymq.Encoded).Decode(&n))
		assert.Equal(t, i, n)
		assert.Equal(t, "k", msg.RoutingKey)
	}
	assert.Equal(t, 3, m.Stats().Queues["q"].Depth, "still waiting")
	stopWithin(t, m)
}

// After Stop, Peek shows nothing: Stop counted what it could not deliver (in
// a queue with no consumer, or a paused one) as undelivered, and a durable
// queue's messages stay in the log, where OpenDataDir reads them.
func TestPeekAfterStopShowsNothing(t *testing.T) {
	for _, mode := range []string{"no consumer", "paused", "durable, no consumer"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			m := tinymq.New(quiet(), tinymq.WithDataDir(dir))
			var opts []tinymq.QueueOption
			if mode == "durable, no consumer" {
				opts = append(opts, tinymq.WithDurable())
			}
			require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, opts...))
			if mode == "paused" {
				_, err := m.Consume("q", failing, 1)
				require.NoError(t, err)
				require.NoError(t, m.PauseQueue("q"))
			}
			require.NoError(t, m.Start(context.Background()))
			for i := range 3 {
				require.NoError(t, m.Publish("ev", i))
			}
			before, err := m.Peek("q", 10)
			require.NoError(t, err)
			assert.Len(t, before, 3)
			stopWithin(t, m)
			assert.Equal(t, uint64(3), m.Stats().Queues["q"].Undelivered)
			after, err := m.Peek("q", 10)
			require.NoError(t, err)
			assert.Empty(t, after, "Peek after Stop")
			if mode != "durable, no consumer" {
				return
			}
			dd, err := tinymq.OpenDataDir(dir)
			require.NoError(t, err)
			defer dd.Close()
			n := 0
			require.NoError(t, dd.Messages("q", func(*tinymq.Msg) bool { n++; return true }))
			assert.Equal(t, 3, n, "the durable queue's messages stay in the log")
		})
	}
}
