package tinymq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
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

type typedEvent struct{ N int }

// In-memory and durable typed queues accept and refuse the same values.
func TestTypedPublishInMemoryAndDurableQueuesAgree(t *testing.T) {
	values := []struct {
		name string
		data any
	}{
		{"T", typedEvent{1}}, {"*T", &typedEvent{1}}, {"nil", nil}, {"int", 1}, {"int64", int64(1)},
		{"map", map[string]any{"N": 1}}, {"Encoded", tinymq.Encoded{Body: []byte(`{"N":1}`), Codec: tinymq.JSONCodec{}}},
		{"string", "x"}, {"[]byte", []byte(`{"N":1}`)}, {"json.RawMessage", json.RawMessage(`{"N":1}`)},
	}
	verdicts := func(durable bool, register func(m *tinymq.MQ, opts ...tinymq.QueueOption) error) map[string]bool {
		var opts []tinymq.Option
		var qopts []tinymq.QueueOption
		if durable {
			opts = append(opts, tinymq.WithDataDir(t.TempDir()))
			qopts = append(qopts, tinymq.WithDurable())
		}
		m := tinymq.New(append(opts, quiet())...)
		require.NoError(t, register(m, append(qopts, tinymq.WithQueueName("q"))...))
		out := map[string]bool{}
		for _, v := range values {
			err := m.Publish("ev", v.data)
			if err != nil {
				require.ErrorIs(t, err, tinymq.ErrPayloadType, "%s", v.name)
			}
			out[v.name] = err == nil
		}
		_, err := m.PurgeQueue("q")
		require.NoError(t, err)
		m.Stop()
		return out
	}
	for name, register := range map[string]func(m *tinymq.MQ, opts ...tinymq.QueueOption) error{
		"struct": func(m *tinymq.MQ, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, typedEvent) error { return nil }, 1, opts...)
		},
		"pointer": func(m *tinymq.MQ, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, *typedEvent) error { return nil }, 1, opts...)
		},
	} {
		mem := verdicts(false, register)
		dur := verdicts(true, register)
		assert.Equal(t, mem, dur, "%s: in-memory and durable queues disagree", name)
		assert.True(t, mem["Encoded"], "%s: an Encoded is always taken", name)
		assert.False(t, mem["int64"], "%s", name)
		// Raw JSON is bytes, not a T: it goes in as an Encoded.
		assert.False(t, mem["json.RawMessage"], "%s", name)
	}
}

// A filter that drops the typed queue lets data of another type reach the
// others; a filter that keeps it makes the publish fail for every queue.
func TestTypedPublishCheckRunsOnWhatTheFiltersKept(t *testing.T) {
	m := tinymq.New(quiet())
	var keepTyped atomic.Bool
	var filtered atomic.Int64
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, typedEvent) error { return nil }, 1,
		tinymq.WithQueueName("typed"), tinymq.WithFilter(func(*tinymq.Msg) bool { filtered.Add(1); return keepTyped.Load() })))
	var untyped atomic.Int64
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { untyped.Add(1); return nil }, 1,
		tinymq.WithQueueName("any")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "text"), "the typed queue's filter dropped it")
	keepTyped.Store(true)
	assert.ErrorIs(t, m.Publish("ev", "text"), tinymq.ErrPayloadType, "all or nothing")
	require.NoError(t, m.Publish("ev", typedEvent{2}))
	stopWithin(t, m)
	st := m.Stats().Queues
	assert.Equal(t, uint64(2), st["any"].Accepted)
	assert.Equal(t, uint64(1), st["typed"].Accepted)
	assert.Equal(t, int64(2), untyped.Load())
	assert.Equal(t, int64(3), filtered.Load())
	for _, q := range []string{"any", "typed"} {
		assertLedger(t, q, st[q])
	}
}

// A dead letter of another type routed into a typed queue is not a Publish:
// it is taken (dead-lettering never fails the source queue), fails at
// delivery with ErrPayloadType, and is dead-lettered on; nothing loops and
// every ledger holds.
func TestTypedQueueTakesDeadLettersOfAnotherTypeAndLetsThemDie(t *testing.T) {
	m := tinymq.New(quiet())
	final := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("final", tinymq.Fanout, sink(final), 1, tinymq.WithQueueName("graveyard")))
	var typedCalls atomic.Int64
	require.NoError(t, tinymq.RegisterHandler(m, "dlx", tinymq.Fanout, func(context.Context, typedEvent) error {
		typedCalls.Add(1)
		return nil
	}, 1, tinymq.WithQueueName("typed-dead"), tinymq.WithDeadLetter("final", "")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return tinymq.Permanent(errors.New("no"))
	}, 1, tinymq.WithQueueName("src"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "text"))       // of another type than typed-dead's
	require.NoError(t, m.Publish("ev", typedEvent{})) // of its type
	got := recv(t, final, 1)[0]
	assert.Equal(t, "text", got.Data)
	require.Len(t, got.Deaths, 2)
	assert.Contains(t, got.Deaths[0].LastError, tinymq.ErrPayloadType.Error())
	stopWithin(t, m)
	assert.Equal(t, int64(1), typedCalls.Load())
	st := m.Stats().Queues
	for _, q := range []string{"src", "typed-dead", "graveyard"} {
		assertLedger(t, q, st[q])
	}
	assert.Equal(t, uint64(2), st["typed-dead"].Accepted)
}

// A typed queue reached through an alternate exchange, or bound to a second
// exchange, refuses data of another type there too.
func TestTypedPublishHoldsThroughAlternateAndSecondExchanges(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("alt", tinymq.Fanout))
	require.NoError(t, m.DeclareExchange("main", tinymq.Direct, tinymq.WithAlternateExchange("alt")))
	require.NoError(t, tinymq.RegisterHandler(m, "alt", tinymq.Fanout, func(context.Context, typedEvent) error { return nil }, 1,
		tinymq.WithQueueName("q")))
	require.NoError(t, m.Bind("q", "other", tinymq.Topic, tinymq.WithBindingKey("a.*")))
	assert.ErrorIs(t, m.Publish("main", "x", tinymq.WithRoutingKey("nobody")), tinymq.ErrPayloadType, "via the alternate")
	assert.ErrorIs(t, m.Publish("other", "x", tinymq.WithRoutingKey("a.b")), tinymq.ErrPayloadType, "via the second binding")
	assert.ErrorIs(t, m.Publish("other", 1, tinymq.WithRoutingKey("z")), tinymq.ErrNoRoute, "not routed: no check")
	require.NoError(t, m.Publish("main", typedEvent{}, tinymq.WithRoutingKey("nobody")))
	require.NoError(t, m.Publish("other", typedEvent{}, tinymq.WithRoutingKey("a.b")))
	require.NoError(t, m.Unbind("q", "other", tinymq.WithBindingKey("a.*")))
	assert.ErrorIs(t, m.Publish("other", "x", tinymq.WithRoutingKey("a.b")), tinymq.ErrNoRoute, "unbound: no check")
	require.NoError(t, m.Start(context.Background()))
	stopWithin(t, m)
	assertLedger(t, "q", m.Stats().Queues["q"])
	assert.Equal(t, uint64(2), m.Stats().Queues["q"].Accepted)
}

// The type stays with the queue after its typed consumer is cancelled, goes
// with the queue when it is deleted, and a typed consumer of another type
// is refused.
func TestTypedQueueKeepsItsTypeUntilDeleted(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	require.NoError(t, m.Publish("ev", "before"), "untyped until a typed consumer comes")
	sub, err := tinymq.ConsumeHandler(m, "q", func(context.Context, typedEvent) error { return nil }, 1)
	require.NoError(t, err)
	assert.ErrorIs(t, m.Publish("ev", "x"), tinymq.ErrPayloadType)
	require.NoError(t, sub.Cancel(context.Background()))
	assert.ErrorIs(t, m.Publish("ev", "x"), tinymq.ErrPayloadType, "kept after Cancel")
	_, err = tinymq.ConsumeHandler(m, "q", func(context.Context, string) error { return nil }, 1)
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	_, err = m.DeleteQueue("q")
	require.NoError(t, err)
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	require.NoError(t, m.Publish("ev", "x"), "a new queue of the same name is untyped")
	_, err = tinymq.ConsumeHandler(m, "q", func(context.Context, string) error { return nil }, 1)
	require.NoError(t, err, "and may take another type")
	assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrPayloadType)
}

// Publishers racing the arrival of typed consumers on several queues: a
// publish is refused or accepted whole, and once a typed consumer is in
// place no data of another type reaches it.
func TestTypedPublishRacingTypedConsumersIsAllOrNothing(t *testing.T) {
	m := tinymq.New(quiet())
	const queues = 4
	for i := range queues {
		require.NoError(t, m.DeclareQueue(fmt.Sprint("q", i), "ev", tinymq.Fanout))
	}
	require.NoError(t, m.Start(context.Background()))
	var wg sync.WaitGroup
	var accepted, refused atomic.Int64
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var data any = typedEvent{i}
				if i%2 == 1 {
					data = fmt.Sprint(i)
				}
				switch err := m.Publish("ev", data); {
				case err == nil:
					accepted.Add(1)
				case errors.Is(err, tinymq.ErrPayloadType):
					refused.Add(1)
				default:
					t.Errorf("Publish: %v", err)
					return
				}
			}
		})
	}
	for i := range queues {
		_, err := tinymq.ConsumeDeliveries(m, fmt.Sprint("q", i), func(_ context.Context, d tinymq.Delivery[typedEvent]) error {
			return nil
		}, 1)
		require.NoError(t, err)
	}
	close(stop)
	wg.Wait()
	before := m.Stats()
	for range 100 {
		assert.ErrorIs(t, m.Publish("ev", "late"), tinymq.ErrPayloadType)
		require.NoError(t, m.Publish("ev", typedEvent{}))
	}
	stopWithin(t, m)
	st := m.Stats()
	var sum uint64
	for i := range queues {
		name := fmt.Sprint("q", i)
		qs := st.Queues[name]
		assertLedger(t, name, qs)
		assert.Equal(t, before.Queues[name].Accepted+100, qs.Accepted, "%s", name)
		sum += qs.Accepted
	}
	assert.Equal(t, uint64(accepted.Load()+100)*queues, sum, "each accepted publish reached every queue")
}

// JSON cannot decode into an interface with methods, so a durable queue (whose
// messages are all encoded) refuses a consumer of one at once, rather than
// accepting publishes that it could only drop; in memory, and with T any, the
// queue takes it.
func TestDurableTypedQueueRefusesAnInterfaceJSONCannotDecode(t *testing.T) {
	m := tinymq.New(quiet(), tinymq.WithDataDir(t.TempDir()))
	err := tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(context.Context, tinymq.Delivery[error]) error { return nil }, 1,
		tinymq.WithQueueName("errors"), tinymq.WithDurable())
	require.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.NotContains(t, m.Stats().Queues, "errors", "nothing was declared")
	require.NoError(t, m.DeclareQueue("stringers", "ev", tinymq.Fanout, tinymq.WithDurable()))
	_, err = tinymq.ConsumeHandler(m, "stringers", func(context.Context, fmt.Stringer) error { return nil }, 1)
	require.ErrorIs(t, err, tinymq.ErrPayloadType)
	_, err = tinymq.ConsumeHandler(m, "stringers", func(context.Context, any) error { return nil }, 1)
	require.NoError(t, err, "any decodes")
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(context.Context, tinymq.Delivery[error]) error { return nil }, 1,
		tinymq.WithQueueName("in-memory")), "an in-memory queue holds the value itself")
	m.Stop()
}
