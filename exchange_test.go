package tinymq_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// router collects which queues each publish reached, synchronously: Stop
// drains every queue before the test looks.
type router struct {
	t  *testing.T
	m  *tinymq.MQ
	mu sync.Mutex
	in map[uint64][]string // message ID -> queues, in arrival order
}

func newRouter(t *testing.T) *router {
	return &router{t: t, m: tinymq.New(), in: make(map[uint64][]string)}
}

func (r *router) consume(_ context.Context, msg *tinymq.Msg) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.in[msg.ID] = append(r.in[msg.ID], msg.Queue)
	return nil
}

func (r *router) queue(exchange string, kind tinymq.ExchangeType, name string, opts ...tinymq.QueueOption) {
	r.t.Helper()
	require.NoError(r.t, r.m.RegisterQueue(exchange, kind, r.consume, 1, append(opts, tinymq.WithQueueName(name))...))
}

// routingCase is one row of a routing table: the rule it checks, the message,
// and the queues (by name) that must receive it.
type routingCase struct {
	rule    string
	key     string
	headers map[string]any
	want    []string // nil: unroutable (ErrNoRoute)
}

// runRouting registers queues with setup and checks the cases with runRoutingOn.
func runRouting(t *testing.T, setup func(r *router), exchange string, cases []routingCase) {
	t.Helper()
	r := newRouter(t)
	setup(r)
	runRoutingOn(t, r, exchange, cases)
}

// runRoutingOn publishes every case before Start, then starts and stops the MQ
// and compares where each message went.
func runRoutingOn(t *testing.T, r *router, exchange string, cases []routingCase) {
	t.Helper()
	ids := make([]uint64, len(cases))
	var next uint64
	for i, c := range cases {
		var opts []tinymq.PublishOption
		if c.key != "" {
			opts = append(opts, tinymq.WithRoutingKey(c.key))
		}
		if c.headers != nil {
			opts = append(opts, tinymq.WithHeaders(c.headers))
		}
		err := r.m.Publish(exchange, nil, opts...)
		if c.want == nil {
			assert.ErrorIs(t, err, tinymq.ErrNoRoute, "%s: key %q headers %v", c.rule, c.key, c.headers)
			continue
		}
		if !assert.NoError(t, err, "%s: key %q headers %v", c.rule, c.key, c.headers) {
			continue
		}
		next++
		ids[i] = next
	}
	require.NoError(t, r.m.Start(context.Background()))
	r.m.Stop()
	for i, c := range cases {
		if c.want == nil {
			continue
		}
		got := slices.Clone(r.in[ids[i]])
		slices.Sort(got)
		assert.Equal(t, c.want, got, "%s: key %q headers %v", c.rule, c.key, c.headers)
	}
}

func TestTopicRouting(t *testing.T) {
	// Queue names say their binding key.
	keys := []string{
		"user.*.created", "audit.#", "#", "*", "", "a.b", "a.*", "a.#", "#.b",
		"a..b", "a.", ".a", "a*.b", "a.#b", "#.x.#", "*.*", "a.#.#.z", "#.*",
	}
	setup := func(r *router) {
		for _, k := range keys {
			r.queue("topic", tinymq.Topic, "q["+k+"]", tinymq.WithBindingKey(k))
		}
	}
	q := func(ks ...string) []string {
		out := make([]string, len(ks))
		for i, k := range ks {
			out[i] = "q[" + k + "]"
		}
		slices.Sort(out)
		return out
	}
	cases := []routingCase{
		{rule: "* is exactly one word", key: "user.42.created", want: q("user.*.created", "#", "#.*")},
		{rule: "* does not match zero words", key: "user.created", want: q("#", "*.*", "#.*")},
		{rule: "* does not match two words", key: "user.1.2.created", want: q("#", "#.*")},
		{rule: "# matches zero words after a prefix", key: "audit", want: q("audit.#", "#", "*", "#.*")},
		{rule: "# matches many words", key: "audit.a.b.c", want: q("audit.#", "#", "#.*")},
		{rule: "the empty key has no words: only # and the empty binding match", key: "", want: q("#", "")},
		{rule: "exact words", key: "a.b", want: q("a.b", "a.*", "a.#", "#.b", "#", "*.*", "#.*")},
		{rule: "a.# matches a alone", key: "a", want: q("a.#", "#", "*", "#.*")},
		{rule: "empty middle word", key: "a..b", want: q("a..b", "a.#", "#.b", "#", "#.*")},
		{rule: "a trailing dot makes an empty last word", key: "a.", want: q("a.", "a.*", "a.#", "#", "*.*", "#.*")},
		{rule: "a leading dot makes an empty first word", key: ".a", want: q(".a", "#", "*.*", "#.*")},
		{rule: "a lone dot is two empty words", key: ".", want: q("#", "*.*", "#.*")},
		{rule: "* inside a word is a plain character", key: "a*.b", want: q("a*.b", "#.b", "#", "*.*", "#.*")},
		{rule: "* inside a word does not wildcard", key: "ab.b", want: q("#.b", "#", "*.*", "#.*")},
		{rule: "# inside a word is a plain character", key: "a.#b", want: q("a.#b", "a.*", "a.#", "#", "*.*", "#.*")},
		{rule: "# inside a word does not wildcard", key: "a.cb", want: q("a.*", "a.#", "#", "*.*", "#.*")},
		{rule: "several # in one pattern", key: "y.x.z", want: q("#.x.#", "#", "#.*")},
		{rule: "several # in one pattern, zero words each", key: "x", want: q("#.x.#", "#", "*", "#.*")},
		{rule: "#.# matches what # matches", key: "a.z", want: q("a.#.#.z", "a.*", "a.#", "#", "*.*", "#.*")},
		{rule: "#.# between words, many words", key: "a.1.2.3.z", want: q("a.#.#.z", "a.#", "#", "#.*")},
		{rule: "matching is case-sensitive", key: "A.b", want: q("#.b", "#", "*.*", "#.*")},
	}
	runRouting(t, setup, "topic", cases)

	t.Run("no binding matches", func(t *testing.T) {
		r := newRouter(t)
		r.queue("t2", tinymq.Topic, "only", tinymq.WithBindingKey("x.*"))
		assert.ErrorIs(t, r.m.Publish("t2", 1, tinymq.WithRoutingKey("x")), tinymq.ErrNoRoute)
		assert.ErrorIs(t, r.m.Publish("t2", 1, tinymq.WithRoutingKey("x.y.z")), tinymq.ErrNoRoute)
		r.m.Stop()
	})
}

func TestTopicQueueWithSeveralMatchingBindingsGetsOneCopy(t *testing.T) {
	runRouting(t, func(r *router) {
		r.queue("topic", tinymq.Topic, "multi",
			tinymq.WithBindingKey("a.*"), tinymq.WithBindingKey("#"), tinymq.WithBindingKey("a.b"), tinymq.WithBindingKey("*.b"))
		r.queue("topic", tinymq.Topic, "other", tinymq.WithBindingKey("a.b"))
	}, "topic", []routingCase{
		{rule: "four bindings match, one delivery", key: "a.b", want: []string{"multi", "other"}},
		{rule: "one binding matches", key: "z", want: []string{"multi"}},
	})
}

func TestDirectRouting(t *testing.T) {
	runRouting(t, func(r *router) {
		r.queue("direct", tinymq.Direct, "info", tinymq.WithBindingKey("info"))
		r.queue("direct", tinymq.Direct, "errors", tinymq.WithBindingKey("error"), tinymq.WithBindingKey("fatal"))
		r.queue("direct", tinymq.Direct, "all", tinymq.WithBindingKey("info"), tinymq.WithBindingKey("error"), tinymq.WithBindingKey("info"))
		r.queue("direct", tinymq.Direct, "empty", tinymq.WithBindingKey(""))
		r.queue("direct", tinymq.Direct, "wild", tinymq.WithBindingKey("*"))
	}, "direct", []routingCase{
		{rule: "exact key", key: "info", want: []string{"all", "info"}},
		{rule: "a queue bound with several keys", key: "fatal", want: []string{"errors"}},
		{rule: "a queue bound twice with one key gets one copy", key: "error", want: []string{"all", "errors"}},
		{rule: "case-sensitive", key: "Info", want: nil},
		{rule: "no prefix match", key: "info.x", want: nil},
		{rule: "the empty key is a key", key: "", want: []string{"empty"}},
		{rule: "no wildcards on direct exchanges", key: "*", want: []string{"wild"}},
		{rule: "no wildcards on direct exchanges", key: "x", want: nil},
	})
}

func TestHeadersRouting(t *testing.T) {
	setup := func(r *router) {
		r.queue("h", tinymq.Headers, "all-pdf-a4", tinymq.WithBindingArgs(map[string]any{"x-match": "all", "format": "pdf", "size": "a4"}))
		r.queue("h", tinymq.Headers, "any-pdf-a4", tinymq.WithBindingArgs(map[string]any{"x-match": "any", "format": "pdf", "size": "a4"}))
		r.queue("h", tinymq.Headers, "default-all", tinymq.WithBindingArgs(map[string]any{"format": "pdf", "size": "a4"}))
		r.queue("h", tinymq.Headers, "int32-1", tinymq.WithBindingArgs(map[string]any{"n": int32(1)}))
		r.queue("h", tinymq.Headers, "float-1.5", tinymq.WithBindingArgs(map[string]any{"f": 1.5}))
		r.queue("h", tinymq.Headers, "bytes-abc", tinymq.WithBindingArgs(map[string]any{"s": []byte("abc")}))
		r.queue("h", tinymq.Headers, "void-present", tinymq.WithBindingArgs(map[string]any{"p": nil}))
		r.queue("h", tinymq.Headers, "x-ignored", tinymq.WithBindingArgs(map[string]any{"x-tenant": "t1", "k": "v"}))
		r.queue("h", tinymq.Headers, "all-with-x", tinymq.WithBindingArgs(map[string]any{"x-match": "all-with-x", "x-tenant": "t1", "k": "v"}))
		r.queue("h", tinymq.Headers, "any-with-x", tinymq.WithBindingArgs(map[string]any{"x-match": "any-with-x", "x-tenant": "t2"}))
		r.queue("h", tinymq.Headers, "array", tinymq.WithBindingArgs(map[string]any{"arr": []any{int32(1), "a"}}))
		r.queue("h", tinymq.Headers, "table", tinymq.WithBindingArgs(map[string]any{"tbl": map[string]any{"a": int64(1)}}))
		r.queue("h", tinymq.Headers, "bool", tinymq.WithBindingArgs(map[string]any{"b": true}))
		r.queue("h", tinymq.Headers, "two-bindings",
			tinymq.WithBindingArgs(map[string]any{"two": "x"}), tinymq.WithBindingArgs(map[string]any{"x-match": "any", "two": "x", "three": "y"}))
	}
	cases := []routingCase{
		{rule: "all: every argument matches", headers: map[string]any{"format": "pdf", "size": "a4", "extra": 1}, want: []string{"all-pdf-a4", "any-pdf-a4", "default-all"}},
		{rule: "all: one argument missing fails, any: one is enough", headers: map[string]any{"format": "pdf"}, want: []string{"any-pdf-a4"}},
		{rule: "any: a different value does not count", headers: map[string]any{"format": "doc", "size": "a4"}, want: []string{"any-pdf-a4"}},
		{rule: "integer widths are compared by value", headers: map[string]any{"n": int64(1)}, want: []string{"int32-1"}},
		{rule: "an integer equals an equal float (Erlang ==)", headers: map[string]any{"n": 1.0}, want: []string{"int32-1"}},
		{rule: "unsigned and signed integers by value", headers: map[string]any{"n": uint8(1)}, want: []string{"int32-1"}},
		{rule: "different integer value", headers: map[string]any{"n": int32(2)}, want: nil},
		{rule: "float equal", headers: map[string]any{"f": 1.5}, want: []string{"float-1.5"}},
		{rule: "float32 1.5 is exactly 1.5", headers: map[string]any{"f": float32(1.5)}, want: []string{"float-1.5"}},
		{rule: "a string equals the same bytes", headers: map[string]any{"s": "abc"}, want: []string{"bytes-abc"}},
		{rule: "bytes compare case-sensitively", headers: map[string]any{"s": "ABC"}, want: nil},
		{rule: "a string is not a number", headers: map[string]any{"n": "1"}, want: nil},
		{rule: "a void argument matches any value", headers: map[string]any{"p": 42}, want: []string{"void-present"}},
		{rule: "a void argument matches a void header", headers: map[string]any{"p": nil}, want: []string{"void-present"}},
		{rule: "x- arguments are ignored by all", headers: map[string]any{"k": "v"}, want: []string{"x-ignored"}},
		{rule: "all-with-x compares x- arguments", headers: map[string]any{"k": "v", "x-tenant": "t1"}, want: []string{"all-with-x", "x-ignored"}},
		{rule: "any-with-x compares x- arguments", headers: map[string]any{"x-tenant": "t2"}, want: []string{"any-with-x"}},
		{rule: "arrays compare element types: int32 1 is not int64 1", headers: map[string]any{"arr": []any{int64(1), "a"}}, want: nil},
		{rule: "arrays with the same element types", headers: map[string]any{"arr": []any{int32(1), "a"}}, want: []string{"array"}},
		{rule: "arrays: a string element is not a byte array", headers: map[string]any{"arr": []any{int32(1), []byte("a")}}, want: nil},
		{rule: "tables compare by key with types", headers: map[string]any{"tbl": map[string]any{"a": int64(1)}}, want: []string{"table"}},
		{rule: "tables: int (long) equals int64 (long)", headers: map[string]any{"tbl": map[string]any{"a": 1}}, want: []string{"table"}},
		{rule: "tables: different key set", headers: map[string]any{"tbl": map[string]any{"a": int64(1), "b": 2}}, want: nil},
		{rule: "booleans", headers: map[string]any{"b": true}, want: []string{"bool"}},
		{rule: "a boolean is not the integer 1", headers: map[string]any{"b": 1}, want: nil},
		{rule: "a queue with several matching bindings gets one copy", headers: map[string]any{"two": "x"}, want: []string{"two-bindings"}},
		{rule: "no headers: only all-bindings without arguments match", headers: nil, want: nil},
	}
	runRouting(t, setup, "h", cases)

	t.Run("all with no arguments matches everything, any with none matches nothing", func(t *testing.T) {
		runRouting(t, func(r *router) {
			r.queue("h", tinymq.Headers, "no-args")
			r.queue("h", tinymq.Headers, "all-empty", tinymq.WithBindingArgs(map[string]any{"x-match": "all"}))
			r.queue("h", tinymq.Headers, "any-empty", tinymq.WithBindingArgs(map[string]any{"x-match": "any"}))
		}, "h", []routingCase{
			{rule: "no headers", want: []string{"all-empty", "no-args"}},
			{rule: "some headers", headers: map[string]any{"a": 1}, want: []string{"all-empty", "no-args"}},
		})
	})

	t.Run("timestamps equal their Unix seconds", func(t *testing.T) {
		ts := time.Unix(1700000000, 0)
		runRouting(t, func(r *router) {
			r.queue("h", tinymq.Headers, "ts", tinymq.WithBindingArgs(map[string]any{"at": ts}))
		}, "h", []routingCase{
			{rule: "same instant", headers: map[string]any{"at": ts.Add(300 * time.Millisecond)}, want: []string{"ts"}},
			{rule: "the integer of its seconds", headers: map[string]any{"at": int64(1700000000)}, want: []string{"ts"}},
			{rule: "another second", headers: map[string]any{"at": ts.Add(time.Second)}, want: nil},
		})
	})
}

func TestFanoutIgnoresKeysAndHeaders(t *testing.T) {
	runRouting(t, func(r *router) {
		r.queue("f", tinymq.Fanout, "a")
		r.queue("f", tinymq.Fanout, "b")
	}, "f", []routingCase{
		{rule: "routing key ignored", key: "anything", want: []string{"a", "b"}},
		{rule: "headers ignored", headers: map[string]any{"x": 1}, want: []string{"a", "b"}},
	})
}

func TestMsgCarriesRoutingKeyAndHeaders(t *testing.T) {
	got := make(chan *tinymq.Msg, 1)
	m := started(t)
	require.NoError(t, m.RegisterQueue("t", tinymq.Topic, sink(got), 1, tinymq.WithBindingKey("a.*")))
	h := map[string]any{"k": "v"}
	require.NoError(t, m.Publish("t", "data", tinymq.WithRoutingKey("a.b"), tinymq.WithHeaders(h)))
	msg := recv(t, got, 1)[0]
	assert.Equal(t, "a.b", msg.RoutingKey)
	assert.Equal(t, h, msg.Headers)
	assert.Equal(t, "t", msg.Exchange)
}

func TestFilterAppliesAfterBinding(t *testing.T) {
	runRouting(t, func(r *router) {
		even := func(msg *tinymq.Msg) bool { return strings.HasSuffix(msg.RoutingKey, "even") }
		r.queue("t", tinymq.Topic, "filtered", tinymq.WithBindingKey("n.*"), tinymq.WithFilter(even))
		r.queue("t", tinymq.Topic, "plain", tinymq.WithBindingKey("n.odd"))
	}, "t", []routingCase{
		{rule: "binding and filter match", key: "n.even", want: []string{"filtered"}},
		{rule: "binding matches, filter drops", key: "n.odd", want: []string{"plain"}},
		{rule: "filter would keep, binding does not match", key: "m.even", want: nil},
	})
	t.Run("a message every queue filters out is unroutable", func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("f", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithFilter(func(*tinymq.Msg) bool { return false })))
		assert.ErrorIs(t, m.Publish("f", 1), tinymq.ErrNoRoute)
		m.Stop()
	})
	t.Run("a panicking filter is an error, and nothing is accepted", func(t *testing.T) {
		got := make(chan *tinymq.Msg, 2)
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("f", tinymq.Fanout, sink(got), 1))
		require.NoError(t, m.RegisterQueue("f", tinymq.Fanout, sink(got), 1,
			tinymq.WithFilter(func(*tinymq.Msg) bool { panic("bad filter") })))
		err := m.Publish("f", 1)
		var pe *tinymq.PanicError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "bad filter", pe.Value)
		require.NoError(t, m.Start(context.Background()))
		m.Stop()
		assert.Empty(t, got, "a failed publish reaches no queue")
	})
}

func TestAlternateExchange(t *testing.T) {
	r := newRouter(t)
	require.NoError(t, r.m.DeclareExchange("main", tinymq.Direct, tinymq.WithAlternateExchange("unrouted")))
	r.queue("main", tinymq.Direct, "orders", tinymq.WithBindingKey("order"))
	r.queue("unrouted", tinymq.Fanout, "catch-all")
	runRoutingOn(t, r, "main", []routingCase{
		{rule: "routable: the alternate exchange is not used", key: "order", want: []string{"orders"}},
		{rule: "unroutable: the alternate exchange takes it", key: "refund", want: []string{"catch-all"}},
	})

	t.Run("a message keeps its exchange and ID when it goes to the alternate", func(t *testing.T) {
		got := make(chan *tinymq.Msg, 1)
		m := started(t)
		require.NoError(t, m.DeclareExchange("main", tinymq.Direct, tinymq.WithAlternateExchange("ae")))
		require.NoError(t, m.RegisterQueue("ae", tinymq.Fanout, sink(got), 1))
		require.NoError(t, m.Publish("main", "x", tinymq.WithRoutingKey("k")))
		msg := recv(t, got, 1)[0]
		assert.Equal(t, "main", msg.Exchange)
		assert.Equal(t, uint64(1), msg.ID)
	})
	t.Run("an alternate that cannot route either gives ErrNoRoute", func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareExchange("a", tinymq.Direct, tinymq.WithAlternateExchange("b")))
		require.NoError(t, m.DeclareExchange("b", tinymq.Direct, tinymq.WithAlternateExchange("a"))) // a cycle
		assert.ErrorIs(t, m.Publish("a", 1, tinymq.WithRoutingKey("k")), tinymq.ErrNoRoute)
		require.NoError(t, m.DeclareExchange("c", tinymq.Direct, tinymq.WithAlternateExchange("missing")))
		assert.ErrorIs(t, m.Publish("c", 1), tinymq.ErrNoRoute)
		m.Stop()
	})
	t.Run("redeclaring with other options is a mismatch", func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareExchange("a", tinymq.Direct, tinymq.WithAlternateExchange("b")))
		require.NoError(t, m.DeclareExchange("a", tinymq.Direct, tinymq.WithAlternateExchange("b")))
		assert.ErrorIs(t, m.DeclareExchange("a", tinymq.Direct), tinymq.ErrExchangeMismatch)
		assert.ErrorIs(t, m.DeclareExchange("a", tinymq.Topic, tinymq.WithAlternateExchange("b")), tinymq.ErrExchangeMismatch)
		assert.ErrorIs(t, m.DeclareExchange("z", tinymq.Direct, nil), tinymq.ErrInvalidOption)
		m.Stop()
	})
}

func TestBindOneQueueToSeveralExchanges(t *testing.T) {
	got := make(chan *tinymq.Msg, 10)
	m := started(t)
	require.NoError(t, m.RegisterQueue("broadcast", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("dev-1")))
	require.NoError(t, m.Bind("dev-1", "devices", tinymq.Topic, tinymq.WithBindingKey("dev.1"), tinymq.WithBindingKey("dev.*.all")))
	require.NoError(t, m.Publish("broadcast", "to all"))
	require.NoError(t, m.Publish("devices", "to me", tinymq.WithRoutingKey("dev.1")))
	require.ErrorIs(t, m.Publish("devices", "to 2", tinymq.WithRoutingKey("dev.2")), tinymq.ErrNoRoute)
	msgs := recv(t, got, 2)
	assert.Equal(t, "broadcast", msgs[0].Exchange)
	assert.Equal(t, "devices", msgs[1].Exchange)
	assert.Equal(t, "to me", msgs[1].Data)

	assert.ErrorIs(t, m.Bind("nope", "devices", tinymq.Topic, tinymq.WithBindingKey("x")), tinymq.ErrUnknownQueue)
	assert.ErrorIs(t, m.Bind("dev-1", "devices", tinymq.Topic, nil), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, m.Bind("dev-1", "devices", tinymq.Topic), tinymq.ErrInvalidBinding)
	assert.ErrorIs(t, m.Bind("dev-1", "devices", tinymq.Direct, tinymq.WithBindingKey("x")), tinymq.ErrExchangeMismatch)
	assert.ErrorIs(t, m.Bind("dev-1", "devices", 0, tinymq.WithBindingKey("x")), tinymq.ErrInvalidKind)
}

func TestRoutingValidation(t *testing.T) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	long := strings.Repeat("k", 256)
	max := strings.Repeat("k", 255)
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("d", tinymq.Direct, nop, 1, tinymq.WithBindingKey(max)), "255 bytes is allowed")
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"binding key on fanout", func() error { return m.RegisterQueue("f", tinymq.Fanout, nop, 1, tinymq.WithBindingKey("k")) }, tinymq.ErrInvalidBinding},
		{"binding args on fanout", func() error { return m.RegisterQueue("f", tinymq.Fanout, nop, 1, tinymq.WithBindingArgs(nil)) }, tinymq.ErrInvalidBinding},
		{"binding args on topic", func() error {
			return m.RegisterQueue("t", tinymq.Topic, nop, 1, tinymq.WithBindingKey("a"), tinymq.WithBindingArgs(map[string]any{"a": 1}))
		}, tinymq.ErrInvalidBinding},
		{"direct without binding key", func() error { return m.RegisterQueue("d", tinymq.Direct, nop, 1) }, tinymq.ErrInvalidBinding},
		{"topic without binding key", func() error { return m.RegisterQueue("t", tinymq.Topic, nop, 1) }, tinymq.ErrInvalidBinding},
		{"binding key on headers", func() error { return m.RegisterQueue("h", tinymq.Headers, nop, 1, tinymq.WithBindingKey("k")) }, tinymq.ErrInvalidBinding},
		{"binding key over 255 bytes", func() error { return m.RegisterQueue("d", tinymq.Direct, nop, 1, tinymq.WithBindingKey(long)) }, tinymq.ErrKeyTooLong},
		{"unknown x-match", func() error {
			return m.RegisterQueue("h", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"x-match": "some"}))
		}, tinymq.ErrInvalidBinding},
		{"x-match not a string", func() error {
			return m.RegisterQueue("h", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"x-match": 1}))
		}, tinymq.ErrInvalidBinding},
		{"arg of a type that cannot match", func() error {
			return m.RegisterQueue("h", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": struct{}{}}))
		}, tinymq.ErrInvalidBinding},
		{"nested arg of a type that cannot match", func() error {
			return m.RegisterQueue("h", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": []any{1, make(chan int)}}))
		}, tinymq.ErrInvalidBinding},
		{"uint64 beyond AMQP's long", func() error {
			return m.RegisterQueue("h", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": uint64(1 << 63)}))
		}, tinymq.ErrInvalidBinding},
		{"routing key over 255 bytes", func() error { return m.Publish("d", 1, tinymq.WithRoutingKey(long)) }, tinymq.ErrKeyTooLong},
		{"header of a type with no AMQP equivalent", func() error {
			return m.Publish("d", 1, tinymq.WithRoutingKey(max), tinymq.WithHeaders(map[string]any{"a": 1i}))
		}, tinymq.ErrInvalidHeaders},
		{"nested header of a bad type", func() error {
			return m.Publish("d", 1, tinymq.WithHeaders(map[string]any{"a": map[string]any{"b": []int{1}}}))
		}, tinymq.ErrInvalidHeaders},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { require.ErrorIs(t, tt.call(), tt.want) })
	}
	require.NoError(t, m.Publish("d", 1, tinymq.WithRoutingKey(max)), "a 255-byte routing key is allowed")
	require.NoError(t, m.Start(context.Background()))
	m.Stop()
}

func TestExchangeTypeString(t *testing.T) {
	for kind, want := range map[tinymq.ExchangeType]string{
		tinymq.Fanout: "fanout", tinymq.Direct: "direct", tinymq.Topic: "topic", tinymq.Headers: "headers", 9: "ExchangeType(9)",
	} {
		assert.Equal(t, want, kind.String())
	}
}

// referenceTopicMatch is a reference topic matcher with memoisation (the plain
// recursion is exponential on the adversarial patterns).
func referenceTopicMatch(pattern, key string) bool {
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ".")
	}
	p, k := split(pattern), split(key)
	memo := map[[2]int]bool{}
	var match func(i, j int) bool
	match = func(i, j int) bool {
		if v, ok := memo[[2]int{i, j}]; ok {
			return v
		}
		var r bool
		switch {
		case i == len(p):
			r = j == len(k)
		case p[i] == "#":
			r = match(i+1, j) || (j < len(k) && match(i, j+1))
		case j == len(k):
			r = false
		case p[i] == "*" || p[i] == k[j]:
			r = match(i+1, j+1)
		}
		memo[[2]int{i, j}] = r
		return r
	}
	return match(0, 0)
}

// Topic routing through the public API against the reference, on random
// bindings (several per queue) and keys, and on adversarial ones that make
// the trie's plain walk run out of budget and switch to the remembering one.
func TestTopicRoutingMatchesAReferenceMatcher(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	randKey := func(alphabet []string, maxWords int) string {
		n := rng.IntN(maxWords + 1)
		ws := make([]string, n)
		for i := range ws {
			ws[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return strings.Join(ws, ".")
	}
	type round struct {
		patterns [][]string // per queue
		keys     []string
	}
	var rounds []round
	for range 10 {
		var r round
		for range 8 {
			var ps []string
			for range 1 + rng.IntN(3) {
				ps = append(ps, randKey([]string{"a", "b", "", "*", "#", "#", "*"}, 6))
			}
			r.patterns = append(r.patterns, ps)
		}
		for range 80 {
			r.keys = append(r.keys, randKey([]string{"a", "b", ""}, 9))
		}
		rounds = append(rounds, r)
	}
	// Adversarial: many "#" between repeated words, long keys of that word.
	adv := round{patterns: [][]string{
		{strings.Repeat("#.a.", 9) + "#.b"},
		{strings.Repeat("#.a.", 9) + "#"},
		{"*.#.*.#.*.#.*.#.*.#.*.#.*.#"},
		{strings.Repeat("#.a.", 6) + "#.b", strings.Repeat("#.*.", 5) + "b"},
		{"#.#.#.#.#.#.a.#.#.#.#", "a.#.a.#.a"},
		{strings.Repeat("#.", 20) + "b.#"},
	}}
	for n := 1; n <= 100; n += 9 {
		adv.keys = append(adv.keys, strings.Repeat("a.", n)+"a", strings.Repeat("a.", n)+"b", strings.Repeat("a.", n/2)+"b."+strings.Repeat("a.", n/2)+"a")
	}
	rounds = append(rounds, adv)

	for ri, r := range rounds {
		m := tinymq.New(quiet())
		type hit struct{ queue, key int }
		var mu sync.Mutex
		got := map[hit]int{}
		total := 0
		for qi, ps := range r.patterns {
			err := m.RegisterQueue("t", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
				mu.Lock()
				defer mu.Unlock()
				got[hit{qi, msg.Data.(int)}]++
				total++
				return nil
			}, 1, tinymq.WithQueueName(fmt.Sprint("q", qi)), tinymq.WithBindingKey(ps[0]))
			require.NoError(t, err, "round %d, pattern %q", ri, ps[0])
			for _, p := range ps[1:] {
				require.NoError(t, m.Bind(fmt.Sprint("q", qi), "t", tinymq.Topic, tinymq.WithBindingKey(p)), "pattern %q", p)
			}
		}
		require.NoError(t, m.Start(context.Background()))
		want := map[hit]int{}
		for ki, k := range r.keys {
			n := 0
			for qi, ps := range r.patterns {
				if slices.ContainsFunc(ps, func(p string) bool { return referenceTopicMatch(p, k) }) {
					want[hit{qi, ki}] = 1
					n++
				}
			}
			err := m.Publish("t", ki, tinymq.WithRoutingKey(k))
			if n == 0 {
				require.ErrorIs(t, err, tinymq.ErrNoRoute, "round %d, key %q", ri, k)
			} else {
				require.NoError(t, err, "round %d, key %q", ri, k)
			}
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return total >= len(want)
		}, wait, time.Millisecond)
		stopWithin(t, m)
		mu.Lock()
		for h, c := range want {
			if got[h] != c {
				t.Errorf("round %d: queue %d (patterns %q), key %q: delivered %d times, want %d", ri, h.queue, r.patterns[h.queue], r.keys[h.key], got[h], c)
			}
		}
		for h, c := range got {
			if want[h] == 0 {
				t.Errorf("round %d: queue %d (patterns %q), key %q: delivered %d times, want none", ri, h.queue, r.patterns[h.queue], r.keys[h.key], c)
			}
		}
		mu.Unlock()
	}
}
