package tinymq_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

type tpOrder struct{ ID int }

// A queue of a typed consumer refuses, at Publish, data that its consumer
// could never take, with ErrPayloadType, and accepts what it can: the same
// on an in-memory and on a durable queue (a durable queue's codec would
// have turned an int64 into an int).
func TestTypedPublishRefusesDataOfAnotherType(t *testing.T) {
	cases := []struct {
		name string
		data any
		ok   bool
	}{
		{"the type", tpOrder{ID: 1}, true},
		{"a pointer to it", &tpOrder{ID: 1}, false},
		{"a map", map[string]any{"ID": 1}, false},
		{"nil", nil, false},
		{"encoded", tinymq.Encoded{Body: []byte(`{"ID":1}`), Codec: tinymq.JSONCodec{}}, true},
	}
	for _, durable := range []bool{false, true} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("durable %v/%s", durable, c.name), func(t *testing.T) {
				m := tinymq.New(tinymq.WithDataDir(t.TempDir()), quiet())
				opts := []tinymq.QueueOption{tinymq.WithQueueName("q")}
				if durable {
					opts = append(opts, tinymq.WithDurable())
				}
				got := make(chan tpOrder, 1)
				require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, o tpOrder) error {
					got <- o
					return nil
				}, 1, opts...))
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				err := m.Publish("ev", c.data)
				if !c.ok {
					require.ErrorIs(t, err, tinymq.ErrPayloadType)
					assert.Zero(t, m.Stats().Queues["q"].Accepted)
					return
				}
				require.NoError(t, err)
				assert.Equal(t, tpOrder{ID: 1}, recv(t, got, 1)[0])
			})
		}
	}
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprintf("durable %v/int64 to int", durable), func(t *testing.T) {
			m := tinymq.New(tinymq.WithDataDir(t.TempDir()), quiet())
			opts := []tinymq.QueueOption{tinymq.WithQueueName("q")}
			if durable {
				opts = append(opts, tinymq.WithDurable())
			}
			require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, int) error { return nil }, 1, opts...))
			require.ErrorIs(t, m.Publish("ev", int64(5)), tinymq.ErrPayloadType)
			require.NoError(t, m.Publish("ev", 5))
			stopWithin(t, m)
		})
	}
}

// A publish to several queues is all or nothing: one typed queue that
// refuses the data means no queue gets it.
func TestTypedPublishIsAllOrNothing(t *testing.T) {
	m := tinymq.New()
	defer m.Stop()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("plain")))
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(context.Context, tinymq.Delivery[tpOrder]) error { return nil },
		1, tinymq.WithQueueName("typed")))
	require.ErrorIs(t, m.Publish("ev", "text"), tinymq.ErrPayloadType)
	require.ErrorIs(t, m.Publish("ev", "text", tinymq.WithRoutingKey("k")), tinymq.ErrPayloadType, "the slow path too")
	st := m.Stats()
	assert.Zero(t, st.Queues["plain"].Accepted)
	assert.Zero(t, st.Queues["typed"].Accepted)
	assert.Zero(t, st.Exchanges["ev"].Published)
	require.NoError(t, m.Publish("ev", tpOrder{}))
	assert.Equal(t, uint64(1), m.Stats().Queues["plain"].Accepted)

	// Unbound, the typed queue no longer decides for the exchange.
	require.NoError(t, m.Unbind("typed", "ev"))
	require.NoError(t, m.Publish("ev", "text"))
}

// A queue declared without a consumer gets its type from its first typed
// Consume, keeps it once that is cancelled, and refuses a typed consumer of
// another type; an untyped consumer (a ConsumerFunc, or a consumer of any)
// gives it none.
func TestTypedPublishTypeComesFromTypedConsumers(t *testing.T) {
	m := tinymq.New()
	defer m.Stop()
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	_, err := m.Consume("q", failing, 1)
	require.NoError(t, err)
	_, err = tinymq.ConsumeHandler(m, "q", func(context.Context, any) error { return nil }, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", "anything"))

	s, err := tinymq.ConsumeHandler(m, "q", func(context.Context, tpOrder) error { return nil }, 1)
	require.NoError(t, err)
	require.ErrorIs(t, m.Publish("ev", "text"), tinymq.ErrPayloadType)
	_, err = tinymq.ConsumeDeliveries(m, "q", func(context.Context, tinymq.Delivery[*tpOrder]) error { return nil }, 1)
	require.ErrorIs(t, err, tinymq.ErrPayloadType, "a consumer of another type")
	_, err = tinymq.ConsumeDeliveries(m, "q", func(context.Context, tinymq.Delivery[tpOrder]) error { return nil }, 1)
	require.NoError(t, err, "the same type")
	require.NoError(t, s.Cancel(context.Background()))
	require.ErrorIs(t, m.Publish("ev", "text"), tinymq.ErrPayloadType, "the queue keeps its type")
}

// An interface type takes every value that implements it, and nil.
func TestTypedPublishInterfaceTakesImplementations(t *testing.T) {
	m := tinymq.New()
	defer m.Stop()
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, fmt.Stringer) error { return nil }, 1))
	require.NoError(t, m.Publish("ev", tinymq.Fanout)) // an ExchangeType has String
	require.NoError(t, m.Publish("ev", nil))
	require.ErrorIs(t, m.Publish("ev", 5), tinymq.ErrPayloadType)
}

// BenchmarkPublishTypeCheck measures what the payload check costs Publish
// with no option to a fanout exchange of three queues (not started: publish
// only): "plain" queues take the fast path, which the check leaves alone (an
// exchange knows whether any bound queue is typed); "typed" has one queue of
// a RegisterHandler, so every publish checks its data; "dedup" publishes
// with a new WithDeduplicationID each time.
//
//	go test -run '^$' -bench PublishTypeCheck -benchtime 20000x -count 3 .
func BenchmarkPublishTypeCheck(b *testing.B) {
	for _, c := range []string{"plain", "typed", "dedup"} {
		b.Run(c, func(b *testing.B) {
			m := tinymq.New()
			defer m.Stop()
			if c == "dedup" {
				if err := m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 3 {
				var err error
				if c == "typed" && i == 0 {
					err = tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, []byte) error { return nil }, 1)
				} else {
					err = m.RegisterQueue("ev", tinymq.Fanout, failing, 1)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			ids := make([]tinymq.PublishOption, b.N)
			if c == "dedup" {
				for i := range ids {
					ids[i] = tinymq.WithDeduplicationID(strconv.Itoa(i))
				}
			}
			data := make([]byte, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				var err error
				if c == "dedup" {
					err = m.Publish("ev", data, ids[i])
				} else {
					err = m.Publish("ev", data)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
