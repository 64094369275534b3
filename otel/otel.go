// Package tinymqotel traces TinyMQ messages with OpenTelemetry, from the
// publisher to every consumer that handles them, in one option:
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
//	mq := tinymq.New(tinymqotel.Instrument(tinymqotel.WithTracerProvider(tp)))
//
// [Instrument] wraps every publish of the MQ ([tinymq.MQ.Publish] and
// [tinymq.MQ.PublishContext]) in a producer span, whose W3C trace context
// (traceparent, tracestate) travels to the consumers in the message's
// headers: the message's creation context. It wraps every consumer call, of
// every form (RegisterQueue, RegisterHandler, RegisterDeliveryHandler,
// Consume, ConsumeHandler, ConsumeDeliveries) and on every engine, in a
// consumer span that links to that creation context and is, by default, its
// child. A retried delivery and the delivery of a dead letter each get a span
// for the hop that brought the message back ("retry", "dead_letter"), so that
// a trace shows every attempt and where the message died.
//
// # Conventions
//
// The spans follow OpenTelemetry's semantic conventions for messaging,
// semconv v1.43.0 (its schema URL is the tracer's): span names
// "{operation} {exchange}", kinds Producer and Consumer, messaging.system
// "tinymq", messaging.destination.name, messaging.destination.subscription.name
// (the queue), messaging.message.id, messaging.operation.name and .type,
// error.type on failure, and messaging.tinymq.* for what TinyMQ adds. The
// README lists every attribute.
//
// # Costs and guarantees
//
// Tracing never changes what happens to a message: a publish returns what it
// would return untraced, a consumer's outcome and panic go on unchanged, and a
// panic in the application's tracing code (a sampler, a span processor, the
// propagator) is reported to otel.Handle and never fails a publish or a
// delivery. It starts no goroutine of its own; span processors run on the
// publisher's and the worker's goroutine, so use a batching one.
//
// [Publisher] and [Consumer], which traced one call site at a time, are
// deprecated: use Instrument.
package tinymqotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq/internal/guard"
)

// ScopeName is the instrumentation scope of the spans: the import path of
// this package.
const ScopeName = "github.com/tinymq/tinymq/otel"

// Attribute keys of TinyMQ's own, beside the semantic conventions' ones. They
// live in the messaging.tinymq namespace, as the conventions require of a
// messaging system's own attributes.
const (
	// RoutingKeyKey is the message's routing key ([tinymq.WithRoutingKey]),
	// set only when it is not empty.
	RoutingKeyKey = attribute.Key("messaging.tinymq.destination.routing_key")
	// AttemptKey is the delivery attempt of a process or retry span: 1 for
	// the first, growing by one with each retry ([tinymq.Delivery.Attempt]).
	AttemptKey = attribute.Key("messaging.tinymq.message.attempt")
	// DeathCountKey is how many times the message had been dead-lettered
	// (the sum of its [tinymq.Death.Count]s), set only when it was.
	DeathCountKey = attribute.Key("messaging.tinymq.message.death.count")
	// DeathReasonKey is why it was last dead-lettered: rejected, expired or
	// maxlen ([tinymq.DeathReason]).
	DeathReasonKey = attribute.Key("messaging.tinymq.message.death.reason")
	// DeathQueueKey is the queue it was last dead-lettered from.
	DeathQueueKey = attribute.Key("messaging.tinymq.message.death.queue")
	// DeathAttemptsKey is how many times a consumer of that queue had been
	// handed it when it died ([tinymq.Death.Attempts]).
	DeathAttemptsKey = attribute.Key("messaging.tinymq.message.death.attempts")
)

// systemTinyMQ is messaging.system for every span.
var systemTinyMQ = semconv.MessagingSystemKey.String("tinymq")

// Option configures [Instrument] (and the deprecated [Publisher] and
// [Consumer]). A nil Option is ignored.
type Option interface {
	apply(*config)
}

type config struct {
	tp       trace.TracerProvider
	prop     propagation.TextMapPropagator
	linkOnly bool
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTracerProvider sets the provider of the tracer that starts the spans.
// Default (and for nil): the global one, otel.GetTracerProvider, which
// follows a later otel.SetTracerProvider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPropagator sets how the trace context is written into and read from
// the headers. Default (and for nil): propagation.TraceContext, the W3C
// traceparent and tracestate headers, whatever the global propagator is. Give
// otel.GetTextMapPropagator() to follow the global one, or a composite with
// propagation.Baggage to carry baggage too. The publishers and the consumers
// of a message need the same one.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// WithLinkOnly makes each delivery a trace of its own: its process span (and
// the retry or dead-letter span before it) links to the message's creation
// context, the publish span, without being its child. By default it is also
// the child, so that the publish and all its deliveries make one trace, as
// the conventions allow for a single message; a message delayed or retried
// over hours may be better off in traces of its own.
func WithLinkOnly() Option {
	return optionFunc(func(c *config) { c.linkOnly = true })
}

// tracing is what Instrument and the deprecated wrappers share: the tracer,
// the propagator and the choice of parent. It holds no state of a message and
// is safe for concurrent use.
type tracing struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	linkOnly bool
}

func newTracing(opts []Option) *tracing {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = propagation.TraceContext{}
	}
	return &tracing{
		tracer:   c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:     c.prop,
		linkOnly: c.linkOnly,
	}
}

// noSpan is the span a publish or a delivery has until a tracer started one:
// a no-op.
var noSpan = trace.SpanFromContext(context.Background())

// safely runs f, which calls code of the application's (a sampler, a span
// processor, a propagator, an error's methods), and reports a panic in it to
// otel's error handler instead of letting it fail a publish or a delivery.
// It returns false if f panicked.
func safely(what string, f func()) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			ok = false
			func() {
				defer func() { _ = recover() }() // the error handler is the application's too
				otel.Handle(fmt.Errorf("tinymqotel: %s panicked: %s", what, guard.ValueText(r)))
			}()
		}
	}()
	f()
	return true
}

// endWithError marks span as failed with err (never nil) and ends it. Each
// of err's methods that it calls (Error, ErrorType) may panic, as a typed
// nil's may: the span then still gets an error.type and a status, and ends.
func endWithError(span trace.Span, err error, opts ...trace.EventOption) {
	errType := semconv.ErrorTypeKey.String(fmt.Sprintf("%T", err))
	safely("reading the error's type", func() { errType = semconv.ErrorType(err) })
	text := guard.ErrorText(err)
	safely("recording the error", func() {
		span.SetAttributes(errType)
		span.SetStatus(codes.Error, text)
	})
	safely("recording the error", func() { span.RecordError(err, opts...) })
	safely("ending the span", func() { span.End() })
}
