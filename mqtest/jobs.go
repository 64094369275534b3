package mqtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinymq/tinymq"
)

// The cases of the job queue features: delivery timeouts, rate limits,
// message groups, deduplication and typed publish. An engine without
// [Capabilities].JobFeatures must refuse the first four with
// tinymq.ErrUnsupported; typed publish is promised on every engine.

// refusedQueueOption checks that RegisterQueue and DeclareQueue refuse opt
// with ErrUnsupported and declare nothing: the same queues are declared
// without it.
func refusedQueueOption(t *testing.T, m *tinymq.MQ, n func(string) string, what string, opt tinymq.QueueOption) {
	t.Helper()
	ex, q, declared := n("refused"), n("refused"), n("declared")
	wantErr(t, m.RegisterQueue(ex, tinymq.Fanout, nop, 1, tinymq.WithQueueName(q), opt), tinymq.ErrUnsupported,
		"RegisterQueue "+what)
	must(t, m.RegisterQueue(ex, tinymq.Fanout, nop, 1, tinymq.WithQueueName(q)),
		"RegisterQueue without "+what+": the refused call declared nothing")
	wantErr(t, m.DeclareQueue(declared, ex, tinymq.Fanout, opt), tinymq.ErrUnsupported, "DeclareQueue "+what)
	must(t, m.DeclareQueue(declared, ex, tinymq.Fanout), "DeclareQueue without "+what)
	queueInfo(t, m, declared) // Topology has it
}

// refusedPublishOption checks that Publish refuses opt with ErrUnsupported
// and routes nothing. m is started, and k consumes the only queue of the
// fanout exchange ex.
func refusedPublishOption(t *testing.T, m *tinymq.MQ, ex string, k *sink, what string, opt tinymq.PublishOption) {
	t.Helper()
	wantErr(t, m.Publish(ex, event{Kind: "refused"}, opt), tinymq.ErrUnsupported, "Publish "+what)
	publish(t, m, ex, event{Kind: "fence"})
	equalSlices(t, k.takeUntilFence(t, "queue"), nil, "the publish refused "+what+" routed nothing")
}

// stuckCall is one call of deliveryTimeout's consumer that never returns
// until released.
type stuckCall struct {
	attempt  int
	began    time.Time
	deadline time.Time
	ok       bool // the context has a deadline
}

func (s *suite) deliveryTimeout(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	if !s.caps.JobFeatures {
		refusedQueueOption(t, m, n, "WithDeliveryTimeout", tinymq.WithDeliveryTimeout(time.Second))
		return
	}
	const d = 100 * time.Millisecond
	begin := time.Now()
	ex, queue := n("jobs"), n("jobs")
	dead, dl := deadLetterSetup(t, m, n)
	// The stuck calls are released when the test ends, before the MQ stops
	// (cleanups run last in, first out): Stop waits for abandoned calls.
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	calls := make(chan stuckCall, 8)
	quick := newSink()
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		ev, err := decodeEvent(msg)
		if err != nil {
			return tinymq.Permanent(err)
		}
		if ev.Kind != "stuck" {
			return quick.consume(ctx, msg)
		}
		deadline, ok := ctx.Deadline()
		calls <- stuckCall{attempt: msg.Attempt, began: time.Now(), deadline: deadline, ok: ok}
		<-release // ignores its context: the timeout must fail it anyway
		return nil
	}, 2, tinymq.WithQueueName(queue), tinymq.WithDeliveryTimeout(d),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
		tinymq.WithDeadLetter(dead, "")), "RegisterQueue")
	start(t, m)
	publish(t, m, ex, event{Kind: "stuck"})

	got := dl.take(t, 1, "dead letters")[0]
	if elapsed := time.Since(begin); elapsed < 2*d {
		t.Fatalf("two attempts that each timed out after %v were dead-lettered after %v", d, elapsed)
	}
	equal(t, payload(t, got).Kind, "stuck", "the dead letter")
	s.checkDeath(t, got, tinymq.Death{Reason: tinymq.ReasonRejected, Queue: queue, Exchange: ex, Attempts: 2}, s.origID(got, 1), begin)
	if !strings.Contains(got.Deaths[0].LastError, tinymq.ErrDeliveryTimeout.Error()) {
		t.Fatalf("Death.LastError: got %q, want it to name %q", got.Deaths[0].LastError, tinymq.ErrDeliveryTimeout)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		select {
		case c := <-calls:
			equal(t, c.attempt, attempt, "the attempt of a timed-out call")
			equal(t, c.ok, true, "the consumer's context has a deadline")
			if left := c.deadline.Sub(c.began); left > d {
				t.Fatalf("attempt %d: the context's deadline was %v after the call began, want at most %v", attempt, left, d)
			}
		case <-time.After(timeout):
			t.Fatalf("attempt %d of the stuck message never reached the consumer", attempt)
		}
	}

	// Both stuck calls still run, abandoned, and the pool keeps its size:
	// a quick message is delivered meanwhile.
	publish(t, m, ex, event{Kind: "quick"})
	equalSlices(t, kinds(t, quick.take(t, 1, "a message behind the timed-out calls")), []string{"quick"}, "queue")
	queueStats(t, m, queue, "two timed-out calls abandoned", func(qs tinymq.QueueStats, _ bool) bool {
		return qs.TimedOut == 2 && qs.Failed == 2 && qs.Abandoned == 2 && qs.DeadLettered == 1 && qs.Succeeded == 1
	})
	unblock()
	st := queueStats(t, m, queue, "the late calls returned", func(qs tinymq.QueueStats, _ bool) bool { return qs.Abandoned == 0 })
	qs := st.Queues[queue]
	equal(t, qs.Succeeded, uint64(1), "Succeeded: a late nil is not a success")
	equal(t, qs.Failed, uint64(2), "Failed after the late calls returned")
}

func (s *suite) rateLimit(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	if !s.caps.JobFeatures {
		refusedQueueOption(t, m, n, "WithRateLimit", tinymq.WithRateLimit(10, 1))
		return
	}
	const rate, burst, count = 20.0, 2, 6
	ex := n("paced")
	k := newSink()
	// Two workers: the limit holds for the queue as a whole.
	must(t, m.RegisterQueue(ex, tinymq.Fanout, k.consume, 2, tinymq.WithQueueName(n("paced")),
		tinymq.WithRateLimit(rate, burst)), "RegisterQueue")
	start(t, m)
	begin := time.Now()
	want := make([]string, count)
	for i := range count {
		want[i] = fmt.Sprint(i)
		publish(t, m, ex, event{Kind: want[i]})
	}
	got := kinds(t, k.take(t, count, "queue"))
	elapsed := time.Since(begin)
	// A full bucket gives burst at once, then one token each 1/rate: the
	// last delivery begins (count-burst)/rate after the first at the
	// earliest. Only a lower bound, with room for the clock: a loaded
	// machine may be slower, never faster.
	least := time.Duration(float64(count-burst) / rate * float64(time.Second))
	if elapsed < least*9/10 {
		t.Fatalf("%d deliveries at %v a second with a burst of %d took %v, want at least %v", count, rate, burst, elapsed, least)
	}
	slices.Sort(got)
	equalSlices(t, got, want, "every message")
}

func (s *suite) groups(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	if !s.caps.JobFeatures {
		refusedQueueOption(t, m, n, "WithGroupOrdering", tinymq.WithGroupOrdering())
		ex := n("plain")
		k := newSink()
		must(t, m.RegisterQueue(ex, tinymq.Fanout, k.consume, 1, tinymq.WithQueueName(n("plain"))), "RegisterQueue")
		start(t, m)
		refusedPublishOption(t, m, ex, k, "WithMessageGroup", tinymq.WithMessageGroup("a"))
		return
	}
	ex := n("orders")
	held := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	var mu sync.Mutex
	seen := make(map[string][]string) // group -> "kind/attempt", in delivery order
	busy := make(map[string]int)
	overlaps := 0
	k := newSink()
	must(t, m.RegisterQueue(ex, tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		ev, err := decodeEvent(msg)
		if err != nil {
			return tinymq.Permanent(err)
		}
		g := msg.Group()
		mu.Lock()
		seen[g] = append(seen[g], fmt.Sprintf("%s/%d", ev.Kind, msg.Attempt))
		if busy[g]++; busy[g] > 1 && g != "" {
			overlaps++
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			busy[g]--
			mu.Unlock()
		}()
		if ev.Kind == "a0" && msg.Attempt == 1 {
			// Group a's head is held, then fails: the rest of a waits for
			// its retry to succeed, while the other groups go on.
			close(held)
			select {
			case <-release:
			case <-time.After(timeout):
			}
			return errors.New("first attempt fails")
		}
		return k.consume(ctx, msg)
	}, 3, tinymq.WithQueueName(n("orders")), tinymq.WithGroupOrdering(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 20 * time.Millisecond})), "RegisterQueue")
	start(t, m)
	for _, kind := range []string{"a0", "a1", "a2"} {
		publish(t, m, ex, event{Kind: kind}, tinymq.WithMessageGroup("a"))
	}
	select {
	case <-held:
	case <-time.After(timeout):
		t.Fatal("the head of group a never reached the consumer")
	}
	for _, kind := range []string{"b0", "b1", "b2"} {
		publish(t, m, ex, event{Kind: kind}, tinymq.WithMessageGroup("b"))
	}
	publish(t, m, ex, event{Kind: "free"}) // no group: as in any queue
	// All while a0 is held.
	others := k.take(t, 4, "group b and the message without a group, while group a is held")
	var b []string
	for _, msg := range others {
		ev := payload(t, msg)
		switch ev.Kind {
		case "free":
			equal(t, msg.Group(), "", "Msg.Group of a message without a group")
		default:
			equal(t, msg.Group(), "b", "Msg.Group of "+ev.Kind)
			b = append(b, ev.Kind)
		}
	}
	equalSlices(t, b, []string{"b0", "b1", "b2"}, "group b, in publish order")
	unblock()
	a := k.take(t, 3, "group a after its head's retry")
	equalSlices(t, kinds(t, a), []string{"a0", "a1", "a2"}, "group a, in publish order")
	equal(t, a[0].Attempt, 2, "a0's attempt: the retry")
	equal(t, a[0].Group(), "a", "Msg.Group of a0")
	mu.Lock()
	defer mu.Unlock()
	equalSlices(t, seen["a"], []string{"a0/1", "a0/2", "a1/1", "a2/1"},
		"group a's deliveries: nothing of a before its head's retry succeeded")
	equal(t, overlaps, 0, "deliveries of one group in the consumer at once")
}

func (s *suite) dedup(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	if !s.caps.JobFeatures {
		ex := n("orders")
		wantErr(t, m.DeclareExchange(ex, tinymq.Fanout, tinymq.WithDeduplication(time.Minute)), tinymq.ErrUnsupported,
			"DeclareExchange WithDeduplication")
		must(t, m.DeclareExchange(ex, tinymq.Fanout), "DeclareExchange without WithDeduplication: the refused call declared nothing")
		k := newSink()
		must(t, m.RegisterQueue(ex, tinymq.Fanout, k.consume, 1, tinymq.WithQueueName(n("orders"))), "RegisterQueue")
		start(t, m)
		refusedPublishOption(t, m, ex, k, "WithDeduplicationID", tinymq.WithDeduplicationID("order-1"))
		return
	}
	ex, plain, short := n("orders"), n("plain"), n("short")
	must(t, m.DeclareExchange(ex, tinymq.Direct, tinymq.WithDeduplication(time.Hour)), "DeclareExchange")
	const window = 100 * time.Millisecond
	must(t, m.DeclareExchange(short, tinymq.Fanout, tinymq.WithDeduplication(window)), "DeclareExchange short")
	qa, qb, qs, qp := newSink(), newSink(), newSink(), newSink()
	for _, q := range []struct {
		name string
		k    *sink
	}{{"a", qa}, {"b", qb}} {
		must(t, m.RegisterQueue(ex, tinymq.Direct, q.k.consume, 1, tinymq.WithQueueName(n(q.name)),
			tinymq.WithBindingKey("k"), tinymq.WithBindingKey("fence")), "RegisterQueue "+q.name)
	}
	must(t, m.RegisterQueue(short, tinymq.Fanout, qs.consume, 1, tinymq.WithQueueName(n("short"))), "RegisterQueue short")
	must(t, m.RegisterQueue(plain, tinymq.Fanout, qp.consume, 1, tinymq.WithQueueName(n("plain"))), "RegisterQueue plain")
	start(t, m)

	key, id := tinymq.WithRoutingKey("k"), tinymq.WithDeduplicationID
	publish(t, m, ex, event{Kind: "first"}, key, id("order-1"))
	publish(t, m, ex, event{Kind: "again"}, key, id("order-1")) // nil, and routed nowhere
	publish(t, m, ex, event{Kind: "again"}, key, id("order-1"))
	wantErr(t, m.Publish(ex, event{Kind: "lost"}, tinymq.WithRoutingKey("nope"), id("order-2")), tinymq.ErrNoRoute,
		"an unroutable publish with an ID")
	publish(t, m, ex, event{Kind: "second"}, key, id("order-2")) // the failed publish left no ID behind
	publish(t, m, ex, event{Kind: "plain"}, key)                 // no ID: routed as usual
	publish(t, m, ex, event{Kind: "fence"}, tinymq.WithRoutingKey("fence"))
	for name, k := range map[string]*sink{"a": qa, "b": qb} {
		equalSlices(t, k.takeUntilFence(t, "queue "+name), []string{"first", "second", "plain"},
			"queue "+name+": each ID once, in every queue")
	}
	st := m.Stats().Exchanges[ex]
	equal(t, st.Duplicates, uint64(2), "ExchangeStats.Duplicates")
	equal(t, st.Published, uint64(4), "ExchangeStats.Published: duplicates are not in it")
	equal(t, st.Unroutable, uint64(1), "ExchangeStats.Unroutable")
	wantErr(t, m.Publish(plain, event{Kind: "x"}, id("order-1")), tinymq.ErrInvalidOption,
		"WithDeduplicationID to an exchange without WithDeduplication")

	// The window counts from the first accepted publish; after it the ID
	// routes again.
	publish(t, m, short, event{Kind: "once"}, id("job-1"))
	<-time.After(2 * window) // the window must pass: time, not a race to synchronise
	publish(t, m, short, event{Kind: "after the window"}, id("job-1"))
	publish(t, m, short, event{Kind: "fence"})
	equalSlices(t, qs.takeUntilFence(t, "queue short"), []string{"once", "after the window"}, "an ID after its window")
	equal(t, m.Stats().Exchanges[short].Duplicates, uint64(0), "Duplicates of the exchange whose window passed")
	publish(t, m, plain, event{Kind: "fence"})
	equalSlices(t, qp.takeUntilFence(t, "queue plain"), nil, "the refused publish with an ID routed nothing")
}

// kindOf is the Kind of a message's payload when it is an event, a
// tinymq.Encoded of one, or any other value that encodes as one in JSON (an
// untyped queue keeps the published value in memory).
func kindOf(t *testing.T, m *tinymq.Msg) string {
	t.Helper()
	if ev, err := decodeEvent(m); err == nil {
		return ev.Kind
	}
	b, err := json.Marshal(m.Data)
	if err != nil {
		t.Fatalf("payload of message %d: %T: %v", m.ID, m.Data, err)
	}
	var ev event
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatalf("payload of message %d: %T is not an event: %v", m.ID, m.Data, err)
	}
	return ev.Kind
}

// typedQueue collects what a typed consumer receives.
type typedQueue chan event

func (q typedQueue) consume(_ context.Context, ev event) error {
	q <- ev
	return nil
}

// untilFence waits for the event of kind "fence" and returns the events
// before it.
func (q typedQueue) untilFence(t *testing.T, what string) []event {
	t.Helper()
	var out []event
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case ev := <-q:
			if ev.Kind == "fence" {
				return out
			}
			out = append(out, ev)
		case <-deadline.C:
			t.Fatalf("%s: no fence within %v; got %v", what, timeout, out)
		}
	}
}

func (s *suite) typedPublish(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, sub := n("typed"), n("sub")
	registered, consumed, delivered := make(typedQueue, 16), make(typedQueue, 16), make(typedQueue, 16)
	plain := newSink()
	fence := tinymq.WithBindingKey("fence")
	must(t, tinymq.RegisterHandler(m, ex, tinymq.Direct, registered.consume, 1, tinymq.WithQueueName(n("registered")),
		tinymq.WithBindingKey("registered"), tinymq.WithBindingKey("shared"), fence), "RegisterHandler")
	must(t, tinymq.RegisterDeliveryHandler(m, ex, tinymq.Direct, func(ctx context.Context, d tinymq.Delivery[event]) error {
		return delivered.consume(ctx, d.Data)
	}, 1, tinymq.WithQueueName(n("delivered")), tinymq.WithBindingKey("delivered"), fence), "RegisterDeliveryHandler")
	must(t, m.RegisterQueue(ex, tinymq.Direct, plain.consume, 1, tinymq.WithQueueName(n("plain")),
		tinymq.WithBindingKey("plain"), tinymq.WithBindingKey("shared"), fence), "RegisterQueue plain")
	must(t, m.DeclareQueue(sub, ex, tinymq.Direct, tinymq.WithBindingKey("consumed"), fence), "DeclareQueue")
	_, err := tinymq.ConsumeHandler(m, sub, consumed.consume, 1)
	must(t, err, "ConsumeHandler")
	_, err = tinymq.ConsumeHandler(m, sub, func(context.Context, string) error { return nil }, 1)
	wantErr(t, err, tinymq.ErrPayloadType, "ConsumeHandler of another type on a queue that takes event")
	_, err = tinymq.ConsumeDeliveries(m, n("registered"), func(context.Context, tinymq.Delivery[string]) error { return nil }, 1)
	wantErr(t, err, tinymq.ErrPayloadType, "ConsumeDeliveries of another type on a queue that takes event")
	start(t, m)

	wrong := []struct {
		what string
		data any
	}{
		{"a slice", []string{"not", "an", "event"}},
		{"a pointer to an event", &event{Kind: "pointer"}},
		{"a map", map[string]any{"kind": "map"}},
		{"nil", nil},
	}
	for _, key := range []string{"registered", "delivered", "consumed", "shared"} {
		for _, w := range wrong {
			err := m.Publish(ex, w.data, tinymq.WithRoutingKey(key))
			wantErr(t, err, tinymq.ErrPayloadType, fmt.Sprintf("Publish of %s (%T) with key %q", w.what, w.data, key))
		}
	}
	// The check is per matching queue: an untyped queue alone takes
	// anything.
	must(t, m.Publish(ex, map[string]any{"kind": "untyped"}, tinymq.WithRoutingKey("plain")), "Publish of a map to the untyped queue alone")
	for _, key := range []string{"registered", "delivered", "consumed", "shared"} {
		publish(t, m, ex, event{Kind: key, N: 1}, tinymq.WithRoutingKey(key))
	}
	// An Encoded is taken, and decoded by the consumer: its bytes, not the
	// struct that holds them.
	must(t, m.Publish(ex, tinymq.Encoded{Body: []byte(`{"kind":"encoded","n":2}`)}, tinymq.WithRoutingKey("registered")),
		"Publish of an Encoded to a typed queue")
	publish(t, m, ex, event{Kind: "fence"}, tinymq.WithRoutingKey("fence"))

	for _, c := range []struct {
		q    typedQueue
		what string
		want []event
	}{
		{registered, "RegisterHandler's queue", []event{{Kind: "registered", N: 1}, {Kind: "shared", N: 1}, {Kind: "encoded", N: 2}}},
		{delivered, "RegisterDeliveryHandler's queue", []event{{Kind: "delivered", N: 1}}},
		{consumed, "ConsumeHandler's queue", []event{{Kind: "consumed", N: 1}}},
	} {
		if got := c.q.untilFence(t, c.what); !slices.Equal(got, c.want) {
			t.Fatalf("%s: got %+v, want %+v (refused publishes route nothing)", c.what, got, c.want)
		}
	}
	var got []string
	for _, msg := range plain.take(t, 3, "the untyped queue") {
		got = append(got, kindOf(t, msg))
	}
	equalSlices(t, got, []string{"untyped", "shared", "fence"},
		"the untyped queue: no copy of a publish that a typed queue refused (all or nothing)")

	// A typed queue behind a headers exchange, reached through an alternate
	// exchange, is checked too.
	front, hx := n("front"), n("headers")
	must(t, m.DeclareExchange(hx, tinymq.Headers), "DeclareExchange headers")
	must(t, m.DeclareExchange(front, tinymq.Direct, tinymq.WithAlternateExchange(hx)), "DeclareExchange front")
	behind := make(typedQueue, 16)
	must(t, tinymq.RegisterHandler(m, hx, tinymq.Headers, behind.consume, 1, tinymq.WithQueueName(n("behind")),
		tinymq.WithBindingArgs(map[string]any{"x-match": "any", "type": "order", "fence": "yes"})), "RegisterHandler headers")
	order := tinymq.WithHeaders(map[string]any{"type": "order"})
	wantErr(t, m.Publish(hx, "a string", order), tinymq.ErrPayloadType, "Publish of a string to the headers exchange")
	wantErr(t, m.Publish(front, "a string", order), tinymq.ErrPayloadType, "Publish of a string that the alternate exchange routes")
	wantErr(t, m.Publish(hx, "a string", tinymq.WithHeaders(map[string]any{"type": "other"})), tinymq.ErrNoRoute,
		"Publish of a string that no queue would take")
	publish(t, m, front, event{Kind: "order"}, order)
	publish(t, m, hx, event{Kind: "fence"}, tinymq.WithHeaders(map[string]any{"fence": "yes"}))
	if got := behind.untilFence(t, "the headers queue"); !slices.Equal(got, []event{{Kind: "order"}}) {
		t.Fatalf("the headers queue: got %+v, want only the order", got)
	}
}
