package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// A filter that publishes the same deduplication ID from inside the publish
// it filters must not wait for that publish (it never ends): the inner
// publish returns an error at once and the outer one is routed.
func TestDeduplicationPublishOfTheSameIDFromAFilterDoesNotDeadlock(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	inner := make(chan error, 1)
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"),
		tinymq.WithFilter(func(msg *tinymq.Msg) bool {
			if msg.Data == "outer" {
				inner <- m.Publish("ev", "inner", tinymq.WithDeduplicationID("id"))
			}
			return true
		})))
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { stopWithin(t, m) })
	done := make(chan error, 1)
	go func() { done <- m.Publish("ev", "outer", tinymq.WithDeduplicationID("id")) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("a publish whose filter publishes its own deduplication ID froze")
	}
	err := <-inner
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "the inner publish is refused, not routed")
	assert.Equal(t, "outer", (<-got).Data)
	require.NoError(t, m.Publish("ev", "retry", tinymq.WithDeduplicationID("id")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
	assert.Equal(t, uint64(1), m.Stats().Queues["q"].Accepted)
}

// A filter that panics fails the publish and leaves no ID behind: a retry of
// the ID is routed.
func TestDeduplicationFilterPanicForgetsTheID(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	var panicked atomic.Bool
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"),
		tinymq.WithFilter(func(*tinymq.Msg) bool {
			if panicked.CompareAndSwap(false, true) {
				panic("filter")
			}
			return true
		})))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	var pe *tinymq.PanicError
	require.ErrorAs(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("x")), &pe)
	require.NoError(t, m.Publish("ev", 2, tinymq.WithDeduplicationID("x")))
	assert.Equal(t, 2, (<-got).Data)
	assert.Zero(t, m.Stats().Exchanges["ev"].Duplicates)
}

// A publish waiting for the first publish of its ID (stuck on a full Block
// queue) returns its ctx's error when that ends, and routes nothing; once the
// first is accepted, a retry is a duplicate.
func TestDeduplicationWaiterGivesUpWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.Block)))
		require.NoError(t, m.Publish("ev", "fill"))
		first := make(chan error, 1)
		go func() { first <- m.Publish("ev", "a", tinymq.WithDeduplicationID("id")) }()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := m.PublishContext(ctx, "ev", "b", tinymq.WithDeduplicationID("id"))
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, m.Start(context.Background()))
		var n atomic.Int64
		_, err = m.Consume("q", func(context.Context, *tinymq.Msg) error { n.Add(1); return nil }, 1)
		require.NoError(t, err)
		require.NoError(t, <-first)
		require.NoError(t, m.Publish("ev", "c", tinymq.WithDeduplicationID("id")))
		m.Stop()
		assert.Equal(t, int64(2), n.Load(), "fill and a")
		assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// Deleting the exchange forgets its IDs: a re-declared exchange of the same
// name routes an ID the deleted one had accepted, in memory.
func TestDeduplicationDeleteExchangeAndRedeclareStartsAfresh(t *testing.T) {
	m := tinymq.New(quiet())
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("x")))
	require.NoError(t, m.DeleteExchange("ev"))
	assert.ErrorIs(t, m.Publish("ev", 2, tinymq.WithDeduplicationID("x")), tinymq.ErrUnknownExchange)
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.Bind("q", "ev", tinymq.Fanout))
	require.NoError(t, m.Publish("ev", 3, tinymq.WithDeduplicationID("x")))
	assert.Equal(t, []any{1, 3}, []any{(<-got).Data, (<-got).Data})
	// Re-declared without deduplication, the ID is refused as an option.
	require.NoError(t, m.DeleteExchange("ev"))
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout))
	assert.ErrorIs(t, m.Publish("ev", 4, tinymq.WithDeduplicationID("x")), tinymq.ErrInvalidOption)
}

// With a data directory, what DeleteExchange forgot stays forgotten across a
// restart, as it is in the same run: the deleted exchange's i/ records do
// not come back into a new exchange of the same name.
func TestDeduplicationDeletedExchangesIDsStayForgottenAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	var got recorder
	m := durableDedup(t, dir, time.Hour, &got)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "first", tinymq.WithDeduplicationID("x")))
	require.NoError(t, m.DeleteExchange("ev"))
	m.Stop()

	m2 := durableDedup(t, dir, time.Hour, &got)
	require.NoError(t, m2.Start(context.Background()))
	require.NoError(t, m2.Publish("ev", "again", tinymq.WithDeduplicationID("x")))
	m2.Stop()
	assert.Zero(t, m2.Stats().Exchanges["ev"].Duplicates, "the deleted exchange's ID came back")
}

// Publishers of a few IDs racing Stop: every publish returns nil or
// ErrStopped, each ID is routed at most once, and every accepted message
// ends once.
func TestDeduplicationRacingStopRoutesEachIDAtMostOnce(t *testing.T) {
	for round := range 10 {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		var mu sync.Mutex
		seen := map[any]int{}
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			seen[msg.Data]++
			mu.Unlock()
			return nil
		}, 4, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		var wg sync.WaitGroup
		var nils, stopped atomic.Int64
		for p := range 8 {
			wg.Go(func() {
				for i := range 200 {
					id := fmt.Sprint(i % 50)
					err := m.Publish("ev", id, tinymq.WithDeduplicationID(id))
					switch {
					case err == nil:
						nils.Add(1)
					case errors.Is(err, tinymq.ErrStopped):
						stopped.Add(1)
					default:
						t.Errorf("round %d publisher %d: %v", round, p, err)
						return
					}
				}
			})
		}
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		m.Stop()
		wg.Wait()
		st := m.Stats()
		for id, n := range seen {
			assert.Equal(t, 1, n, "round %d: ID %v routed %d times", round, id, n)
		}
		qs := st.Queues["q"]
		assert.Equal(t, uint64(len(seen)), qs.Accepted)
		assert.Equal(t, uint64(nils.Load()), qs.Accepted+st.Exchanges["ev"].Duplicates, "round %d: every nil is an accepted message or a duplicate", round)
		assertLedger(t, "q", qs)
	}
}

// A late consumer call (past its delivery timeout) that publishes its own
// message's deduplication ID again sees a duplicate, not a freeze.
func TestDeduplicationRepublishFromATimedOutConsumerIsADuplicate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		res := make(chan error, 1)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			<-ctx.Done()
			time.Sleep(time.Millisecond)
			res <- m.Publish("ev", "again", tinymq.WithDeduplicationID("id"))
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "first", tinymq.WithDeduplicationID("id")))
		synctest.Wait()
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		require.Len(t, res, 1, "the late call's publish returned")
		assert.NoError(t, <-res)
		m.Stop()
		st := m.Stats()
		assert.Equal(t, uint64(1), st.Exchanges["ev"].Duplicates)
		assert.Equal(t, uint64(1), st.Queues["q"].Accepted)
		assertLedger(t, "q", st.Queues["q"])
	})
}

// The window is bounded in memory, and an ID that the bound forgot is routed
// again, while a recent one is still a duplicate.
func TestDeduplicationBoundForgetsTheOldestFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 65,537 messages")
	}
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	const bound = 1 << 16
	for i := range bound + 1 {
		require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID(fmt.Sprint(i))))
	}
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID(fmt.Sprint(bound))))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the newest is remembered")
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("0")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the oldest was forgotten past the bound")
	_, err := m.PurgeQueue("q")
	require.NoError(t, err)
	m.Stop()
}
