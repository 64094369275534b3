package tinymqotel

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
)

// Consumer returns a consumer that runs next inside a span "process
// <exchange>" of kind Consumer, one per delivery attempt. The span's parent is
// the trace context found in the message's headers, written there by
// [Publisher.Publish]: every attempt of a retried message, and the delivery of
// its dead letter, is a child of the span of the publish that sent it. A
// message without one starts a new trace (not a child of whatever span the
// context given to [tinymq.MQ.Start] carries). next gets a context with the
// span, and with the baggage the propagator read, if any.
//
// An error from next marks the span as failed and is returned unchanged. A
// panic in next is recorded on the span with its stack, and then goes on with
// the same value to TinyMQ, which counts a failed delivery. Consumer adds no
// blocking of its own, but ending a span runs the span processors on this
// goroutine: use a batching one. A panic in the application's tracing code is
// reported to otel.Handle and never fails the delivery. The headers are only
// read. Consumer(nil) returns nil, which RegisterQueue refuses. Once the MQ
// has stopped, the consumer is not called any more.
func Consumer(next tinymq.ConsumerFunc, opts ...Option) tinymq.ConsumerFunc {
	if next == nil {
		return nil
	}
	cfg := newConfig(opts)
	tracer := cfg.tracer()
	prop := cfg.prop
	return func(ctx context.Context, msg *tinymq.Msg) (err error) {
		if msg == nil {
			return next(ctx, msg)
		}
		span := trace.SpanFromContext(context.Background()) // no-op until Start succeeds
		spanCtx := ctx
		safely("starting the process span", func() {
			// The span in ctx, if any, is hidden: without a trace context in
			// the headers the span is a root.
			noSpan := trace.ContextWithSpanContext(ctx, trace.SpanContext{})
			parent := prop.Extract(noSpan, headerCarrier(msg.Headers))
			spanCtx, span = tracer.Start(parent, "process "+msg.Exchange,
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(processAttributes(msg)...))
		})

		returned := false
		defer func() {
			if returned {
				return
			}
			r := recover()
			if r == nil { // runtime.Goexit: let it go on
				endWithError(span, errGoexit)
				return
			}
			endWithError(span, panicError{r}, trace.WithStackTrace(true))
			panic(r)
		}()
		err = next(spanCtx, msg)
		returned = true
		if err != nil {
			endWithError(span, err)
			return err
		}
		safely("ending the process span", func() { span.End() })
		return nil
	}
}

var errGoexit = errors.New("tinymqotel: consumer called runtime.Goexit")

// panicError is what a process span records for a panic in the consumer.
type panicError struct{ value any }

func (p panicError) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// ErrorType names the error.type of a panic.
func (p panicError) ErrorType() string { return "panic" }

func processAttributes(msg *tinymq.Msg) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 11)
	attrs = append(attrs,
		systemTinyMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(msg.Exchange),
		semconv.MessagingDestinationSubscriptionName(msg.Queue),
		semconv.MessagingMessageID(strconv.FormatUint(msg.ID, 10)),
		AttemptKey.Int(msg.Attempt),
	)
	if msg.RoutingKey != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(msg.RoutingKey))
	}
	if len(msg.Deaths) > 0 {
		d := msg.Deaths[0]
		attrs = append(attrs,
			DeathCountKey.Int(len(msg.Deaths)),
			DeathReasonKey.String(string(d.Reason)),
			DeathQueueKey.String(d.Queue))
	}
	return attrs
}

// headerCarrier reads a trace context out of a message's headers. It never
// writes: the headers are shared by every queue's copy of the message.
type headerCarrier map[string]any

// Get returns the header as a string, if it is a string or a []byte.
func (h headerCarrier) Get(key string) string {
	switch v := h[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set does nothing: extraction never calls it.
func (h headerCarrier) Set(string, string) {}

// Keys returns the header names.
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
