package tinymqotel

import (
	"context"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
)

// Instrument returns the option that traces an MQ: tinymq.New(Instrument()).
// It adds a [tinymq.PublishMiddleware] and a [tinymq.Middleware] (in that
// order, after those of the options before it), so every publish and every
// consumer call registered after New is traced, of every consumer form and
// on every engine:
//
//   - A publish runs inside a span "publish <exchange>" of kind Producer, a
//     child of the span in the publish's context. Its trace context is the
//     message's creation context: it is written into a new map of headers
//     (the caller's headers, less the propagator's own fields, plus the
//     trace context); the caller's map is never modified. If the headers
//     already carry a valid trace context (a creation context of the
//     caller's), they are passed on as they are and the publish span links
//     to it, as the conventions ask. Once the publish succeeded, the span
//     records the message's ID; a failed publish marks it failed.
//   - A consumer call runs inside a span "process <exchange>" of kind
//     Consumer, which links to the creation context read from the headers
//     and, unless [WithLinkOnly], is its child; the span in the consumer's
//     context (the one given to [tinymq.MQ.Start], or an outer
//     middleware's) is never the parent, only a second link. A message
//     without a creation context starts a trace of its own. The consumer gets
//     a context holding the span (and the baggage the propagator read).
//   - A retried delivery (Attempt > 1) gets a span "retry <exchange>" just
//     before its process span, and the first delivery of a dead letter a span
//     "dead_letter <exchange>" from the time it died ([tinymq.Death.Time]) to
//     its delivery: both link to the creation context, and the process span
//     is their child, so the hop shows between the attempt that failed and
//     the one it led to.
//
// An error or a panic of the consumer marks its span failed and goes on
// unchanged (a panic with its value, so the MQ counts a failed delivery). A
// panic in the tracing code (a sampler, a span processor, the propagator,
// an error's Error method) is reported to otel.Handle and fails neither the
// publish nor the delivery. Instrument starts no goroutine; span processors
// run on the publisher's and the worker's goroutines when a span ends.
//
// Do not combine it with the deprecated [Publisher] or [Consumer]: each would
// add its spans to the MQ's.
func Instrument(opts ...Option) tinymq.Option {
	t := newTracing(opts)
	return tinymq.Options(
		tinymq.WithPublishMiddleware(t.publishMiddleware),
		tinymq.WithMiddleware(t.deliveryMiddleware),
	)
}

// publishMiddleware is Instrument's PublishMiddleware.
func (t *tracing) publishMiddleware(next tinymq.PublishFunc) tinymq.PublishFunc {
	return func(ctx context.Context, p *tinymq.Publishing) error { return t.publish(ctx, p, next) }
}

// deliveryMiddleware is Instrument's Middleware.
func (t *tracing) deliveryMiddleware(next tinymq.DeliveryFunc) tinymq.DeliveryFunc {
	return func(ctx context.Context, d tinymq.Delivery[any]) error {
		return t.deliver(ctx, &d, true, func(ctx context.Context) error { return next(ctx, d) })
	}
}

// publish runs next for p inside a publish span.
func (t *tracing) publish(ctx context.Context, p *tinymq.Publishing, next tinymq.PublishFunc) error {
	var custom trace.SpanContext // the caller's own creation context, if any
	if len(p.Headers) > 0 {
		safely("extracting the trace context", func() {
			custom = trace.SpanContextFromContext(t.prop.Extract(context.Background(), headerCarrier(p.Headers)))
		})
	}
	span, spanCtx := noSpan, ctx
	safely("starting the publish span", func() {
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(publishAttributes(p.Exchange, p.RoutingKey)...),
		}
		if custom.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: custom}))
		}
		spanCtx, span = t.tracer.Start(ctx, spanName("publish", p.Exchange), opts...)
	})
	if !custom.IsValid() {
		safely("injecting the trace context", func() { p.Headers = t.inject(spanCtx, p.Headers) })
	}

	err := callTraced(span, func() error { return next(spanCtx, p) })
	if err != nil {
		endWithError(span, err)
		return err
	}
	safely("ending the publish span", func() {
		if p.ID != 0 { // 0: on an engine, or a duplicate that was not routed again
			span.SetAttributes(semconv.MessagingMessageID(strconv.FormatUint(p.ID, 10)))
		}
		span.End()
	})
	return nil
}

// inject returns headers with ctx's trace context: a new map, holding
// headers less the propagator's fields (so that a stale tracestate cannot
// outlive the traceparent replacing it) and the fields it wrote; or headers
// itself when there is nothing to write. headers is only read.
func (t *tracing) inject(ctx context.Context, headers map[string]any) map[string]any {
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return headers
	}
	fields := t.prop.Fields()
	merged := make(map[string]any, len(headers)+len(carrier))
	for k, v := range headers {
		if !slices.Contains(fields, k) {
			merged[k] = v
		}
	}
	for k, v := range carrier {
		merged[k] = v
	}
	return merged
}

// callTraced calls f, the next function of a chain (the application's code),
// and returns its error. If f panics, the panic is recorded on span, which
// ends, and goes on with the same value; if f calls runtime.Goexit, span ends
// failed and the Goexit goes on.
func callTraced(span trace.Span, f func() error) error {
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
	err := f()
	returned = true
	return err
}

// spanName is the conventions' "{operation} {destination}", or the
// operation alone for an empty destination.
func spanName(operation, exchange string) string {
	if exchange == "" {
		return operation
	}
	return operation + " " + exchange
}

func publishAttributes(exchange, key string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		systemTinyMQ,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(exchange),
	}
	if key != "" {
		attrs = append(attrs, RoutingKeyKey.String(key))
	}
	return attrs
}
