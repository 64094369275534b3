package tinymqotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
	tinymqotel "github.com/tinymq/tinymq/otel"
)

// quiet keeps the MQ's logger out of the test output.
var quiet = tinymq.WithLogger(slog.New(slog.DiscardHandler))

// instrumented returns an MQ traced into tp.
func instrumented(tp trace.TracerProvider, opts ...tinymqotel.Option) *tinymq.MQ {
	return tinymq.New(quiet, tinymqotel.Instrument(append([]tinymqotel.Option{tinymqotel.WithTracerProvider(tp)}, opts...)...))
}

// linkedTo reports whether s links to sc.
func linkedTo(s tracetest.SpanStub, sc trace.SpanContext) bool {
	for _, l := range s.Links {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

// A plain Publish is traced: a producer span, child of the span in the
// publish's context, with the message's ID once published, and its trace
// context in a new map of headers (the caller's is untouched).
func TestInstrumentPublishSpan(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp)
	got := make(chan *tinymq.Msg, 2)
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Topic, func(_ context.Context, m *tinymq.Msg) error {
		got <- m
		return nil
	}, 1, tinymq.WithQueueName("ship"), tinymq.WithBindingKey("eu.*")))
	require.NoError(t, mq.DeclareExchange("nowhere", tinymq.Direct))
	require.NoError(t, mq.DeclareExchange("once", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, mq.DeclareQueue("once-q", "once", tinymq.Fanout))
	require.NoError(t, mq.Start(t.Context()))

	ctx, request := tp.Tracer("app").Start(t.Context(), "handle request")
	mine := map[string]any{"tenant": "acme"}
	for range 2 {
		require.NoError(t, mq.PublishContext(ctx, "orders", "order", tinymq.WithRoutingKey("eu.new"), tinymq.WithHeaders(mine)))
	}
	errNoRoute := mq.PublishContext(ctx, "nowhere", 1, tinymq.WithRoutingKey("k"))
	require.ErrorIs(t, errNoRoute, tinymq.ErrNoRoute)
	for range 2 { // the second is a duplicate: published, not routed, no ID
		require.NoError(t, mq.PublishContext(ctx, "once", 1, tinymq.WithDeduplicationID("a")))
	}
	request.End()
	mq.Stop()

	publish := spansNamed(exp, "publish orders")
	require.Len(t, publish, 2)
	for i, ps := range publish {
		assert.Equal(t, trace.SpanKindProducer, ps.SpanKind)
		assert.Equal(t, request.SpanContext().SpanID(), ps.Parent.SpanID(), "child of the publisher's span")
		assert.Equal(t, tinymqotel.ScopeName, ps.InstrumentationScope.Name)
		assert.Equal(t, "https://opentelemetry.io/schemas/1.43.0", ps.InstrumentationScope.SchemaURL)
		assert.Empty(t, ps.Links, "no creation context of the caller's to link to")
		assert.Equal(t, map[attribute.Key]attribute.Value{
			"messaging.system":                         attribute.StringValue("tinymq"),
			"messaging.operation.type":                 attribute.StringValue("send"),
			"messaging.operation.name":                 attribute.StringValue("publish"),
			"messaging.destination.name":               attribute.StringValue("orders"),
			"messaging.tinymq.destination.routing_key": attribute.StringValue("eu.new"),
			"messaging.message.id":                     attribute.StringValue(fmt.Sprint(i + 1)),
		}, attrs(ps))
		assert.Equal(t, codes.Unset, ps.Status.Code)

		m := <-got
		assert.Equal(t, uint64(i+1), m.ID)
		assert.Equal(t, "acme", m.Headers["tenant"])
		assert.Equal(t, fmt.Sprintf("00-%s-%s-01", ps.SpanContext.TraceID(), ps.SpanContext.SpanID()), m.Headers["traceparent"],
			"the publish span's context travels in the headers")
	}
	assert.Equal(t, map[string]any{"tenant": "acme"}, mine, "the caller's map is untouched")

	failed := spansNamed(exp, "publish nowhere")
	require.Len(t, failed, 1)
	assert.Equal(t, codes.Error, failed[0].Status.Code)
	assert.Equal(t, errNoRoute.Error(), failed[0].Status.Description)
	assert.NotEmpty(t, attrs(failed[0])["error.type"].AsString())
	assert.NotContains(t, attrs(failed[0]), attribute.Key("messaging.message.id"), "a failed publish has no ID")

	once := spansNamed(exp, "publish once")
	require.Len(t, once, 2)
	assert.Equal(t, "1", attrs(once[0])["messaging.message.id"].AsString())
	assert.NotContains(t, attrs(once[1]), attribute.Key("messaging.message.id"), "a duplicate was given no ID")
}

// A consumer's process span links to the message's creation context (the
// publish span) and is its child; the span of the context given to Start is
// a second link, never the parent; the consumer's context holds the span.
func TestInstrumentProcessSpanLinksToCreationContext(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp)
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Topic, func(ctx context.Context, _ *tinymq.Msg) error {
		_, span := tp.Tracer("app").Start(ctx, "work")
		span.End()
		return nil
	}, 1, tinymq.WithQueueName("ship"), tinymq.WithBindingKey("#")))
	startCtx, main := tp.Tracer("app").Start(t.Context(), "main")
	require.NoError(t, mq.Start(startCtx))
	require.NoError(t, mq.Publish("orders", 1, tinymq.WithRoutingKey("eu.new")))
	require.NoError(t, mq.Publish("orders", 2)) // no headers of its own
	mq.Stop()
	main.End()

	publish := spansNamed(exp, "publish orders")
	require.Len(t, publish, 2)
	process := spansNamed(exp, "process orders")
	require.Len(t, process, 2)
	work := spansNamed(exp, "work")
	require.Len(t, work, 2)
	for i, s := range process {
		ps := publish[i]
		assert.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		require.Len(t, s.Links, 2)
		assert.Equal(t, ps.SpanContext.SpanID(), s.Links[0].SpanContext.SpanID(), "links to the creation context")
		assert.Equal(t, ps.SpanContext.TraceID(), s.Links[0].SpanContext.TraceID())
		assert.True(t, linkedTo(s, main.SpanContext()), "and to the ambient span")
		assert.Equal(t, ps.SpanContext.SpanID(), s.Parent.SpanID(), "a child of the publish span")
		assert.Equal(t, ps.SpanContext.TraceID(), s.SpanContext.TraceID())
		assert.True(t, s.Parent.IsRemote())
		assert.Equal(t, s.SpanContext.SpanID(), work[i].Parent.SpanID(), "the consumer's ctx holds its span")
		want := map[attribute.Key]attribute.Value{
			"messaging.system":                        attribute.StringValue("tinymq"),
			"messaging.operation.type":                attribute.StringValue("process"),
			"messaging.operation.name":                attribute.StringValue("process"),
			"messaging.destination.name":              attribute.StringValue("orders"),
			"messaging.destination.subscription.name": attribute.StringValue("ship"),
			"messaging.message.id":                    attribute.StringValue(fmt.Sprint(i + 1)),
			"messaging.tinymq.message.attempt":        attribute.IntValue(1),
		}
		if i == 0 {
			want["messaging.tinymq.destination.routing_key"] = attribute.StringValue("eu.new")
		}
		assert.Equal(t, want, attrs(s))
	}
}

// WithLinkOnly makes each delivery a trace of its own, linked to the publish.
func TestInstrumentWithLinkOnly(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp, tinymqotel.WithLinkOnly())
	require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, ok, 1))
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ev", 1))
	mq.Stop()

	publish := spansNamed(exp, "publish ev")
	require.Len(t, publish, 1)
	process := spansNamed(exp, "process ev")
	require.Len(t, process, 1)
	assert.False(t, process[0].Parent.IsValid(), "a root")
	assert.NotEqual(t, publish[0].SpanContext.TraceID(), process[0].SpanContext.TraceID())
	assert.True(t, linkedTo(process[0], publish[0].SpanContext))
}

type order struct{ N int }

// Every consumer form is traced: the typed ones, which cannot be wrapped by
// hand, and the subscriptions of Consume and its kin.
func TestInstrumentTracesEveryConsumerForm(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp)
	got := make(chan string, 6)
	check := func(ctx context.Context, queue string) {
		if !trace.SpanFromContext(ctx).IsRecording() {
			queue += ": no span in ctx"
		}
		got <- queue
	}
	require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		check(ctx, "func")
		return nil
	}, 1, tinymq.WithQueueName("func")))
	require.NoError(t, tinymq.RegisterHandler(mq, "ev", tinymq.Fanout, func(ctx context.Context, _ order) error {
		check(ctx, "handler")
		return nil
	}, 1, tinymq.WithQueueName("handler")))
	require.NoError(t, tinymq.RegisterDeliveryHandler(mq, "ev", tinymq.Fanout, func(ctx context.Context, _ tinymq.Delivery[order]) error {
		check(ctx, "delivery")
		return nil
	}, 1, tinymq.WithQueueName("delivery")))
	for _, q := range []string{"sub", "subhandler", "subdelivery"} {
		require.NoError(t, mq.DeclareQueue(q, "ev", tinymq.Fanout))
	}
	_, err := mq.Consume("sub", func(ctx context.Context, _ *tinymq.Msg) error {
		check(ctx, "sub")
		return nil
	}, 1)
	require.NoError(t, err)
	_, err = tinymq.ConsumeHandler(mq, "subhandler", func(ctx context.Context, _ order) error {
		check(ctx, "subhandler")
		return nil
	}, 1)
	require.NoError(t, err)
	_, err = tinymq.ConsumeDeliveries(mq, "subdelivery", func(ctx context.Context, _ tinymq.Delivery[order]) error {
		check(ctx, "subdelivery")
		return nil
	}, 1)
	require.NoError(t, err)
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ev", order{1}))
	mq.Stop()

	forms := []string{"func", "handler", "delivery", "sub", "subhandler", "subdelivery"}
	var called []string
	for range forms {
		called = append(called, <-got)
	}
	assert.ElementsMatch(t, forms, called)
	publish := spansNamed(exp, "publish ev")
	require.Len(t, publish, 1)
	queues := map[string]bool{}
	for _, s := range spansNamed(exp, "process ev") {
		queues[attrs(s)["messaging.destination.subscription.name"].AsString()] = true
		assert.True(t, linkedTo(s, publish[0].SpanContext))
		assert.Equal(t, publish[0].SpanContext.SpanID(), s.Parent.SpanID())
	}
	assert.Len(t, queues, len(forms))
	for _, q := range forms {
		assert.True(t, queues[q], "queue %s is traced", q)
	}
}

// Each retry is a span "retry" between the attempt that failed and the one
// it led to: linked to the publish, the parent of the new attempt's process
// span, which links to the publish too.
func TestInstrumentRetrySpans(t *testing.T) {
	for _, linkOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("linkOnly=%t", linkOnly), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp, exp := newTracing(t)
				var opts []tinymqotel.Option
				if linkOnly {
					opts = append(opts, tinymqotel.WithLinkOnly())
				}
				mq := instrumented(tp, opts...)
				require.NoError(t, tinymq.RegisterDeliveryHandler(mq, "payments", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[int]) error {
					if d.Attempt < 3 {
						return errors.New("flaky")
					}
					return nil
				}, 1, tinymq.WithQueueName("charge"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})))
				require.NoError(t, mq.Start(t.Context()))
				require.NoError(t, mq.Publish("payments", 1))
				mq.Stop()

				publish := spansNamed(exp, "publish payments")
				require.Len(t, publish, 1)
				creation := publish[0].SpanContext
				process := spansNamed(exp, "process payments")
				require.Len(t, process, 3)
				retries := spansNamed(exp, "retry payments")
				require.Len(t, retries, 2, "one per retry")

				if linkOnly {
					assert.False(t, process[0].Parent.IsValid())
				} else {
					assert.Equal(t, creation.SpanID(), process[0].Parent.SpanID())
				}
				assert.Equal(t, codes.Error, process[0].Status.Code)
				for i, r := range retries {
					next := process[i+1]
					assert.Equal(t, trace.SpanKindInternal, r.SpanKind)
					assert.True(t, linkedTo(r, creation), "retry %d links to the creation context", i)
					if linkOnly {
						assert.False(t, r.Parent.IsValid(), "retry %d is a root", i)
					} else {
						assert.Equal(t, creation.SpanID(), r.Parent.SpanID(), "retry %d is a child of the publish", i)
					}
					assert.Equal(t, map[attribute.Key]attribute.Value{
						"messaging.system":                        attribute.StringValue("tinymq"),
						"messaging.operation.name":                attribute.StringValue("retry"),
						"messaging.destination.name":              attribute.StringValue("payments"),
						"messaging.destination.subscription.name": attribute.StringValue("charge"),
						"messaging.message.id":                    attribute.StringValue("1"),
						"messaging.tinymq.message.attempt":        attribute.IntValue(i + 2),
					}, attrs(r))
					assert.Equal(t, r.SpanContext.SpanID(), next.Parent.SpanID(), "attempt %d is the retry's child", i+2)
					assert.Equal(t, r.SpanContext.TraceID(), next.SpanContext.TraceID())
					assert.True(t, linkedTo(next, creation), "attempt %d links to the creation context", i+2)
					assert.Equal(t, int64(i+2), attrs(next)["messaging.tinymq.message.attempt"].AsInt64())
					assert.Equal(t, next.StartTime, r.EndTime, "the retry ends as its attempt begins")
					assert.Equal(t, time.Second<<i, next.StartTime.Sub(process[i].EndTime), "the backoff")
				}
				assert.Equal(t, codes.Unset, process[2].Status.Code)
			})
		})
	}
}

// The first delivery of a dead letter gets a span "dead_letter" from the
// time the message died to its delivery, saying why and where it died,
// linked to the publish and the parent of the dead letter's process span.
func TestInstrumentDeadLetterSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, exp := newTracing(t)
		mq := instrumented(tp)
		require.NoError(t, mq.RegisterQueue("payments", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return errors.New("declined")
		}, 1, tinymq.WithQueueName("charge"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second}),
			tinymq.WithDeadLetter("payments.dead", "dead")))
		deaths := make(chan tinymq.Death, 2)
		// One a second: the second dead letter waits a second in the queue.
		require.NoError(t, tinymq.RegisterDeliveryHandler(mq, "payments.dead", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[int]) error {
			deaths <- d.Deaths[0]
			return nil
		}, 1, tinymq.WithQueueName("charge-dead"), tinymq.WithRateLimit(1, 1)))
		require.NoError(t, mq.Start(t.Context()))
		require.NoError(t, mq.Publish("payments", 1))
		require.NoError(t, mq.Publish("payments", 2))
		mq.Stop()

		publish := spansNamed(exp, "publish payments")
		require.Len(t, publish, 2)
		require.Len(t, spansNamed(exp, "process payments"), 4)
		require.Len(t, spansNamed(exp, "retry payments"), 2)
		hops := spansNamed(exp, "dead_letter payments.dead")
		require.Len(t, hops, 2, "one per dead letter")
		dead := spansNamed(exp, "process payments.dead")
		require.Len(t, dead, 2)
		for i, hop := range hops {
			death := <-deaths
			creation := publish[i].SpanContext
			assert.Equal(t, trace.SpanKindInternal, hop.SpanKind)
			assert.True(t, linkedTo(hop, creation), "the hop links to the creation context")
			assert.Equal(t, creation.SpanID(), hop.Parent.SpanID())
			assert.Equal(t, map[attribute.Key]attribute.Value{
				"messaging.system":                         attribute.StringValue("tinymq"),
				"messaging.operation.name":                 attribute.StringValue("dead_letter"),
				"messaging.destination.name":               attribute.StringValue("payments.dead"),
				"messaging.destination.subscription.name":  attribute.StringValue("charge-dead"),
				"messaging.message.id":                     attribute.StringValue(fmt.Sprint(i + 1)),
				"messaging.tinymq.destination.routing_key": attribute.StringValue("dead"),
				"messaging.tinymq.message.death.count":     attribute.IntValue(1),
				"messaging.tinymq.message.death.reason":    attribute.StringValue("rejected"),
				"messaging.tinymq.message.death.queue":     attribute.StringValue("charge"),
				"messaging.tinymq.message.death.attempts":  attribute.IntValue(2),
			}, attrs(hop))
			assert.True(t, hop.StartTime.Equal(death.Time), "the hop begins when the message died")
			d := dead[i]
			assert.Equal(t, hop.EndTime, d.StartTime, "and ends when it is delivered")
			assert.Equal(t, hop.SpanContext.SpanID(), d.Parent.SpanID(), "the dead letter's process span is the hop's child")
			assert.True(t, linkedTo(d, creation))
			assert.Equal(t, "rejected", attrs(d)["messaging.tinymq.message.death.reason"].AsString())
		}
		assert.Equal(t, time.Duration(0), hops[0].EndTime.Sub(hops[0].StartTime))
		assert.Equal(t, time.Second, hops[1].EndTime.Sub(hops[1].StartTime), "the second waited for the rate limit")
	})
}

// A trace context the caller put in the headers is the creation context: it
// is not replaced, the publish span links to it, and the consumers continue
// it. One that is not valid is replaced.
func TestInstrumentKeepsTheCallersCreationContext(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp)
	got := make(chan map[string]any, 2)
	// A headers exchange still routes by the caller's headers.
	require.NoError(t, mq.RegisterQueue("events", tinymq.Headers, func(_ context.Context, m *tinymq.Msg) error {
		got <- m.Headers
		return nil
	}, 1, tinymq.WithBindingArgs(map[string]any{"x-match": "all", "kind": "user"})))
	require.NoError(t, mq.Start(t.Context()))

	upCtx, upstream := tp.Tracer("app").Start(t.Context(), "upstream")
	custom := propagation.MapCarrier{"kind": "user"}
	propagation.TraceContext{}.Inject(upCtx, custom)
	upstream.End()
	mine := map[string]any{}
	for k, v := range custom {
		mine[k] = v
	}
	require.NoError(t, mq.Publish("events", 1, tinymq.WithHeaders(mine)))
	stale := map[string]any{"kind": "user", "traceparent": "stale", "tracestate": "stale=1"}
	require.NoError(t, mq.Publish("events", 2, tinymq.WithHeaders(stale)))
	mq.Stop()

	publish := spansNamed(exp, "publish events")
	require.Len(t, publish, 2)
	assert.True(t, linkedTo(publish[0], upstream.SpanContext()), "the publish span links to the caller's creation context")
	assert.Equal(t, map[string]any{"kind": "user", "traceparent": custom["traceparent"]}, <-got, "kept as it was")
	h := <-got
	assert.Equal(t, map[string]any{"kind": "user", "traceparent": "stale", "tracestate": "stale=1"}, stale, "the caller's map is untouched")
	assert.Equal(t, "user", h["kind"])
	assert.NotContains(t, h, "tracestate", "a stale tracestate does not outlive its traceparent")
	assert.Equal(t, fmt.Sprintf("00-%s-%s-01", publish[1].SpanContext.TraceID(), publish[1].SpanContext.SpanID()), h["traceparent"])

	process := spansNamed(exp, "process events")
	require.Len(t, process, 2)
	assert.Equal(t, upstream.SpanContext().SpanID(), process[0].Parent.SpanID(), "the consumer continues the caller's context")
	assert.True(t, linkedTo(process[0], upstream.SpanContext()))
	assert.Equal(t, publish[1].SpanContext.SpanID(), process[1].Parent.SpanID())
}

// A consumer's panic is recorded on its span and goes on to the MQ, which
// counts a failed delivery; the worker goes on.
func TestInstrumentConsumerPanic(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp)
	boom := errors.New("boom")
	require.NoError(t, tinymq.RegisterHandler(mq, "ex", tinymq.Fanout, func(context.Context, int) error {
		panic(boom)
	}, 1, tinymq.WithQueueName("q")))
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ex", 1))
	require.NoError(t, mq.Publish("ex", 2))
	mq.Stop() // both delivered

	assert.Equal(t, uint64(2), mq.Stats().Queues["q"].Failed)
	process := spansNamed(exp, "process ex")
	require.Len(t, process, 2)
	for _, s := range process {
		assert.Equal(t, codes.Error, s.Status.Code)
		assert.Equal(t, "panic: boom", s.Status.Description)
		assert.Equal(t, "panic", attrs(s)["error.type"].AsString())
		require.Len(t, s.Events, 1)
		assert.Equal(t, "exception", s.Events[0].Name)
	}
}

// A panic below Instrument's publish middleware (in a later middleware) is
// recorded on the publish span and goes on, so the core fails the publish
// with a *tinymq.PanicError.
func TestInstrumentPublishPanicBelow(t *testing.T) {
	tp, exp := newTracing(t)
	mq := tinymq.New(quiet, tinymqotel.Instrument(tinymqotel.WithTracerProvider(tp)),
		tinymq.WithPublishMiddleware(func(tinymq.PublishFunc) tinymq.PublishFunc {
			return func(context.Context, *tinymq.Publishing) error { panic("below") }
		}))
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, ok, 1))
	err := mq.Publish("ex", 1)
	var pe *tinymq.PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "below", pe.Value)
	mq.Stop()
	spans := spansNamed(exp, "publish ex")
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Error, spans[0].Status.Code)
	assert.Equal(t, "panic", attrs(spans[0])["error.type"].AsString())
}

// hostileSampler panics when asked.
type hostileSampler struct{}

func (hostileSampler) ShouldSample(sdktrace.SamplingParameters) sdktrace.SamplingResult {
	panic("ShouldSample")
}
func (hostileSampler) Description() string { return "hostile" }

// fieldsPanic is a propagator whose Fields panics (Inject works).
type fieldsPanic struct{ propagation.TraceContext }

func (fieldsPanic) Fields() []string { panic("Fields") }

// Tracing code that panics (a sampler, a span processor, the propagator)
// fails no publish and no delivery, and crashes nothing.
func TestInstrumentHostileTracingCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []tinymqotel.Option
		// spans: the spans are still recorded (the propagator is not the
		// tracer's).
		spans bool
	}{
		{"span processor", []tinymqotel.Option{tinymqotel.WithTracerProvider(
			sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(hostile{})))}, false},
		{"sampler", []tinymqotel.Option{tinymqotel.WithTracerProvider(
			sdktrace.NewTracerProvider(sdktrace.WithSampler(hostileSampler{})))}, false},
		{"propagator", []tinymqotel.Option{tinymqotel.WithPropagator(hostilePropagator{})}, true},
		{"propagator fields", []tinymqotel.Option{tinymqotel.WithPropagator(fieldsPanic{})}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, exp := newTracing(t)
			mq := instrumented(tp, tc.opts...)
			before := reported.Load()
			require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, ok, 1, tinymq.WithQueueName("q")))
			require.NoError(t, tinymq.RegisterHandler(mq, "ex", tinymq.Fanout, func(context.Context, int) error { return nil },
				1, tinymq.WithQueueName("typed")))
			require.NoError(t, mq.Start(t.Context()))
			for i := range 3 {
				// Headers, so that publish and delivery both extract.
				require.NoError(t, mq.Publish("ex", i, tinymq.WithHeaders(map[string]any{"traceparent": "x"})), "publish %d", i)
			}
			mq.Stop() // every delivery settled
			for _, q := range []string{"q", "typed"} {
				st := mq.Stats().Queues[q]
				assert.Equal(t, uint64(3), st.Succeeded, q)
				assert.Zero(t, st.Failed, q)
			}
			assert.Greater(t, reported.Load(), before, "the panics were reported to otel.Handle")
			if tc.spans {
				assert.Len(t, spansNamed(exp, "publish ex"), 3)
				assert.Len(t, spansNamed(exp, "process ex"), 6)
			}
		})
	}
}

// With a composite propagator, baggage travels with the trace context to
// every consumer form.
func TestInstrumentBaggage(t *testing.T) {
	tp, _ := newTracing(t)
	mq := instrumented(tp, tinymqotel.WithPropagator(
		propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})))
	got := make(chan string, 1)
	require.NoError(t, tinymq.RegisterHandler(mq, "ex", tinymq.Fanout, func(ctx context.Context, _ int) error {
		got <- baggage.FromContext(ctx).Member("tenant").Value()
		return nil
	}, 1))
	require.NoError(t, mq.Start(t.Context()))
	member, err := baggage.NewMember("tenant", "acme")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	require.NoError(t, mq.PublishContext(baggage.ContextWithBaggage(t.Context(), bag), "ex", 1))
	mq.Stop()
	assert.Equal(t, "acme", <-got)
}

// Many publishers and consumers at once, under -race: every process span is
// the child of its own publish span, and links to it.
func TestInstrumentConcurrentTraces(t *testing.T) {
	tp, exp := newTracing(t)
	mq := instrumented(tp)
	require.NoError(t, tinymq.RegisterHandler(mq, "ex", tinymq.Fanout, func(context.Context, string) error { return nil }, 4))
	require.NoError(t, mq.Start(t.Context()))
	const publishers, each = 4, 50
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, mq.Publish("ex", fmt.Sprint(p, i)))
			}
		})
	}
	wg.Wait()
	mq.Stop()

	ids := map[trace.SpanID]string{}
	for _, s := range spansNamed(exp, "publish ex") {
		ids[s.SpanContext.SpanID()] = attrs(s)["messaging.message.id"].AsString()
	}
	require.Len(t, ids, publishers*each)
	process := spansNamed(exp, "process ex")
	require.Len(t, process, publishers*each)
	for _, s := range process {
		id, found := ids[s.Parent.SpanID()]
		require.True(t, found)
		assert.Equal(t, id, attrs(s)["messaging.message.id"].AsString(), "the same message")
		require.Len(t, s.Links, 1)
		assert.Equal(t, s.Parent.SpanID(), s.Links[0].SpanContext.SpanID())
		delete(ids, s.Parent.SpanID())
	}
}

// BenchmarkInstrument measures a traced publish and its delivery, spans
// recorded and dropped (no exporter).
func BenchmarkInstrument(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mq := instrumented(tp)
	done := make(chan struct{}, 1024)
	require.NoError(b, tinymq.RegisterHandler(mq, "ex", tinymq.Fanout, func(context.Context, int) error {
		done <- struct{}{}
		return nil
	}, 1))
	require.NoError(b, mq.Start(b.Context()))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := mq.Publish("ex", i); err != nil {
			b.Fatal(err)
		}
		<-done
	}
	b.StopTimer()
	mq.Stop()
}
