package tinymq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// Payloads of the typed-publish tables below.
type (
	tpA struct{ A int }
	tpB struct{ A int }
	// valStringer implements fmt.Stringer, and so does *valStringer.
	valStringer struct{ S string }
	// ptrStringer does not; *ptrStringer does.
	ptrStringer struct{ S string }
)

func (v valStringer) String() string  { return v.S }
func (p *ptrStringer) String() string { return p.S }

// typedValue is a value published to a typed queue, and whether Publish
// takes it.
type typedValue struct {
	name string
	data any
	ok   bool
}

// typedVerdicts publishes each value to a fanout exchange with a typed
// queue of T (durable or not) and an untyped one. It checks that a refused
// publish fails with ErrPayloadType and reaches neither queue, and that the
// typed consumer got every accepted value, and returns which were accepted
// and what the typed consumer got, by name.
func typedVerdicts[T any](t *testing.T, values []typedValue, durable bool) (accepted map[string]bool, got map[string]any) {
	t.Helper()
	accepted, got = map[string]bool{}, map[string]any{}
	var mu sync.Mutex
	m := tinymq.New(quiet(), tinymq.WithDataDir(t.TempDir()))
	opts := []tinymq.QueueOption{tinymq.WithQueueName("typed")}
	if durable {
		opts = append(opts, tinymq.WithDurable())
	}
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[T]) error {
		mu.Lock()
		got[d.Headers["name"].(string)] = d.Data
		mu.Unlock()
		return nil
	}, 1, opts...))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("plain")))
	require.NoError(t, m.Start(context.Background()))
	for _, v := range values {
		before := m.Stats()
		err := m.Publish("ev", v.data, tinymq.WithHeaders(map[string]any{"name": v.name}))
		accepted[v.name] = err == nil
		if err != nil {
			assert.ErrorIs(t, err, tinymq.ErrPayloadType, "%s", v.name)
			after := m.Stats()
			assert.Equal(t, before.Queues["plain"].Accepted, after.Queues["plain"].Accepted, "%s: refused, but the untyped queue got it", v.name)
			assert.Equal(t, before.Exchanges["ev"].Published, after.Exchanges["ev"].Published, "%s", v.name)
		}
	}
	stopWithin(t, m)
	for _, v := range values {
		if _, ok := got[v.name]; accepted[v.name] && !ok {
			t.Errorf("durable %v: %s was accepted, and the typed consumer never got it", durable, v.name)
		}
	}
	return accepted, got
}

// checkTypedVerdicts checks that in-memory and durable queues of T accept
// what the table says, and deliver the same value.
func checkTypedVerdicts[T any](t *testing.T, values []typedValue) {
	t.Helper()
	memAccepted, memGot := typedVerdicts[T](t, values, false)
	durAccepted, durGot := typedVerdicts[T](t, values, true)
	for _, v := range values {
		assert.Equal(t, v.ok, memAccepted[v.name], "in memory: %s accepted", v.name)
		assert.Equal(t, memAccepted[v.name], durAccepted[v.name], "%s: in memory and durable disagree", v.name)
		if d, ok := durGot[v.name]; ok {
			assert.Equal(t, memGot[v.name], d, "%s: delivered in memory and from the log", v.name)
		}
	}
}

// A typed queue takes what its consumer's type can be, and nothing else,
// the same in memory and on a durable queue, and the consumer gets the same
// value from either.
func TestTypedPublishDeliversTheSameValueInMemoryAndDurable(t *testing.T) {
	t.Run("struct", func(t *testing.T) {
		checkTypedVerdicts[tpA](t, []typedValue{
			{"T", tpA{1}, true}, {"*T", &tpA{1}, false}, {"another struct", tpB{1}, false},
			{"map", map[string]any{"A": 1}, false}, {"nil", nil, false}, {"string", "x", false},
			{"Encoded", tinymq.Encoded{Body: []byte(`{"A":1}`)}, true}, {"json.RawMessage", json.RawMessage(`{"A":1}`), false},
		})
	})
	t.Run("pointer", func(t *testing.T) {
		checkTypedVerdicts[*tpA](t, []typedValue{
			{"*T", &tpA{1}, true}, {"typed nil", (*tpA)(nil), true}, {"T", tpA{1}, false}, {"nil", nil, false},
			{"*another", &tpB{1}, false}, {"Encoded", tinymq.Encoded{Body: []byte(`{"A":2}`)}, true},
		})
	})
	t.Run("int", func(t *testing.T) {
		checkTypedVerdicts[int](t, []typedValue{
			{"int", 1, true}, {"int64", int64(1), false}, {"float64", 1.0, false}, {"nil", nil, false},
			{"uint", uint(1), false}, {"MaxInt", math.MaxInt, true},
		})
	})
	t.Run("float64", func(t *testing.T) {
		checkTypedVerdicts[float64](t, []typedValue{{"float64", 1.5, true}, {"int", 1, false}})
	})
	t.Run("string", func(t *testing.T) {
		checkTypedVerdicts[string](t, []typedValue{{"string", "x", true}, {"[]byte", []byte("x"), false}})
	})
	t.Run("[]byte", func(t *testing.T) {
		checkTypedVerdicts[[]byte](t, []typedValue{
			{"[]byte", []byte("x"), true}, {"nil []byte", []byte(nil), true}, {"empty", []byte{}, true},
			{"string", "x", false}, {"json.RawMessage", json.RawMessage(`1`), false}, {"nil", nil, false},
		})
	})
	t.Run("json.RawMessage", func(t *testing.T) {
		checkTypedVerdicts[json.RawMessage](t, []typedValue{
			{"json.RawMessage", json.RawMessage(`{"a":1}`), true}, {"[]byte", []byte(`{"a":1}`), false}, {"nil", nil, false},
		})
	})
}

// An in-memory queue of an interface type takes what implements it, by the
// Go method sets (a value whose methods have pointer receivers does not),
// and nil. (A durable queue refuses such a consumer:
// TestDurableTypedQueueRefusesAnInterfaceJSONCannotDecode.)
func TestTypedPublishOfAnInterfaceFollowsItsMethodSet(t *testing.T) {
	check := func(t *testing.T, accepted map[string]bool, values []typedValue) {
		for _, v := range values {
			assert.Equal(t, v.ok, accepted[v.name], "%s accepted", v.name)
		}
	}
	t.Run("fmt.Stringer", func(t *testing.T) {
		values := []typedValue{
			{"value receiver", valStringer{"v"}, true}, {"pointer to a value receiver", &valStringer{"v"}, true},
			{"pointer receiver", ptrStringer{"p"}, false}, {"pointer to a pointer receiver", &ptrStringer{"p"}, true},
			{"nil", nil, true}, {"int", 1, false},
		}
		accepted, _ := typedVerdicts[fmt.Stringer](t, values, false)
		check(t, accepted, values)
	})
	t.Run("error", func(t *testing.T) {
		values := []typedValue{{"error", errors.New("e"), true}, {"nil", nil, true}, {"string", "e", false}}
		accepted, _ := typedVerdicts[error](t, values, false)
		check(t, accepted, values)
	})
}

// A typed consumer of any takes everything: in memory it gets the published
// value, and on a durable queue an Encoded of it, as a ConsumerFunc does
// (the codec's bytes do not say what type was published).
func TestTypedPublishOfAnyDeliversEncodedOnADurableQueue(t *testing.T) {
	values := []typedValue{{"int", 1, true}, {"nil", nil, true}, {"struct", tpA{1}, true}, {"[]byte", []byte("x"), true}}
	memAccepted, memGot := typedVerdicts[any](t, values, false)
	durAccepted, durGot := typedVerdicts[any](t, values, true)
	for _, v := range values {
		assert.True(t, memAccepted[v.name], "in memory: %s", v.name)
		assert.True(t, durAccepted[v.name], "durable: %s", v.name)
		assert.Equal(t, v.data, memGot[v.name], "in memory: %s is the published value", v.name)
		e, ok := durGot[v.name].(tinymq.Encoded)
		if !assert.True(t, ok, "durable: %s is a %T, not an Encoded", v.name, durGot[v.name]) {
			continue
		}
		want, err := json.Marshal(v.data)
		require.NoError(t, err)
		assert.JSONEq(t, string(want), string(e.Body), "durable: %s", v.name)
	}
}

// A durable typed queue's data goes through the codec, and what JSON changes
// changes there: an invalid UTF-8 string arrives with U+FFFD in place of its
// bad bytes, and a NaN or an infinity is refused at Publish (it has no JSON);
// in memory both arrive as published.
func TestTypedPublishOnADurableQueueChangesWhatJSONChanges(t *testing.T) {
	t.Run("invalid UTF-8", func(t *testing.T) {
		values := []typedValue{{"invalid UTF-8", "\xff\xfe", true}}
		_, memGot := typedVerdicts[string](t, values, false)
		_, durGot := typedVerdicts[string](t, values, true)
		assert.Equal(t, "\xff\xfe", memGot["invalid UTF-8"], "in memory")
		assert.Equal(t, "\ufffd\ufffd", durGot["invalid UTF-8"], "from the log")
	})
	t.Run("NaN and infinities", func(t *testing.T) {
		values := []typedValue{{"NaN", math.NaN(), true}, {"+Inf", math.Inf(1), true}, {"-Inf", math.Inf(-1), true}}
		memAccepted, memGot := typedVerdicts[float64](t, values, false)
		durAccepted, _ := typedVerdicts[float64](t, values, true)
		for _, v := range values {
			assert.True(t, memAccepted[v.name], "in memory: %s", v.name)
			assert.False(t, durAccepted[v.name], "durable: %s is refused at Publish", v.name)
		}
		assert.True(t, math.IsNaN(memGot["NaN"].(float64)))
		assert.Equal(t, math.Inf(1), memGot["+Inf"])
	})
}

// An exchange that routes to typed queues of two types takes only what both
// can take: an Encoded, which each decodes into its own type.
func TestTypedPublishToQueuesOfTwoTypesTakesOnlyEncoded(t *testing.T) {
	m := tinymq.New(quiet())
	gotA, gotB := make(chan tpA, 1), make(chan tpB, 1)
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v tpA) error { gotA <- v; return nil }, 1,
		tinymq.WithQueueName("a")))
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v tpB) error { gotB <- v; return nil }, 1,
		tinymq.WithQueueName("b")))
	for _, v := range []any{tpA{}, tpB{}, nil, 1} {
		assert.ErrorIs(t, m.Publish("ev", v), tinymq.ErrPayloadType, "%#v", v)
	}
	require.NoError(t, m.Publish("ev", tinymq.Encoded{Body: []byte(`{"A":1}`)}))
	require.NoError(t, m.Start(context.Background()))
	assert.Equal(t, tpA{1}, recv(t, gotA, 1)[0])
	assert.Equal(t, tpB{1}, recv(t, gotB, 1)[0])
	stopWithin(t, m)
	for _, q := range []string{"a", "b"} {
		st := m.Stats().Queues[q]
		assert.Equal(t, uint64(1), st.Accepted, q)
		assertLedger(t, q, st)
	}
}

// A durable queue restarted with a typed consumer of another type than the
// one its backlog was published for takes the backlog (a new MQ's queue has
// no type before it) and fails each of those messages permanently with
// ErrPayloadType, rather than decoding it into the wrong type.
func TestTypedDurableBacklogOfAnotherTypeFailsAfterARestart(t *testing.T) {
	dir := t.TempDir()
	declare := func(m *tinymq.MQ) {
		t.Helper()
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithDurable(), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
	}
	m := tinymq.New(quiet(), tinymq.WithDataDir(dir))
	declare(m)
	_, err := tinymq.ConsumeHandler(m, "q", func(context.Context, tpA) error { return nil }, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", tpA{1}))
	stopWithin(t, m) // never started: the message stays in the log

	m = tinymq.New(quiet(), tinymq.WithDataDir(dir))
	dead := deadLetters(t, m)
	declare(m)
	got := make(chan string, 1)
	_, err = tinymq.ConsumeHandler(m, "q", func(_ context.Context, s string) error { got <- s; return nil }, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	d := recv(t, dead, 1)[0]
	assert.Contains(t, d.Deaths[0].LastError, tinymq.ErrPayloadType.Error())
	assert.Equal(t, 1, d.Deaths[0].Attempts, "failed permanently, not retried")
	stopWithin(t, m)
	assert.Empty(t, got, "a tpA was decoded into a string")
	st := m.Stats().Queues["q"]
	assert.Zero(t, st.Succeeded)
	assert.Equal(t, uint64(1), st.DeadLettered)
	assertLedger(t, "q", st)
}

// In memory a typed consumer of a pointer type gets the pointer that was
// published, not a copy of what it points to.
func TestTypedConsumerGetsThePublishedPointerInMemory(t *testing.T) {
	p := &tpA{1}
	got := make(chan *tpA, 1)
	m := tinymq.New(quiet())
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *tpA) error {
		got <- v
		return nil
	}, 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", p))
	assert.Same(t, p, recv(t, got, 1)[0])
	stopWithin(t, m)
}
