// Package mqtest is a conformance suite for TinyMQ engines: the behaviours
// that the core's own tests prove for the in-memory MQ and that a broker
// engine (github.com/tinymq/tinymq/amqp) can provide too, run through the
// public API only, so that the same application code can be trusted on
// either engine.
//
//	func TestConformance(t *testing.T) {
//		mqtest.Run(t, func(t *testing.T) *tinymq.MQ { return tinymq.New() }, mqtest.Memory)
//	}
//
// Where engines differ on purpose, [Capabilities] says which way an engine
// goes, and the suite checks that way: an unsupported option must fail with
// [tinymq.ErrUnsupported] rather than be ignored.
//
// Every test names its exchanges and queues with a random prefix
// ("mqtest.<hex>."), so runs against a shared broker do not see each other.
// Tests that need time to pass (TTLs, delays, backoffs) use short real
// durations: the suite runs against engines whose clocks it cannot fake.
package mqtest

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinymq/tinymq"
)

// Capabilities says how an engine differs from the in-memory one where the
// difference is documented. The zero value describes a broker engine that
// keeps its queues outside the process.
type Capabilities struct {
	// StopDrains: Stop delivers every accepted message, those published
	// before Start included, before it returns. Without it, accepted messages
	// outlive the MQ, and a later MQ consuming the same queue gets them.
	StopDrains bool
	// Filter: RegisterQueue takes [tinymq.WithFilter].
	Filter bool
	// Block: RegisterQueue takes [tinymq.WithMaxLen] with [tinymq.Block].
	Block bool
	// UnnamedQueues: RegisterQueue takes a queue without
	// [tinymq.WithQueueName].
	UnnamedQueues bool
	// SequentialIDs: Msg.ID counts 1, 2, 3 per exchange. Without it IDs are
	// only unique.
	SequentialIDs bool
	// DelayedNoRoute: a Publish with [tinymq.WithDelay] that no queue would
	// take fails with [tinymq.ErrNoRoute] at once. Without it, routing happens
	// when the delay ends.
	DelayedNoRoute bool
	// JobFeatures: RegisterQueue (and DeclareQueue) take
	// [tinymq.WithDeliveryTimeout], [tinymq.WithRateLimit] and
	// [tinymq.WithGroupOrdering], DeclareExchange takes
	// [tinymq.WithDeduplication], and Publish takes [tinymq.WithMessageGroup]
	// and [tinymq.WithDeduplicationID]. Without it each of them is refused
	// with [tinymq.ErrUnsupported] and changes nothing. Typed publish (a
	// typed consumer's queue refusing other data with
	// [tinymq.ErrPayloadType]) is not among them: every engine promises it.
	JobFeatures bool
	// ApproximateMaxLen: a queue at its [tinymq.WithMaxLen] with
	// [tinymq.RejectPublish] may still take a few more publishes before it
	// refuses one (RabbitMQ's quorum queues apply the limit once the
	// replicas agree on the length). Without it the limit is exact. Either
	// way a refused publish's message never arrives, and every accepted
	// one does.
	ApproximateMaxLen bool
}

// Memory describes the in-memory engine, [tinymq.New] without an engine.
var Memory = Capabilities{
	StopDrains:     true,
	Filter:         true,
	Block:          true,
	UnnamedQueues:  true,
	SequentialIDs:  true,
	DelayedNoRoute: true,
	JobFeatures:    true,
}

// timeout bounds every wait of the suite; nothing here takes longer than a
// second when it works.
const timeout = 15 * time.Second

// Run runs the suite as subtests of t. newMQ returns a new MQ on the engine
// under test, not yet started; Run registers, starts and stops it (and stops
// it again at the end of the subtest, which must be harmless). Run blocks
// until every subtest has finished.
func Run(t *testing.T, newMQ func(t *testing.T) *tinymq.MQ, caps Capabilities) {
	s := &suite{newMQ: newMQ, caps: caps}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"FanoutDeliversToEveryQueue", s.fanout},
		{"DirectRoutesByKey", s.direct},
		{"TopicRoutesByPattern", s.topic},
		{"HeadersRouteByArguments", s.headers},
		{"UnroutableIsRefused", s.unroutable},
		{"AlternateExchangeTakesUnroutable", s.alternate},
		{"BindAddsAnotherExchange", s.bind},
		{"HandlerDecodesTypedPayloads", s.handler},
		{"RegisterHandlerForms", s.handlerForms},
		{"IDsAreStamped", s.ids},
		{"ConcurrencyRunsWorkersSideBySide", s.concurrency},
		{"RetriesThenDeadLetters", s.retries},
		{"PermanentAndPanics", s.permanent},
		{"QueueTTLExpiresIntoDeadLetter", s.queueTTL},
		{"MessageExpirationExpiresIntoDeadLetter", s.messageTTL},
		{"MaxLenRejectPublish", s.rejectPublish},
		{"MaxLenDropHead", s.dropHead},
		{"DelayedDelivery", s.delay},
		{"StatsCount", s.stats},
		{"StopWaitsForConsumers", s.stopWaits},
		{"AcceptedMessagesAreDelivered", s.drains},
		{"ShutdownDeadlineCancelsConsumers", s.shutdownDeadline},
		{"ConsumerMayCallStop", s.stopFromConsumer},
		{"TypedNilAndGoexitFailOneDelivery", s.hostile},
		{"DocumentedDifferences", s.differences},
		{"DeclareQueueKeepsMessagesForConsume", s.declareThenConsume},
		{"DeclareQueueAgainAddsOnlyTheBinding", s.redeclare},
		{"SubscriptionsCompete", s.compete},
		{"CancelEndsASubscription", s.cancel},
		{"CancelFromItsOwnConsumerDoesNotWait", s.cancelFromConsumer},
		{"DeleteQueueRemovesItsMessages", s.deleteQueue},
		{"PurgeQueueRemovesWaitingMessages", s.purge},
		{"UnbindStopsRouting", s.unbind},
		{"DeleteExchangeRemovesItsBindings", s.deleteExchange},
		{"QueueExpiryDeletesAnUnusedQueue", s.queueExpiry},
		{"PauseQueueHoldsDeliveries", s.pause},
		{"UnknownNamesAreRefused", s.unknownNames},
		{"TopologyCallsAfterStopAreRefused", s.topologyAfterStop},
		{"DeliveryTimeoutFailsAStuckConsumer", s.deliveryTimeout},
		{"RateLimitSpacesDeliveries", s.rateLimit},
		{"GroupOrderingKeepsEachGroupInOrder", s.groups},
		{"DeduplicationRoutesAnIDOnce", s.dedup},
		{"TypedPublishRefusesOtherData", s.typedPublish},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	newMQ func(t *testing.T) *tinymq.MQ
	caps  Capabilities
}

// mq returns a new MQ that is stopped when the test ends.
func (s *suite) mq(t *testing.T) *tinymq.MQ {
	t.Helper()
	m := s.newMQ(t)
	if m == nil {
		t.Fatal("newMQ returned nil")
	}
	t.Cleanup(m.Stop)
	return m
}

// names returns a function that prefixes names with a prefix of this test.
func names(t *testing.T) func(string) string {
	var b [4]byte
	if _, err := crand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := "mqtest." + hex.EncodeToString(b[:]) + "."
	return func(s string) string { return prefix + s }
}

// event is the suite's payload type.
type event struct {
	Kind string `json:"kind"`
	N    int    `json:"n"`
}

// payload returns the event in m: the published value in memory, decoded on
// an engine that hands consumers a tinymq.Encoded.
func payload(t *testing.T, m *tinymq.Msg) event {
	t.Helper()
	switch d := m.Data.(type) {
	case event:
		return d
	case tinymq.Encoded:
		var ev event
		if err := d.Decode(&ev); err != nil {
			t.Fatalf("decoding the payload of message %d: %v", m.ID, err)
		}
		return ev
	}
	t.Fatalf("payload of message %d: got %T, want event or tinymq.Encoded", m.ID, m.Data)
	return event{}
}

// sink collects what a consumer receives.
type sink struct{ ch chan *tinymq.Msg }

func newSink() *sink { return &sink{ch: make(chan *tinymq.Msg, 1024)} }

func (k *sink) consume(_ context.Context, m *tinymq.Msg) error {
	k.ch <- m
	return nil
}

// take waits for n messages.
func (k *sink) take(t *testing.T, n int, what string) []*tinymq.Msg {
	t.Helper()
	out := make([]*tinymq.Msg, 0, n)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(out) < n {
		select {
		case m := <-k.ch:
			out = append(out, m)
		case <-deadline.C:
			t.Fatalf("%s: got %d messages within %v, want %d", what, len(out), timeout, n)
		}
	}
	return out
}

// kinds returns the Kind of each message's event.
func kinds(t *testing.T, ms []*tinymq.Msg) []string {
	t.Helper()
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = payload(t, m).Kind
	}
	return out
}

// takeUntilFence waits for the message of kind "fence" and returns the kinds
// of the messages before it. With concurrency 1 a queue delivers in order, so
// the fence proves that nothing else is on its way.
func (k *sink) takeUntilFence(t *testing.T, what string) []string {
	t.Helper()
	var out []string
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case m := <-k.ch:
			kind := payload(t, m).Kind
			if kind == "fence" {
				return out
			}
			out = append(out, kind)
		case <-deadline.C:
			t.Fatalf("%s: no fence within %v; got %v", what, timeout, out)
		}
	}
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one matching %v", what, err, target)
	}
}

func start(t *testing.T, m *tinymq.MQ) {
	t.Helper()
	must(t, m.Start(context.Background()), "Start")
}

func publish(t *testing.T, m *tinymq.MQ, exchange string, ev event, opts ...tinymq.PublishOption) {
	t.Helper()
	must(t, m.Publish(exchange, ev, opts...), fmt.Sprintf("Publish %q to %s", ev.Kind, exchange))
}

func equal[T comparable](t *testing.T, got, want T, what string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func equalSlices(t *testing.T, got, want []string, what string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

// asInt64 compares header numbers by value: an engine may hand back an int
// as an int64.
func asInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}

func (s *suite) fanout(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("events")
	typed := make(chan event, 16)
	a := newSink()
	must(t, m.RegisterQueue(ex, tinymq.Fanout, tinymq.Handler(func(_ context.Context, ev event) error {
		typed <- ev
		return nil
	}), 1, tinymq.WithQueueName(n("typed"))), "RegisterQueue typed")
	must(t, m.RegisterQueue(ex, tinymq.Fanout, a.consume, 1, tinymq.WithQueueName(n("a"))), "RegisterQueue a")
	start(t, m)
	for i := range 3 {
		publish(t, m, ex, event{Kind: fmt.Sprint("e", i), N: i})
	}
	got := a.take(t, 3, "queue a")
	equalSlices(t, kinds(t, got), []string{"e0", "e1", "e2"}, "queue a, in publish order")
	for i, msg := range got {
		equal(t, msg.Exchange, ex, "Msg.Exchange")
		equal(t, msg.Queue, n("a"), "Msg.Queue")
		equal(t, msg.Attempt, 1, "Msg.Attempt")
		equal(t, msg.Redelivered, false, "Msg.Redelivered")
		equal(t, len(msg.Deaths), 0, "len(Msg.Deaths)")
		equal(t, payload(t, msg).N, i, "payload N")
		if msg.Headers != nil {
			t.Fatalf("Msg.Headers: got %v, want nil", msg.Headers)
		}
	}
	for i := range 3 {
		select {
		case ev := <-typed:
			equal(t, ev, event{Kind: fmt.Sprint("e", i), N: i}, "typed queue")
		case <-time.After(timeout):
			t.Fatalf("typed queue: message %d did not arrive", i)
		}
	}
}

func (s *suite) direct(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("direct")
	qa, qb := newSink(), newSink()
	must(t, m.RegisterQueue(ex, tinymq.Direct, qa.consume, 1, tinymq.WithQueueName(n("a")),
		tinymq.WithBindingKey("a"), tinymq.WithBindingKey("fence")), "RegisterQueue a")
	must(t, m.RegisterQueue(ex, tinymq.Direct, qb.consume, 1, tinymq.WithQueueName(n("b")),
		tinymq.WithBindingKey("b"), tinymq.WithBindingKey("B"), tinymq.WithBindingKey("fence")), "RegisterQueue b")
	start(t, m)
	publish(t, m, ex, event{Kind: "a"}, tinymq.WithRoutingKey("a"))
	publish(t, m, ex, event{Kind: "b"}, tinymq.WithRoutingKey("b"))
	publish(t, m, ex, event{Kind: "B"}, tinymq.WithRoutingKey("B"))
	wantErr(t, m.Publish(ex, event{Kind: "c"}, tinymq.WithRoutingKey("c")), tinymq.ErrNoRoute, "routing key c")
	wantErr(t, m.Publish(ex, event{Kind: "A"}, tinymq.WithRoutingKey("A")), tinymq.ErrNoRoute, "keys are case-sensitive")
	publish(t, m, ex, event{Kind: "fence"}, tinymq.WithRoutingKey("fence"))
	equalSlices(t, qa.takeUntilFence(t, "queue a"), []string{"a"}, "queue a")
	equalSlices(t, qb.takeUntilFence(t, "queue b"), []string{"b", "B"}, "queue b")
}

func (s *suite) topic(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("topic")
	errs, audit := newSink(), newSink()
	must(t, m.RegisterQueue(ex, tinymq.Topic, errs.consume, 1, tinymq.WithQueueName(n("errors")),
		tinymq.WithBindingKey("*.error"), tinymq.WithBindingKey("fence")), "RegisterQueue errors")
	must(t, m.RegisterQueue(ex, tinymq.Topic, audit.consume, 1, tinymq.WithQueueName(n("audit")),
		tinymq.WithBindingKey("audit.#"), tinymq.WithBindingKey("#.critical"), tinymq.WithBindingKey("fence")), "RegisterQueue audit")
	start(t, m)
	for _, rk := range []string{"db.error", "audit", "audit.db.error", "db.critical", "audit.critical"} {
		publish(t, m, ex, event{Kind: rk}, tinymq.WithRoutingKey(rk))
	}
	for _, rk := range []string{"db.warn", "error", "a.b.error", "x..error", ""} {
		wantErr(t, m.Publish(ex, event{Kind: rk}, tinymq.WithRoutingKey(rk)), tinymq.ErrNoRoute, fmt.Sprintf("routing key %q", rk))
	}
	publish(t, m, ex, event{Kind: "fence"}, tinymq.WithRoutingKey("fence"))
	equalSlices(t, errs.takeUntilFence(t, "errors"), []string{"db.error"}, "queue errors")
	equalSlices(t, audit.takeUntilFence(t, "audit"), []string{"audit", "audit.db.error", "db.critical", "audit.critical"},
		"queue audit (audit.critical matches two bindings, delivered once)")
}

func (s *suite) headers(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("headers")
	all, anyq := newSink(), newSink()
	fence := tinymq.WithBindingArgs(map[string]any{"x-match": "any", "fence": "yes"})
	must(t, m.RegisterQueue(ex, tinymq.Headers, all.consume, 1, tinymq.WithQueueName(n("all")),
		tinymq.WithBindingArgs(map[string]any{"x-match": "all", "format": "pdf", "v": int32(1)}), fence), "RegisterQueue all")
	must(t, m.RegisterQueue(ex, tinymq.Headers, anyq.consume, 1, tinymq.WithQueueName(n("any")),
		tinymq.WithBindingArgs(map[string]any{"x-match": "any", "type": "report", "urgent": true}), fence), "RegisterQueue any")
	start(t, m)
	h := func(kv ...any) tinymq.PublishOption {
		hm := make(map[string]any)
		for i := 0; i < len(kv); i += 2 {
			hm[kv[i].(string)] = kv[i+1]
		}
		return tinymq.WithHeaders(hm)
	}
	publish(t, m, ex, event{Kind: "pdf-int64"}, h("format", "pdf", "v", int64(1)))
	publish(t, m, ex, event{Kind: "pdf-float"}, h("format", "pdf", "v", 1.0, "extra", "x"))
	publish(t, m, ex, event{Kind: "pdf-bytes"}, h("format", []byte("pdf"), "v", 1))
	publish(t, m, ex, event{Kind: "report"}, h("type", "report"))
	publish(t, m, ex, event{Kind: "urgent"}, h("urgent", true, "format", "doc"))
	wantErr(t, m.Publish(ex, event{Kind: "v2"}, h("format", "pdf", "v", 2)), tinymq.ErrNoRoute, "v 2")
	wantErr(t, m.Publish(ex, event{Kind: "nothing"}), tinymq.ErrNoRoute, "no headers")
	wantErr(t, m.Publish(ex, event{Kind: "only-format"}, h("format", "pdf")), tinymq.ErrNoRoute, "all needs every argument")
	publish(t, m, ex, event{Kind: "fence"}, h("fence", "yes"))

	got := all.take(t, 4, "queue all")
	equalSlices(t, kinds(t, got), []string{"pdf-int64", "pdf-float", "pdf-bytes", "fence"}, "queue all")
	v, ok := asInt64(got[0].Headers["v"])
	equal(t, ok && v == 1, true, fmt.Sprintf("header v of the first message (%T %v) is the integer 1", got[0].Headers["v"], got[0].Headers["v"]))
	equal(t, got[0].Headers["format"], any("pdf"), "header format")
	equal(t, got[1].Headers["extra"], any("x"), "header extra")
	equalSlices(t, anyq.takeUntilFence(t, "queue any"), []string{"report", "urgent"}, "queue any")
}

func (s *suite) unroutable(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("nobody")
	must(t, m.DeclareExchange(ex, tinymq.Direct), "DeclareExchange")
	start(t, m)
	wantErr(t, m.Publish(ex, event{Kind: "x"}, tinymq.WithRoutingKey("k")), tinymq.ErrNoRoute, "exchange without queues")
	wantErr(t, m.Publish(n("undeclared"), event{Kind: "x"}), tinymq.ErrUnknownExchange, "undeclared exchange")
	st := m.Stats().Exchanges[ex]
	equal(t, st.Unroutable, uint64(1), "Stats().Exchanges[ex].Unroutable")
	equal(t, st.Published, uint64(0), "Stats().Exchanges[ex].Published")
}

func (s *suite) alternate(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	main, alt := n("main"), n("alt")
	must(t, m.DeclareExchange(alt, tinymq.Fanout), "DeclareExchange alt")
	must(t, m.DeclareExchange(main, tinymq.Direct, tinymq.WithAlternateExchange(alt)), "DeclareExchange main")
	routed, unrouted := newSink(), newSink()
	must(t, m.RegisterQueue(main, tinymq.Direct, routed.consume, 1, tinymq.WithQueueName(n("routed")), tinymq.WithBindingKey("k")), "RegisterQueue routed")
	must(t, m.RegisterQueue(alt, tinymq.Fanout, unrouted.consume, 1, tinymq.WithQueueName(n("unrouted"))), "RegisterQueue unrouted")
	start(t, m)
	publish(t, m, main, event{Kind: "k"}, tinymq.WithRoutingKey("k"))
	publish(t, m, main, event{Kind: "other"}, tinymq.WithRoutingKey("other"))
	got := unrouted.take(t, 1, "alternate queue")[0]
	equal(t, payload(t, got).Kind, "other", "the alternate exchange's queue")
	equal(t, got.Exchange, main, "Msg.Exchange keeps the exchange published to")
	equal(t, got.RoutingKey, "other", "Msg.RoutingKey")
	equal(t, payload(t, routed.take(t, 1, "routed queue")[0]).Kind, "k", "the routed queue")
}

func (s *suite) bind(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	broadcast, personal := n("broadcast"), n("personal")
	q := newSink()
	must(t, m.RegisterQueue(broadcast, tinymq.Fanout, q.consume, 1, tinymq.WithQueueName(n("device"))), "RegisterQueue")
	start(t, m)
	must(t, m.Bind(n("device"), personal, tinymq.Direct, tinymq.WithBindingKey("device-1")), "Bind")
	wantErr(t, m.Bind(n("nope"), personal, tinymq.Direct, tinymq.WithBindingKey("x")), tinymq.ErrUnknownQueue, "Bind an unknown queue")
	publish(t, m, broadcast, event{Kind: "all"})
	publish(t, m, personal, event{Kind: "mine"}, tinymq.WithRoutingKey("device-1"))
	wantErr(t, m.Publish(personal, event{Kind: "theirs"}, tinymq.WithRoutingKey("device-2")), tinymq.ErrNoRoute, "another device's key")
	got := q.take(t, 2, "device queue")
	slices.SortFunc(got, func(a, b *tinymq.Msg) int { return strings.Compare(a.Exchange, b.Exchange) })
	equalSlices(t, kinds(t, got), []string{"all", "mine"}, "device queue")
	equal(t, got[0].Exchange, broadcast, "Msg.Exchange of the broadcast")
	equal(t, got[1].Exchange, personal, "Msg.Exchange of the personal message")
}

func (s *suite) handler(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, dead := n("typed"), n("dead")
	got := make(chan event, 4)
	dl := newSink()
	must(t, m.RegisterQueue(dead, tinymq.Fanout, dl.consume, 1, tinymq.WithQueueName(n("dead"))), "RegisterQueue dead")
	must(t, m.RegisterQueue(ex, tinymq.Fanout, tinymq.Handler(func(_ context.Context, ev event) error {
		got <- ev
		return nil
	}), 1, tinymq.WithQueueName(n("typed")), tinymq.WithDeadLetter(dead, ""),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond})), "RegisterQueue typed")
	start(t, m)
	publish(t, m, ex, event{Kind: "ok", N: 7})
	must(t, m.Publish(ex, []string{"not", "an", "event"}), "Publish a payload of another type")
	select {
	case ev := <-got:
		equal(t, ev, event{Kind: "ok", N: 7}, "typed payload")
	case <-time.After(timeout):
		t.Fatal("the typed consumer got nothing")
	}
	d := dl.take(t, 1, "dead letters")[0]
	if len(d.Deaths) != 1 {
		t.Fatalf("the payload of the wrong type: Deaths %+v, want one", d.Deaths)
	}
	equal(t, d.Deaths[0].Attempts, 1, "a payload of the wrong type is permanent: attempts")
	equal(t, d.Deaths[0].Reason, tinymq.ReasonRejected, "death reason")
}

// handlerForms checks RegisterHandler and RegisterDeliveryHandler: the
// payload typed, the metadata of a Delivery, and a retry's attempt.
func (s *suite) handlerForms(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("forms")
	got := make(chan event, 4)
	must(t, tinymq.RegisterHandler(m, ex, tinymq.Topic, func(_ context.Context, ev event) error {
		got <- ev
		return nil
	}, 1, tinymq.WithQueueName(n("plain")), tinymq.WithBindingKey("user.*")), "RegisterHandler")
	deliveries := make(chan tinymq.Delivery[event], 4)
	must(t, tinymq.RegisterDeliveryHandler(m, ex, tinymq.Topic, func(_ context.Context, d tinymq.Delivery[event]) error {
		deliveries <- d
		if d.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}, 1, tinymq.WithQueueName(n("meta")), tinymq.WithBindingKey("user.#"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})), "RegisterDeliveryHandler")
	start(t, m)
	publish(t, m, ex, event{Kind: "created", N: 1}, tinymq.WithRoutingKey("user.created"))
	select {
	case ev := <-got:
		equal(t, ev, event{Kind: "created", N: 1}, "RegisterHandler payload")
	case <-time.After(timeout):
		t.Fatal("the RegisterHandler consumer got nothing")
	}
	for attempt := 1; attempt <= 2; attempt++ {
		select {
		case d := <-deliveries:
			equal(t, d.Data, event{Kind: "created", N: 1}, "Delivery.Data")
			equal(t, d.Attempt, attempt, "Delivery.Attempt")
			equal(t, d.RoutingKey, "user.created", "Delivery.RoutingKey")
			equal(t, d.Exchange, ex, "Delivery.Exchange")
			equal(t, d.Queue, n("meta"), "Delivery.Queue")
			if d.ID == 0 {
				t.Fatal("Delivery.ID is 0")
			}
		case <-time.After(timeout):
			t.Fatalf("the RegisterDeliveryHandler consumer got no attempt %d", attempt)
		}
	}
}

func (s *suite) ids(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("ids")
	a, b := newSink(), newSink()
	must(t, m.RegisterQueue(ex, tinymq.Fanout, a.consume, 1, tinymq.WithQueueName(n("a"))), "RegisterQueue a")
	must(t, m.RegisterQueue(ex, tinymq.Fanout, b.consume, 1, tinymq.WithQueueName(n("b"))), "RegisterQueue b")
	start(t, m)
	for i := range 3 {
		publish(t, m, ex, event{Kind: fmt.Sprint(i)})
	}
	ga, gb := a.take(t, 3, "queue a"), b.take(t, 3, "queue b")
	seen := make(map[uint64]bool)
	for i := range 3 {
		if ga[i].ID == 0 {
			t.Fatalf("message %d has ID 0", i)
		}
		equal(t, ga[i].ID, gb[i].ID, "the same ID in every queue's copy")
		if seen[ga[i].ID] {
			t.Fatalf("ID %d stamped twice", ga[i].ID)
		}
		seen[ga[i].ID] = true
		if s.caps.SequentialIDs {
			equal(t, ga[i].ID, uint64(i+1), "sequential ID")
		}
	}
}

func (s *suite) concurrency(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("work")
	const workers = 3
	var inside atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		if inside.Add(1) == workers {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
			return nil
		case <-time.After(timeout):
			return errors.New("the other workers never came")
		}
	}, workers, tinymq.WithQueueName(n("work"))), "RegisterQueue")
	start(t, m)
	for i := range workers {
		publish(t, m, ex, event{Kind: fmt.Sprint(i)})
	}
	select {
	case <-all:
	case <-time.After(timeout):
		t.Fatalf("%d of %d workers were in the consumer at once", inside.Load(), workers)
	}
}

// deadLetterSetup registers a dead-letter exchange with one queue and
// returns its sink.
func deadLetterSetup(t *testing.T, m *tinymq.MQ, n func(string) string) (string, *sink) {
	dead := n("dead")
	dl := newSink()
	must(t, m.RegisterQueue(dead, tinymq.Fanout, dl.consume, 1, tinymq.WithQueueName(n("dead"))), "RegisterQueue dead")
	return dead, dl
}

// checkDeath checks the one Death of a dead-lettered message.
func (s *suite) checkDeath(t *testing.T, d *tinymq.Msg, want tinymq.Death, orig uint64, since time.Time) {
	t.Helper()
	if len(d.Deaths) != 1 {
		t.Fatalf("Deaths: got %+v, want one", d.Deaths)
	}
	got := d.Deaths[0]
	equal(t, got.Reason, want.Reason, "Death.Reason")
	equal(t, got.Queue, want.Queue, "Death.Queue")
	equal(t, got.Exchange, want.Exchange, "Death.Exchange")
	equal(t, got.RoutingKey, want.RoutingKey, "Death.RoutingKey")
	if want.Attempts >= 0 {
		equal(t, got.Attempts, want.Attempts, "Death.Attempts")
	}
	// Brokers stamp whole seconds.
	if got.Time.Before(since.Add(-time.Second).Truncate(time.Second)) || got.Time.After(time.Now().Add(time.Second)) {
		t.Fatalf("Death.Time %v is not within this test (since %v)", got.Time, since)
	}
	equal(t, got.Count, 1, "Death.Count")
	equal(t, got.MessageID, orig, "Death.MessageID")
}

// origID returns the ID that the nth message published to an exchange had,
// for a dead letter d of it: in memory the dead-letter exchange stamps a new
// ID and the suite knows the old one by its order; a broker keeps the ID.
func (s *suite) origID(d *tinymq.Msg, nth uint64) uint64 {
	if s.caps.SequentialIDs {
		return nth
	}
	return d.ID
}

func (s *suite) retries(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	begin := time.Now()
	ex := n("orders")
	dead, dl := deadLetterSetup(t, m, n)
	var mu sync.Mutex
	var attempts []int
	var firstID uint64
	must(t, m.RegisterQueue(ex, tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
		mu.Lock()
		attempts = append(attempts, msg.Attempt)
		firstID = msg.ID
		mu.Unlock()
		return errors.New("always fails")
	}, 1, tinymq.WithQueueName(n("orders")), tinymq.WithBindingKey("new"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}),
		tinymq.WithDeadLetter(dead, "")), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "order", N: 1}, tinymq.WithRoutingKey("new"), tinymq.WithHeaders(map[string]any{"tenant": "acme"}))
	d := dl.take(t, 1, "dead letters")[0]
	mu.Lock()
	gotAttempts, id := slices.Clone(attempts), firstID
	mu.Unlock()
	if !slices.Equal(gotAttempts, []int{1, 2, 3}) {
		t.Fatalf("attempts: got %v, want [1 2 3]", gotAttempts)
	}
	if elapsed := time.Since(begin); elapsed < 60*time.Millisecond {
		t.Fatalf("three attempts with backoffs of 20ms and 40ms took only %v", elapsed)
	}
	equal(t, payload(t, d), event{Kind: "order", N: 1}, "dead letter's payload")
	equal(t, d.Exchange, dead, "dead letter's Msg.Exchange")
	equal(t, d.RoutingKey, "new", "dead letter keeps its routing key")
	equal(t, d.Headers["tenant"], any("acme"), "dead letter keeps its headers")
	s.checkDeath(t, d, tinymq.Death{Reason: tinymq.ReasonRejected, Queue: n("orders"), Exchange: ex, RoutingKey: "new", Attempts: 3}, id, begin)
	// The dead letter can arrive before its source counts it.
	deadline := time.Now().Add(timeout)
	for {
		st := m.Stats().Queues[n("orders")]
		if st.DeadLettered == 1 || time.Now().After(deadline) {
			equal(t, st.Delivered, uint64(3), "Stats Delivered")
			equal(t, st.Failed, uint64(3), "Stats Failed")
			equal(t, st.Retried, uint64(2), "Stats Retried")
			equal(t, st.DeadLettered, uint64(1), "Stats DeadLettered")
			return
		}
		<-time.After(5 * time.Millisecond) // polling a counter: nothing to wait on
	}
}

func (s *suite) permanent(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	begin := time.Now()
	ex := n("jobs")
	dead, dl := deadLetterSetup(t, m, n)
	ok := make(chan *tinymq.Msg, 4)
	var permID atomic.Uint64
	must(t, m.RegisterQueue(ex, tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
		switch payload(t, msg).Kind {
		case "permanent":
			permID.Store(msg.ID)
			return tinymq.Permanent(errors.New("malformed"))
		case "panic":
			if msg.Attempt == 1 {
				panic("first attempt panics")
			}
		}
		ok <- msg
		return nil
	}, 1, tinymq.WithQueueName(n("jobs")), tinymq.WithBindingKey("job"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 10 * time.Millisecond}),
		tinymq.WithDeadLetter(dead, "dead.key")), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "permanent"}, tinymq.WithRoutingKey("job"))
	publish(t, m, ex, event{Kind: "panic"}, tinymq.WithRoutingKey("job"))
	d := dl.take(t, 1, "dead letters")[0]
	equal(t, payload(t, d).Kind, "permanent", "dead letter")
	equal(t, d.RoutingKey, "dead.key", "WithDeadLetter's key replaces the routing key")
	s.checkDeath(t, d, tinymq.Death{Reason: tinymq.ReasonRejected, Queue: n("jobs"), Exchange: ex, RoutingKey: "job", Attempts: 1}, permID.Load(), begin)
	select {
	case msg := <-ok:
		equal(t, payload(t, msg).Kind, "panic", "the panicking message, retried")
		equal(t, msg.Attempt, 2, "attempt after a panic")
	case <-time.After(timeout):
		t.Fatal("a message whose first attempt panicked was not retried")
	}
}

// blocker is a consumer that holds the first message of kind "block" until
// released, so that the next ones wait in the queue.
type blocker struct {
	sink        *sink
	started     chan struct{}
	release     chan struct{}
	once        sync.Once
	releaseOnce sync.Once
}

// newBlocker returns a blocker that is released when the test ends at the
// latest, before the MQ is stopped (cleanups run last in, first out), so
// that a failing test does not hang in Stop.
func newBlocker(t *testing.T) *blocker {
	b := &blocker{sink: newSink(), started: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(b.unblock)
	return b
}

func (b *blocker) unblock() { b.releaseOnce.Do(func() { close(b.release) }) }

func (b *blocker) consume(ctx context.Context, m *tinymq.Msg) error {
	if ev, err := decodeEvent(m); err == nil && ev.Kind == "block" {
		b.once.Do(func() { close(b.started) })
		select {
		case <-b.release:
		case <-ctx.Done():
		}
	}
	return b.sink.consume(ctx, m)
}

func decodeEvent(m *tinymq.Msg) (event, error) {
	switch d := m.Data.(type) {
	case event:
		return d, nil
	case tinymq.Encoded:
		var ev event
		err := d.Decode(&ev)
		return ev, err
	}
	return event{}, fmt.Errorf("payload %T", m.Data)
}

func (b *blocker) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-b.started:
	case <-time.After(timeout):
		t.Fatal("the blocking message never reached the consumer")
	}
}

// ttlTest publishes "late" behind a blocked "block" and checks that it expires
// into the dead-letter queue without reaching the consumer.
func (s *suite) ttlTest(t *testing.T, queueTTL, msgTTL time.Duration) {
	n := names(t)
	m := s.mq(t)
	begin := time.Now()
	ex := n("ttl")
	dead, dl := deadLetterSetup(t, m, n)
	b := newBlocker(t)
	opts := []tinymq.QueueOption{tinymq.WithQueueName(n("ttl")), tinymq.WithDeadLetter(dead, "")}
	if queueTTL > 0 {
		opts = append(opts, tinymq.WithMessageTTL(queueTTL))
	}
	must(t, m.RegisterQueue(ex, tinymq.Fanout, b.consume, 1, opts...), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "block"})
	b.waitStarted(t)
	var popts []tinymq.PublishOption
	if msgTTL > 0 {
		popts = append(popts, tinymq.WithExpiration(msgTTL))
	}
	publish(t, m, ex, event{Kind: "late"}, popts...)
	// The TTL must pass while "late" waits: time, not a race to synchronise.
	<-time.After(3 * max(queueTTL, msgTTL))
	b.unblock()
	d := dl.take(t, 1, "dead letters")[0]
	equal(t, payload(t, d).Kind, "late", "the expired message")
	s.checkDeath(t, d, tinymq.Death{Reason: tinymq.ReasonExpired, Queue: n("ttl"), Exchange: ex, Attempts: 0}, s.origID(d, 2), begin)
	equalSlices(t, kinds(t, b.sink.take(t, 1, "consumer")), []string{"block"}, "the consumer got only the first message")
	publish(t, m, ex, event{Kind: "fence"})
	equalSlices(t, b.sink.takeUntilFence(t, "consumer"), nil, "the consumer never got the expired message")
}

func (s *suite) queueTTL(t *testing.T)   { s.ttlTest(t, 100*time.Millisecond, 0) }
func (s *suite) messageTTL(t *testing.T) { s.ttlTest(t, 0, 100*time.Millisecond) }

func (s *suite) rejectPublish(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("bounded")
	b := newBlocker(t)
	must(t, m.RegisterQueue(ex, tinymq.Fanout, b.consume, 1, tinymq.WithQueueName(n("bounded")),
		tinymq.WithMaxLen(1, tinymq.RejectPublish)), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "block"})
	b.waitStarted(t) // a message in the consumer does not count
	publish(t, m, ex, event{Kind: "second"})
	want := []string{"block", "second"}
	if s.caps.ApproximateMaxLen {
		// Publish until one is refused: a handful at most.
		const bound = 50
		for i := 0; ; i++ {
			if i == bound {
				t.Fatalf("%d publishes past a limit of 1 were all accepted", bound)
			}
			kind := fmt.Sprintf("extra-%d", i)
			err := m.Publish(ex, event{Kind: kind})
			if err == nil {
				want = append(want, kind)
				continue
			}
			wantErr(t, err, tinymq.ErrQueueFull, "a publish into a full queue")
			break
		}
	} else {
		wantErr(t, m.Publish(ex, event{Kind: "third"}), tinymq.ErrQueueFull, "a publish into a full queue")
	}
	b.unblock()
	equalSlices(t, kinds(t, b.sink.take(t, len(want), "consumer")), want, "consumer")
	publish(t, m, ex, event{Kind: "fence"})
	equalSlices(t, b.sink.takeUntilFence(t, "consumer"), nil, "the refused message never arrives")
}

func (s *suite) dropHead(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	begin := time.Now()
	ex := n("bounded")
	dead, dl := deadLetterSetup(t, m, n)
	b := newBlocker(t)
	must(t, m.RegisterQueue(ex, tinymq.Fanout, b.consume, 1, tinymq.WithQueueName(n("bounded")),
		tinymq.WithMaxLen(1, tinymq.DropHead), tinymq.WithDeadLetter(dead, "")), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "block"})
	b.waitStarted(t)
	publish(t, m, ex, event{Kind: "oldest"})
	publish(t, m, ex, event{Kind: "newest"})
	d := dl.take(t, 1, "dead letters")[0]
	equal(t, payload(t, d).Kind, "oldest", "DropHead evicts the oldest")
	s.checkDeath(t, d, tinymq.Death{Reason: tinymq.ReasonMaxLen, Queue: n("bounded"), Exchange: ex, Attempts: 0}, s.origID(d, 2), begin)
	b.unblock()
	equalSlices(t, kinds(t, b.sink.take(t, 2, "consumer")), []string{"block", "newest"}, "consumer")
}

func (s *suite) delay(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("later")
	q := newSink()
	must(t, m.RegisterQueue(ex, tinymq.Direct, q.consume, 1, tinymq.WithQueueName(n("later")), tinymq.WithBindingKey("k")), "RegisterQueue")
	start(t, m)
	const d = 300 * time.Millisecond
	begin := time.Now()
	publish(t, m, ex, event{Kind: "delayed"}, tinymq.WithDelay(d), tinymq.WithRoutingKey("k"),
		tinymq.WithHeaders(map[string]any{"h": "v"}))
	publish(t, m, ex, event{Kind: "now"}, tinymq.WithRoutingKey("k"))
	got := q.take(t, 2, "queue")
	elapsed := time.Since(begin)
	equalSlices(t, kinds(t, got), []string{"now", "delayed"}, "the delayed message comes last")
	if elapsed < d-10*time.Millisecond {
		t.Fatalf("a message delayed by %v arrived after %v", d, elapsed)
	}
	late := got[1]
	equal(t, late.Exchange, ex, "Msg.Exchange of a delayed message")
	equal(t, late.RoutingKey, "k", "Msg.RoutingKey of a delayed message")
	equal(t, late.Headers["h"], any("v"), "headers of a delayed message")
	equal(t, len(late.Headers), 1, "a delayed message has only its own headers")
	equal(t, len(late.Deaths), 0, "a delayed message has no Deaths")
	err := m.Publish(ex, event{Kind: "nowhere"}, tinymq.WithDelay(time.Millisecond), tinymq.WithRoutingKey("nope"))
	if s.caps.DelayedNoRoute {
		wantErr(t, err, tinymq.ErrNoRoute, "a delayed message no queue would take")
	} else {
		must(t, err, "a delayed publish routes when its delay ends")
	}
}

func (s *suite) stats(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("counted")
	q := newSink()
	must(t, m.RegisterQueue(ex, tinymq.Fanout, q.consume, 1, tinymq.WithQueueName(n("counted"))), "RegisterQueue")
	start(t, m)
	for i := range 3 {
		publish(t, m, ex, event{Kind: fmt.Sprint(i)})
	}
	q.take(t, 3, "queue")
	// The consumer returned; the worker counts the success right after.
	deadline := time.Now().Add(timeout)
	for {
		st := m.Stats()
		qs := st.Queues[n("counted")]
		if qs.Succeeded == 3 {
			equal(t, st.Exchanges[ex].Published, uint64(3), "Exchanges[ex].Published")
			equal(t, st.Exchanges[ex].Kind, tinymq.Fanout, "Exchanges[ex].Kind")
			equal(t, qs.Delivered, uint64(3), "Delivered")
			equal(t, qs.Failed, uint64(0), "Failed")
			equal(t, qs.ConsumerTime.Samples > 0, true, "ConsumerTime.Samples > 0")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats: Succeeded %d, want 3", qs.Succeeded)
		}
		<-time.After(5 * time.Millisecond) // polling a counter: nothing to wait on
	}
}

func (s *suite) stopWaits(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("slow")
	b := newBlocker(t)
	var sawCancel atomic.Bool
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		err := b.consume(ctx, msg)
		sawCancel.Store(ctx.Err() != nil)
		return err
	}, 1, tinymq.WithQueueName(n("slow"))), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "block"})
	b.waitStarted(t)
	stopped := make(chan struct{})
	go func() { // joined below: stopped closes
		m.Stop()
		close(stopped)
	}()
	// Publishes fail once Stop has begun.
	deadline := time.Now().Add(timeout)
	for !errors.Is(m.Publish(ex, event{Kind: "after"}), tinymq.ErrStopped) {
		if time.Now().After(deadline) {
			t.Fatal("Publish still succeeds after Stop began")
		}
		<-time.After(time.Millisecond)
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned while a consumer was still running")
	case <-time.After(50 * time.Millisecond):
	}
	b.unblock()
	select {
	case <-stopped:
	case <-time.After(timeout):
		t.Fatal("Stop did not return after the consumer did")
	}
	equal(t, sawCancel.Load(), false, "the consumer's context was cancelled before it returned")
	equalSlices(t, kinds(t, b.sink.take(t, 1, "consumer")), []string{"block"}, "the message in the consumer completed")
	m.Stop() // idempotent
	wantErr(t, m.RegisterQueue(ex, tinymq.Fanout, b.consume, 1, tinymq.WithQueueName(n("late"))), tinymq.ErrStopped, "RegisterQueue after Stop")
	wantErr(t, m.Start(context.Background()), tinymq.ErrStopped, "Start after Stop")
}

func (s *suite) drains(t *testing.T) {
	n := names(t)
	ex, queue := n("backlog"), n("backlog")
	const count = 20
	q := newSink()
	m := s.mq(t)
	must(t, m.RegisterQueue(ex, tinymq.Fanout, q.consume, 2, tinymq.WithQueueName(queue)), "RegisterQueue")
	for i := range count {
		publish(t, m, ex, event{Kind: fmt.Sprint(i)}) // before Start: they wait
	}
	if s.caps.StopDrains {
		start(t, m)
		m.Stop()
		if got := len(q.ch); got != count {
			t.Fatalf("after Stop: %d messages delivered, want %d", got, count)
		}
		return
	}
	// Accepted messages outlive the MQ that published them: stopping it
	// before it consumed anything leaves them to the next consumer.
	m.Stop()
	equal(t, len(q.ch), 0, "messages delivered by an MQ that never started")
	m2 := s.mq(t)
	must(t, m2.RegisterQueue(ex, tinymq.Fanout, q.consume, 2, tinymq.WithQueueName(queue)), "RegisterQueue in the second MQ")
	start(t, m2)
	got := kinds(t, q.take(t, count, "second MQ"))
	slices.Sort(got)
	want := make([]string, count)
	for i := range count {
		want[i] = fmt.Sprint(i)
	}
	slices.Sort(want)
	equalSlices(t, got, want, "every message published by the first MQ")
}

func (s *suite) shutdownDeadline(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("stuck")
	cancelled := make(chan struct{})
	begun := make(chan struct{})
	var once sync.Once
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		once.Do(func() { close(begun) })
		select {
		case <-ctx.Done():
			close(cancelled)
			return ctx.Err()
		case <-time.After(timeout):
			return errors.New("never cancelled")
		}
	}, 1, tinymq.WithQueueName(n("stuck"))), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "stuck"})
	select {
	case <-begun:
	case <-time.After(timeout):
		t.Fatal("the message never reached the consumer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	wantErr(t, m.Shutdown(ctx), context.DeadlineExceeded, "Shutdown past its deadline")
	select {
	case <-cancelled:
	case <-time.After(timeout):
		t.Fatal("the consumer's context was not cancelled at the deadline")
	}
	m.Stop() // waits for the consumer to return
}

func (s *suite) differences(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("diff")
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	check := func(supported bool, what string, err error) {
		t.Helper()
		switch {
		case supported && err != nil:
			t.Fatalf("%s: %v", what, err)
		case !supported && !errors.Is(err, tinymq.ErrUnsupported):
			t.Fatalf("%s: got %v, want an error matching tinymq.ErrUnsupported", what, err)
		}
	}
	check(s.caps.Filter, "WithFilter",
		m.RegisterQueue(ex, tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("filtered")),
			tinymq.WithFilter(func(*tinymq.Msg) bool { return true })))
	check(s.caps.Block, "WithMaxLen(1, Block)",
		m.RegisterQueue(ex, tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("blocking")), tinymq.WithMaxLen(1, tinymq.Block)))
	check(s.caps.UnnamedQueues, "a queue without WithQueueName",
		m.RegisterQueue(ex, tinymq.Fanout, nop, 1))
}

func (s *suite) stopFromConsumer(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("stopper")
	errs := make(chan error, 1)
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		errs <- m.Shutdown(context.Background()) // must not wait for this very consumer
		return nil
	}, 1, tinymq.WithQueueName(n("stopper"))), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "stop"})
	select {
	case err := <-errs:
		wantErr(t, err, tinymq.ErrCalledFromConsumer, "Shutdown called from a consumer")
	case <-time.After(timeout):
		t.Fatal("Shutdown called from a consumer did not return")
	}
	stopped := make(chan struct{})
	go func() { // joined below
		m.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(timeout):
		t.Fatal("Stop did not complete after the consumer returned")
	}
	wantErr(t, m.Publish(ex, event{Kind: "after"}), tinymq.ErrStopped, "Publish after a consumer stopped the MQ")
}

// typedNil is an error type whose nil pointer a consumer may return by
// mistake.
type typedNil struct{}

func (*typedNil) Error() string { return "typed nil" }

func (s *suite) hostile(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex := n("hostile")
	ok := newSink()
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		if msg.Attempt == 1 {
			switch payload(t, msg).Kind {
			case "typed-nil":
				var e *typedNil
				return e
			case "goexit":
				runtime.Goexit() // what t.FailNow does
			}
		}
		return ok.consume(ctx, msg)
	}, 1, tinymq.WithQueueName(n("hostile")),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})), "RegisterQueue")
	start(t, m)
	for _, k := range []string{"typed-nil", "goexit", "plain"} {
		publish(t, m, ex, event{Kind: k})
	}
	got := ok.take(t, 3, "queue")
	attempts := make(map[string]int)
	for _, msg := range got {
		attempts[payload(t, msg).Kind] = msg.Attempt
	}
	equal(t, attempts["typed-nil"], 2, "a typed nil error fails the delivery: attempt of its retry")
	equal(t, attempts["goexit"], 2, "runtime.Goexit fails the delivery: attempt of its retry")
	equal(t, attempts["plain"], 1, "the worker goes on after runtime.Goexit")
	deadline := time.Now().Add(timeout)
	for {
		st := m.Stats().Queues[n("hostile")]
		if st.Failed == 2 && st.Succeeded == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats: Failed %d, Succeeded %d; want 2 and 3", st.Failed, st.Succeeded)
		}
		<-time.After(5 * time.Millisecond) // polling a counter: nothing to wait on
	}
}
