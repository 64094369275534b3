package tinymqotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/guard"
)

// deliver runs call, the consumer of d, inside a process span, preceded by a
// retry or dead-letter span when hops is set and d is one (see Instrument).
// call gets the context holding the process span; its error is returned
// unchanged, and its panic goes on.
func (t *tracing) deliver(ctx context.Context, d *tinymq.Delivery[any], hops bool, call func(context.Context) error) error {
	span, spanCtx := noSpan, ctx
	safely("starting the process span", func() { spanCtx, span = t.startProcess(ctx, d, hops) })
	err := callTraced(span, func() error { return call(spanCtx) })
	if err != nil {
		endWithError(span, err)
		return err
	}
	safely("ending the process span", func() { span.End() })
	return nil
}

// startProcess starts d's process span (and ends its hop span, if any).
func (t *tracing) startProcess(ctx context.Context, d *tinymq.Delivery[any], hops bool) (context.Context, trace.Span) {
	// The span in ctx (Start's, or an outer middleware's) is ambient: a
	// link, never the parent.
	ambient := trace.SpanContextFromContext(ctx)
	parent := trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	var creation trace.SpanContext
	if len(d.Headers) > 0 {
		safely("extracting the trace context", func() {
			extracted := t.prop.Extract(parent, headerCarrier(d.Headers))
			creation, parent = trace.SpanContextFromContext(extracted), extracted
		})
	}
	if t.linkOnly {
		parent = trace.ContextWithSpanContext(parent, trace.SpanContext{}) // keeps the baggage
	}
	var toCreation []trace.Link
	if creation.IsValid() {
		toCreation = []trace.Link{{SpanContext: creation}}
	}
	now := time.Now()
	attrs := consumerAttributes(d)
	if hops {
		if name, start, hopAttrs, ok := hopOf(d, attrs, now); ok {
			safely("recording the "+name+" span", func() {
				hopCtx, hop := t.tracer.Start(parent, spanName(name, d.Exchange),
					trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(start),
					trace.WithLinks(toCreation...), trace.WithAttributes(hopAttrs...))
				hop.End(trace.WithTimestamp(now))
				parent = hopCtx
			})
		}
	}
	links := toCreation
	if ambient.IsValid() && !ambient.Equal(creation) {
		links = append(slices.Clip(links), trace.Link{SpanContext: ambient})
	}
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"), AttemptKey.Int(d.Attempt))
	attrs = append(attrs, deathAttributes(d.Deaths)...)
	return t.tracer.Start(parent, spanName("process", d.Exchange),
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(now),
		trace.WithLinks(links...), trace.WithAttributes(attrs...))
}

// hopOf says whether d came back by a hop that deserves a span: a retry
// (Attempt > 1), or the first delivery of a dead letter. It returns the hop's
// operation name, its start and its attributes (base and its own).
func hopOf(d *tinymq.Delivery[any], base []attribute.KeyValue, now time.Time) (name string, start time.Time, attrs []attribute.KeyValue, ok bool) {
	attrs = slices.Clip(base) // the hop's own: appends reallocate
	switch {
	case d.Attempt > 1:
		// When the attempt before failed is not in the Delivery: the span
		// marks the moment the retry was delivered.
		return "retry", now, append(attrs, semconv.MessagingOperationName("retry"), AttemptKey.Int(d.Attempt)), true
	case len(d.Deaths) > 0:
		start = now
		// Time is that of the first death of a Death counted more than
		// once: only a first one says when this hop began.
		if last := d.Deaths[0]; last.Count <= 1 && !last.Time.IsZero() && !last.Time.After(now) {
			start = last.Time
		}
		attrs = append(attrs, semconv.MessagingOperationName("dead_letter"))
		return "dead_letter", start, append(attrs, deathAttributes(d.Deaths)...), true
	}
	return "", time.Time{}, nil, false
}

// consumerAttributes are those of every consumer-side span of d.
func consumerAttributes(d *tinymq.Delivery[any]) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 14)
	attrs = append(attrs,
		systemTinyMQ,
		semconv.MessagingDestinationName(d.Exchange),
		semconv.MessagingDestinationSubscriptionName(d.Queue),
	)
	if d.ID != 0 { // 0: an engine's message without an ID of TinyMQ's
		attrs = append(attrs, semconv.MessagingMessageID(strconv.FormatUint(d.ID, 10)))
	}
	if d.RoutingKey != "" {
		attrs = append(attrs, RoutingKeyKey.String(d.RoutingKey))
	}
	return attrs
}

// deathAttributes describe the latest of deaths, or nothing for none.
func deathAttributes(deaths []tinymq.Death) []attribute.KeyValue {
	if len(deaths) == 0 {
		return nil
	}
	count := 0
	for _, d := range deaths {
		count += max(d.Count, 1)
	}
	last := deaths[0]
	return []attribute.KeyValue{
		DeathCountKey.Int(count),
		DeathReasonKey.String(string(last.Reason)),
		DeathQueueKey.String(last.Queue),
		DeathAttemptsKey.Int(last.Attempts),
	}
}

var errGoexit = errors.New("tinymqotel: runtime.Goexit called")

// panicError is what a span records for a panic in the code it wraps.
type panicError struct{ value any }

func (p panicError) Error() string { return fmt.Sprintf("panic: %s", guard.ValueText(p.value)) }

// ErrorType names the error.type of a panic.
func (p panicError) ErrorType() string { return "panic" }

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
