// Package tinymqotel traces TinyMQ messages with OpenTelemetry, from the
// publisher to every consumer that handles them.
//
// A [Publisher] starts a producer span for each publish and carries its W3C
// trace context (traceparent, tracestate) to the consumers in the message's
// headers. [Consumer] wraps a consumer: it reads that context back and starts
// a consumer span for each delivery as a child of the publish span. Retries
// and dead letters keep the headers, so every attempt, and the consumer of the
// dead-letter queue, shows up under the publish that started it all.
//
//	tp := sdktrace.NewTracerProvider(...)
//	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
//	mq.RegisterQueue("orders", tinymq.Fanout,
//		tinymqotel.Consumer(handleOrder, tinymqotel.WithTracerProvider(tp)), 4)
//	err := pub.Publish(ctx, "orders", tinymqotel.Message{Data: order})
//
// The spans follow OpenTelemetry's semantic conventions for messaging
// (semconv v1.43.0); the README lists their attributes.
package tinymqotel

import (
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans: the import path of
// this package.
const ScopeName = "github.com/tinymq/tinymq/otel"

// Attribute keys of TinyMQ's own, beside the semantic conventions' ones.
const (
	// AttemptKey is the delivery attempt of a process span: 1 for the first,
	// growing by one with each retry ([tinymq.Msg.Attempt]).
	AttemptKey = attribute.Key("tinymq.message.attempt")
	// DeathCountKey is how many times the message had been dead-lettered
	// (len([tinymq.Msg.Deaths])), set only when it was.
	DeathCountKey = attribute.Key("tinymq.message.death.count")
	// DeathReasonKey is why it was last dead-lettered: rejected, expired or
	// maxlen ([tinymq.DeathReason]).
	DeathReasonKey = attribute.Key("tinymq.message.death.reason")
	// DeathQueueKey is the queue it was last dead-lettered from.
	DeathQueueKey = attribute.Key("tinymq.message.death.queue")
)

// systemTinyMQ is messaging.system for every span.
var systemTinyMQ = semconv.MessagingSystemKey.String("tinymq")

// Option configures a [Publisher] or a [Consumer]. A nil Option is ignored.
type Option interface {
	apply(*config)
}

type config struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
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
// propagation.Baggage to carry baggage too. A Publisher and the Consumers of
// its messages need the same one.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

func newConfig(opts []Option) config {
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
	return c
}

func (c config) tracer() trace.Tracer {
	return c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
}

// safely runs f, which calls code of the application's (a sampler, a span
// processor, a propagator, an error's Error method), and reports a panic in it
// to otel's error handler instead of letting it fail a publish or a delivery.
// It returns false if f panicked.
func safely(what string, f func()) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			ok = false
			func() {
				defer func() { _ = recover() }() // the error handler is the application's too
				otel.Handle(fmt.Errorf("tinymqotel: %s panicked: %v", what, r))
			}()
		}
	}()
	f()
	return true
}

// endWithError marks span as failed with err (never nil) and ends it. Reading
// err may panic (a typed nil whose Error dereferences it): the span then
// still ends, with a fixed description.
func endWithError(span trace.Span, err error, opts ...trace.EventOption) {
	ok := safely("reading the error", func() {
		span.SetAttributes(semconv.ErrorType(err))
		span.RecordError(err, opts...)
		span.SetStatus(codes.Error, err.Error())
	})
	if !ok {
		safely("setting the span status", func() {
			span.SetStatus(codes.Error, fmt.Sprintf("error of type %T whose Error method panicked", err))
		})
	}
	safely("ending the span", func() { span.End() })
}
