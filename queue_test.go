package tinymq

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRingIsFIFOAcrossWrapAndResize(t *testing.T) {
	var r ring
	var want []*Msg
	var next uint64
	var got []*Msg
	// Grow and shrink through several sizes, popping odd batch sizes so the
	// head wraps around the backing array.
	for round, n := range []int{5, 40, 3, 300, 17, 1000, 1} {
		for range n {
			next++
			m := &Msg{ID: next}
			r.push(m)
			want = append(want, m)
		}
		for r.n > round {
			got = r.pop(got, min(r.n, 7))
		}
	}
	got = r.pop(got, r.n)
	require.Equal(t, len(want), len(got))
	for i := range want {
		require.Same(t, want[i], got[i], "position %d", i)
	}
}

func TestRingGivesMemoryBackWhenDrained(t *testing.T) {
	var r ring
	const n = 100_000
	for i := range n {
		r.push(&Msg{ID: uint64(i)})
	}
	require.GreaterOrEqual(t, len(r.buf), n)
	var batch []*Msg
	for r.n > 0 {
		batch = r.pop(batch[:0], min(r.n, maxBatch))
	}
	assert.Equal(t, minRing, len(r.buf), "the backing array shrinks back as the ring drains")
	for _, m := range r.buf {
		assert.Nil(t, m, "popped slots are cleared so messages can be collected")
	}
}

func TestQueueGivesMemoryBackAfterDraining(t *testing.T) {
	release := make(chan struct{})
	drained := make(chan struct{})
	const n = 50_000
	var count int
	m := New()
	require.NoError(t, m.RegisterQueue("ev", Fanout, func(context.Context, *Msg) error {
		<-release
		count++
		if count == n {
			close(drained)
		}
		return nil
	}, 1, WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	for i := range n {
		require.NoError(t, m.Publish("ev", i))
	}
	q := m.queues["q"]
	q.mu.Lock()
	grown := len(q.ring.buf)
	q.mu.Unlock()
	assert.GreaterOrEqual(t, grown, n-maxBatch, "a stalled consumer lets the buffer grow without bound")
	close(release)
	<-drained
	q.mu.Lock()
	defer q.mu.Unlock()
	assert.LessOrEqual(t, len(q.ring.buf), minRing, "memory is given back once the queue drains")
}

func TestBatchIsAFairShare(t *testing.T) {
	q := newQueue(0, "q", nil, 4, nil, discardLogger)
	for i := range 400 {
		q.push(&Msg{ID: uint64(i)})
	}
	assert.Len(t, q.take(nil), maxBatch, "never more than maxBatch under one lock")
	for q.ring.n > 8 {
		q.take(nil)
	}
	assert.Len(t, q.take(nil), 2, "a quarter of what is left with 4 workers")
	assert.Len(t, q.take(nil), 1, "at least one")
}
