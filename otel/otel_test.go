package tinymqotel_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	tinymqotel "github.com/tinymq/tinymq/otel"
)

// reported counts the errors reported to otel.Handle: the panics of hostile
// tracing code.
var reported atomic.Int64

func TestMain(m *testing.M) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) { reported.Add(1) }))
	goleak.VerifyTestMain(m)
}

// newTracing returns a tracer provider that exports every ended span at once
// into the returned exporter.
func newTracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// spansNamed returns the spans with that name, in the order they ended.
func spansNamed(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func ok(context.Context, *tinymq.Msg) error { return nil }

func TestPublishToConsume(t *testing.T) {
	tp, exp := newTracing(t)
	mq := tinymq.New()
	got := make(chan *tinymq.Msg, 2)
	consumer := tinymqotel.Consumer(func(ctx context.Context, m *tinymq.Msg) error {
		assert.True(t, trace.SpanFromContext(ctx).IsRecording(), "the consumer's ctx has its span")
		got <- m
		return nil
	}, tinymqotel.WithTracerProvider(tp))
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Topic, consumer, 1,
		tinymq.WithQueueName("ship"), tinymq.WithBindingKey("eu.*")))
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Topic, consumer, 1,
		tinymq.WithQueueName("bill"), tinymq.WithBindingKey("#")))
	require.NoError(t, mq.Start(t.Context()))

	// The publisher's own span is the publish span's parent.
	ctx, parent := tp.Tracer("app").Start(t.Context(), "handle request")
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	require.NoError(t, pub.Publish(ctx, "orders", tinymqotel.Message{Data: "order 1", RoutingKey: "eu.new"}))
	parent.End()
	mq.Stop()

	publish := spansNamed(exp, "publish orders")
	require.Len(t, publish, 1)
	ps := publish[0]
	assert.Equal(t, trace.SpanKindProducer, ps.SpanKind)
	assert.Equal(t, parent.SpanContext().SpanID(), ps.Parent.SpanID())
	assert.Equal(t, tinymqotel.ScopeName, ps.InstrumentationScope.Name)
	assert.Equal(t, map[attribute.Key]attribute.Value{
		"messaging.system":                         attribute.StringValue("tinymq"),
		"messaging.operation.type":                 attribute.StringValue("send"),
		"messaging.operation.name":                 attribute.StringValue("publish"),
		"messaging.destination.name":               attribute.StringValue("orders"),
		"messaging.tinymq.destination.routing_key": attribute.StringValue("eu.new"),
	}, attrs(ps))
	assert.Equal(t, codes.Unset, ps.Status.Code)

	process := spansNamed(exp, "process orders")
	require.Len(t, process, 2)
	queues := map[string]bool{}
	for _, s := range process {
		assert.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		assert.Equal(t, ps.SpanContext.TraceID(), s.SpanContext.TraceID(), "same trace")
		assert.Equal(t, ps.SpanContext.SpanID(), s.Parent.SpanID(), "child of the publish span")
		assert.True(t, s.Parent.IsRemote())
		a := attrs(s)
		queues[a["messaging.destination.subscription.name"].AsString()] = true
		delete(a, "messaging.destination.subscription.name")
		assert.Equal(t, map[attribute.Key]attribute.Value{
			"messaging.system":                         attribute.StringValue("tinymq"),
			"messaging.operation.type":                 attribute.StringValue("process"),
			"messaging.operation.name":                 attribute.StringValue("process"),
			"messaging.destination.name":               attribute.StringValue("orders"),
			"messaging.message.id":                     attribute.StringValue("1"),
			"messaging.tinymq.destination.routing_key": attribute.StringValue("eu.new"),
			"messaging.tinymq.message.attempt":         attribute.IntValue(1),
		}, a)
		assert.Equal(t, codes.Unset, s.Status.Code)
	}
	assert.Equal(t, map[string]bool{"ship": true, "bill": true}, queues)

	m := <-got
	assert.Contains(t, m.Headers, "traceparent")
	assert.Equal(t, "eu.new", m.RoutingKey)
}

func TestHeadersAreMergedNotModified(t *testing.T) {
	tp, _ := newTracing(t)
	mq := tinymq.New()
	got := make(chan map[string]any, 1)
	// A headers exchange still routes by the caller's headers.
	require.NoError(t, mq.RegisterQueue("events", tinymq.Headers, tinymqotel.Consumer(func(_ context.Context, m *tinymq.Msg) error {
		got <- m.Headers
		return nil
	}, tinymqotel.WithTracerProvider(tp)), 1, tinymq.WithBindingArgs(map[string]any{"x-match": "all", "kind": "user"})))
	require.NoError(t, mq.Start(t.Context()))

	mine := map[string]any{"kind": "user", "traceparent": "stale", "tracestate": "stale=1"}
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	require.NoError(t, pub.Publish(t.Context(), "events", tinymqotel.Message{Data: 1, Headers: mine}))
	mq.Stop()

	assert.Equal(t, map[string]any{"kind": "user", "traceparent": "stale", "tracestate": "stale=1"}, mine,
		"the caller's map is untouched")
	h := <-got
	assert.Equal(t, "user", h["kind"])
	assert.NotContains(t, h, "tracestate", "a stale tracestate does not outlive its traceparent")
	assert.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, h["traceparent"])
}

func TestNoTraceContextNoHeaders(t *testing.T) {
	// With no recording span and no span in ctx there is no trace context
	// to inject: the message keeps its nil headers.
	mq := tinymq.New()
	got := make(chan map[string]any, 1)
	require.NoError(t, mq.RegisterQueue("events", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		got <- m.Headers
		return nil
	}, 1))
	require.NoError(t, mq.Start(t.Context()))
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(noop.NewTracerProvider()))
	require.NoError(t, pub.Publish(t.Context(), "events", tinymqotel.Message{Data: 1}))
	mq.Stop()
	assert.Nil(t, <-got)
}

// Each attempt of a retried message is a process span of its own, a child of
// the publish span, with its attempt number; the failed ones are errors.
func TestRetriesAreSpansOfTheirOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, exp := newTracing(t)
		mq := tinymq.New()
		errFlaky := errors.New("flaky")
		require.NoError(t, mq.RegisterQueue("payments", tinymq.Fanout, tinymqotel.Consumer(func(_ context.Context, m *tinymq.Msg) error {
			if m.Attempt < 3 {
				return errFlaky
			}
			return nil
		}, tinymqotel.WithTracerProvider(tp)), 1, tinymq.WithQueueName("charge"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})))
		require.NoError(t, mq.Start(t.Context()))
		pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
		require.NoError(t, pub.Publish(t.Context(), "payments", tinymqotel.Message{Data: 1}))
		mq.Stop()

		publish := spansNamed(exp, "publish payments")
		require.Len(t, publish, 1)
		process := spansNamed(exp, "process payments")
		require.Len(t, process, 3)
		for i, s := range process {
			assert.Equal(t, publish[0].SpanContext.SpanID(), s.Parent.SpanID(), "attempt %d", i+1)
			assert.Equal(t, int64(i+1), attrs(s)["messaging.tinymq.message.attempt"].AsInt64())
			if i < 2 {
				assert.Equal(t, codes.Error, s.Status.Code)
				assert.Equal(t, "flaky", s.Status.Description)
				assert.Equal(t, "*errors.errorString", attrs(s)["error.type"].AsString())
				require.Len(t, s.Events, 1)
				assert.Equal(t, "exception", s.Events[0].Name)
			} else {
				assert.Equal(t, codes.Unset, s.Status.Code)
				assert.Empty(t, s.Events)
			}
		}
		// The backoff shows between the attempts.
		assert.Equal(t, time.Second, process[1].StartTime.Sub(process[0].EndTime))
	})
}

// A dead letter keeps its headers: the dead-letter queue's consumer span is a
// child of the original publish span, and says why the message died.
func TestDeadLetterStaysInTheTrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, exp := newTracing(t)
		mq := tinymq.New()
		withTP := tinymqotel.WithTracerProvider(tp)
		require.NoError(t, mq.RegisterQueue("payments", tinymq.Fanout, tinymqotel.Consumer(func(context.Context, *tinymq.Msg) error {
			return errors.New("declined")
		}, withTP), 1, tinymq.WithQueueName("charge"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second}),
			tinymq.WithDeadLetter("payments.dead", "dead")))
		require.NoError(t, mq.RegisterQueue("payments.dead", tinymq.Fanout, tinymqotel.Consumer(ok, withTP), 1,
			tinymq.WithQueueName("charge-dead")))
		require.NoError(t, mq.Start(t.Context()))
		pub := tinymqotel.NewPublisher(mq, withTP)
		require.NoError(t, pub.Publish(t.Context(), "payments", tinymqotel.Message{Data: 1}))
		mq.Stop()

		publish := spansNamed(exp, "publish payments")
		require.Len(t, publish, 1)
		require.Len(t, spansNamed(exp, "process payments"), 2)
		dead := spansNamed(exp, "process payments.dead")
		require.Len(t, dead, 1)
		d := dead[0]
		assert.Equal(t, publish[0].SpanContext.TraceID(), d.SpanContext.TraceID())
		assert.Equal(t, publish[0].SpanContext.SpanID(), d.Parent.SpanID())
		a := attrs(d)
		assert.Equal(t, "payments.dead", a["messaging.destination.name"].AsString())
		assert.Equal(t, "charge-dead", a["messaging.destination.subscription.name"].AsString())
		assert.Equal(t, "dead", a["messaging.tinymq.destination.routing_key"].AsString())
		assert.Equal(t, int64(1), a["messaging.tinymq.message.attempt"].AsInt64())
		assert.Equal(t, int64(1), a["messaging.tinymq.message.death.count"].AsInt64())
		assert.Equal(t, "rejected", a["messaging.tinymq.message.death.reason"].AsString())
		assert.Equal(t, "charge", a["messaging.tinymq.message.death.queue"].AsString())
		assert.Equal(t, codes.Unset, d.Status.Code)
	})
}

func TestPublishErrorFailsTheSpan(t *testing.T) {
	tp, exp := newTracing(t)
	mq := tinymq.New()
	require.NoError(t, mq.DeclareExchange("nowhere", tinymq.Direct))
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	err := pub.Publish(t.Context(), "nowhere", tinymqotel.Message{Data: 1, RoutingKey: "k"})
	require.ErrorIs(t, err, tinymq.ErrNoRoute)
	mq.Stop()
	require.ErrorIs(t, pub.Publish(t.Context(), "nowhere", tinymqotel.Message{Data: 1}), tinymq.ErrStopped)

	spans := spansNamed(exp, "publish nowhere")
	require.Len(t, spans, 2)
	for _, s := range spans {
		assert.Equal(t, codes.Error, s.Status.Code)
		assert.NotEmpty(t, attrs(s)["error.type"].AsString())
	}
	assert.Equal(t, err.Error(), spans[0].Status.Description)
}

func TestPublishRefuses(t *testing.T) {
	tp, exp := newTracing(t)
	err := tinymqotel.NewPublisher(tinymq.New(), tinymqotel.WithTracerProvider(tp)).Publish(nilContext(), "x", tinymqotel.Message{})
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	err = tinymqotel.NewPublisher(nil, tinymqotel.WithTracerProvider(tp), nil).Publish(t.Context(), "x", tinymqotel.Message{})
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	assert.Empty(t, exp.GetSpans())
}

func nilContext() context.Context { return nil }

// Options in opts come after Message's: a WithHeaders there replaces the
// headers, trace context included, as documented.
func TestLaterWithHeadersReplaces(t *testing.T) {
	tp, _ := newTracing(t)
	mq := tinymq.New()
	got := make(chan *tinymq.Msg, 1)
	require.NoError(t, mq.RegisterQueue("events", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		got <- m
		return nil
	}, 1))
	require.NoError(t, mq.Start(t.Context()))
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	require.NoError(t, pub.Publish(t.Context(), "events", tinymqotel.Message{Data: 1, RoutingKey: "a", Headers: map[string]any{"a": 1}},
		tinymq.WithHeaders(map[string]any{"b": 2}), tinymq.WithRoutingKey("b"), tinymq.WithDelay(time.Millisecond)))
	mq.Stop()
	m := <-got
	assert.Equal(t, map[string]any{"b": 2}, m.Headers)
	assert.Equal(t, "b", m.RoutingKey)
}

// Without trace context in the headers a process span starts a new trace,
// even when the consumers' context (from Start) carries a span.
func TestUntracedMessageStartsATrace(t *testing.T) {
	tp, exp := newTracing(t)
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("events", tinymq.Fanout, tinymqotel.Consumer(ok, tinymqotel.WithTracerProvider(tp)), 1))
	startCtx, startSpan := tp.Tracer("app").Start(t.Context(), "main")
	require.NoError(t, mq.Start(startCtx))
	require.NoError(t, mq.Publish("events", 1))                                                       // no headers
	require.NoError(t, mq.Publish("events", 2, tinymq.WithHeaders(map[string]any{"traceparent": 7}))) // not a string
	mq.Stop()
	startSpan.End()

	process := spansNamed(exp, "process events")
	require.Len(t, process, 2)
	for _, s := range process {
		assert.False(t, s.Parent.IsValid(), "a root span")
		assert.NotEqual(t, startSpan.SpanContext().TraceID(), s.SpanContext.TraceID())
	}
}

func TestConsumerPanicIsRecordedAndGoesOn(t *testing.T) {
	tp, exp := newTracing(t)
	boom := errors.New("boom")
	consumer := tinymqotel.Consumer(func(context.Context, *tinymq.Msg) error { panic(boom) }, tinymqotel.WithTracerProvider(tp))
	assert.PanicsWithValue(t, boom, func() {
		_ = consumer(t.Context(), &tinymq.Msg{ID: 1, Exchange: "ex", Queue: "q", Attempt: 1})
	})
	spans := spansNamed(exp, "process ex")
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, codes.Error, s.Status.Code)
	assert.Equal(t, "panic: boom", s.Status.Description)
	assert.Equal(t, "panic", attrs(s)["error.type"].AsString())
	require.Len(t, s.Events, 1)
	var stack string
	for _, kv := range s.Events[0].Attributes {
		if kv.Key == "exception.stacktrace" {
			stack = kv.Value.AsString()
		}
	}
	assert.Contains(t, stack, "TestConsumerPanicIsRecordedAndGoesOn", "the stack reaches the panicking consumer")

	// Through TinyMQ: the delivery fails and the worker goes on.
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, consumer, 1, tinymq.WithQueueName("q")))
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ex", 1))
	require.NoError(t, mq.Publish("ex", 2))
	mq.Stop()
	assert.Equal(t, uint64(2), mq.Stats().Queues["q"].Failed)
	assert.Len(t, spansNamed(exp, "process ex"), 3)
}

// badError's Error panics, as a typed nil's may.
type badError struct{}

func (*badError) Error() string { panic("nil dereference") }

func TestConsumerErrorWhoseErrorPanics(t *testing.T) {
	tp, exp := newTracing(t)
	var bad *badError
	consumer := tinymqotel.Consumer(func(context.Context, *tinymq.Msg) error { return bad }, tinymqotel.WithTracerProvider(tp))
	err := consumer(t.Context(), &tinymq.Msg{Exchange: "ex"})
	assert.Equal(t, error(bad), err, "returned unchanged")
	spans := spansNamed(exp, "process ex")
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Error, spans[0].Status.Code)
	assert.Contains(t, spans[0].Status.Description, "*tinymqotel_test.badError")
}

func TestConsumerNil(t *testing.T) {
	assert.Nil(t, tinymqotel.Consumer(nil))
	called := false
	c := tinymqotel.Consumer(func(_ context.Context, m *tinymq.Msg) error {
		called = m == nil
		return nil
	}, tinymqotel.WithTracerProvider(noop.NewTracerProvider()))
	assert.NoError(t, c(t.Context(), nil))
	assert.True(t, called)
}

// hostile is a span processor, sampler and propagator that panic.
type hostile struct{ sdktrace.SpanProcessor }

func (hostile) OnStart(context.Context, sdktrace.ReadWriteSpan) { panic("OnStart") }
func (hostile) OnEnd(sdktrace.ReadOnlySpan)                     { panic("OnEnd") }

type hostilePropagator struct{ propagation.TraceContext }

func (hostilePropagator) Inject(context.Context, propagation.TextMapCarrier) { panic("Inject") }
func (hostilePropagator) Extract(context.Context, propagation.TextMapCarrier) context.Context {
	panic("Extract")
}

// Tracing code that panics never fails a publish or a delivery.
func TestHostileTracingCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []tinymqotel.Option
	}{
		{"span processor", []tinymqotel.Option{tinymqotel.WithTracerProvider(
			sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(hostile{})))}},
		{"propagator", []tinymqotel.Option{tinymqotel.WithPropagator(hostilePropagator{})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mq := tinymq.New()
			var calls sync.WaitGroup
			calls.Add(3)
			require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, tinymqotel.Consumer(func(context.Context, *tinymq.Msg) error {
				calls.Done()
				return nil
			}, tc.opts...), 1, tinymq.WithQueueName("q")))
			require.NoError(t, mq.Start(t.Context()))
			pub := tinymqotel.NewPublisher(mq, tc.opts...)
			for i := range 3 {
				require.NoError(t, pub.Publish(t.Context(), "ex", tinymqotel.Message{Data: i}))
			}
			mq.Stop()
			calls.Wait()
			assert.Equal(t, uint64(3), mq.Stats().Queues["q"].Succeeded)
		})
	}
}

// With a composite propagator, baggage travels with the trace context.
func TestBaggage(t *testing.T) {
	tp, _ := newTracing(t)
	prop := tinymqotel.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	mq := tinymq.New()
	got := make(chan string, 1)
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, tinymqotel.Consumer(func(ctx context.Context, _ *tinymq.Msg) error {
		got <- baggage.FromContext(ctx).Member("tenant").Value()
		return nil
	}, tinymqotel.WithTracerProvider(tp), prop), 1))
	require.NoError(t, mq.Start(t.Context()))
	member, err := baggage.NewMember("tenant", "acme")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp), prop)
	require.NoError(t, pub.Publish(baggage.ContextWithBaggage(t.Context(), bag), "ex", tinymqotel.Message{Data: 1}))
	mq.Stop()
	assert.Equal(t, "acme", <-got)
}

// Many publishers and consumers at once, under -race: every message's
// process span is the child of its own publish span.
func TestConcurrentTraces(t *testing.T) {
	tp, exp := newTracing(t)
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, tinymqotel.Consumer(ok, tinymqotel.WithTracerProvider(tp)), 4))
	require.NoError(t, mq.Start(t.Context()))
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	const publishers, each = 4, 50
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, pub.Publish(t.Context(), "ex", tinymqotel.Message{Data: fmt.Sprint(p, i)}))
			}
		})
	}
	wg.Wait()
	mq.Stop()

	parents := map[trace.SpanID]bool{}
	for _, s := range spansNamed(exp, "publish ex") {
		parents[s.SpanContext.SpanID()] = true
	}
	require.Len(t, parents, publishers*each)
	process := spansNamed(exp, "process ex")
	require.Len(t, process, publishers*each)
	for _, s := range process {
		assert.True(t, parents[s.Parent.SpanID()])
		delete(parents, s.Parent.SpanID())
	}
}

// A consumer that calls runtime.Goexit still ends its span, and the Goexit
// goes on.
func TestConsumerGoexit(t *testing.T) {
	tp, exp := newTracing(t)
	consumer := tinymqotel.Consumer(func(context.Context, *tinymq.Msg) error {
		runtime.Goexit()
		return nil
	}, tinymqotel.WithTracerProvider(tp))
	returned := make(chan bool, 1)
	go func() {
		defer func() { returned <- false }()
		_ = consumer(t.Context(), &tinymq.Msg{Exchange: "ex"})
		returned <- true
	}()
	select {
	case r := <-returned:
		assert.False(t, r, "the goroutine exited")
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer's goroutine did not end")
	}
	spans := spansNamed(exp, "process ex")
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Error, spans[0].Status.Code)
}
