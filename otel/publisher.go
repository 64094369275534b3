package tinymqotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
)

// Message is what [Publisher.Publish] sends: the payload, and the routing key
// and headers that the core would take as [tinymq.WithRoutingKey] and
// [tinymq.WithHeaders].
//
// Deprecated: use [Instrument] and [tinymq.MQ.PublishContext], whose publish
// middleware reads the routing key and headers of the publish options.
type Message struct {
	// Data is the payload, as given to [tinymq.MQ.Publish].
	Data any
	// RoutingKey is the routing key, or "" for none.
	RoutingKey string
	// Headers are the message's own headers, or nil. Publish never modifies
	// the map: the consumers get a copy with the trace context added (or this
	// very map, when there is no trace context to add).
	Headers map[string]any
}

// Publisher publishes to an MQ with a producer span per message, and the
// span's trace context in the message's headers, from which [Consumer]
// continues the trace. Create it with [NewPublisher]; it is safe for
// concurrent use.
//
// Deprecated: use [Instrument], which traces every publish of the MQ (a plain
// [tinymq.MQ.Publish] too) and records the message's ID. Do not use both:
// each would start a publish span.
type Publisher struct {
	mq *tinymq.MQ
	t  *tracing
}

// NewPublisher returns a Publisher for mq. Its tracer comes from the
// [WithTracerProvider] option (default: the global provider) and the header
// format from [WithPropagator] (default: W3C trace context). It does not
// block.
//
// Deprecated: use [Instrument].
func NewPublisher(mq *tinymq.MQ, opts ...Option) *Publisher {
	return &Publisher{mq: mq, t: newTracing(opts)}
}

// Publish publishes m to exchange as [tinymq.MQ.PublishContext] does, inside
// a span "publish <exchange>" of kind Producer that is the parent of every
// consumer span of the message. It writes the span's trace context
// (traceparent, tracestate) into a copy of m.Headers; the headers of the
// propagator's format already in m.Headers (a traceparent, a tracestate) are
// left out of the copy.
//
// opts take the other publish options, such as [tinymq.WithDelay]. They are
// applied after m's routing key and headers, so a [tinymq.WithRoutingKey] or
// [tinymq.WithHeaders] in opts replaces m's, and the latter also drops the
// trace context: consumers then start traces of their own. Give the routing
// key and headers in m.
//
// It returns what PublishContext returns, and marks the span as failed when
// that is an error. It blocks only as PublishContext does (for a full queue
// with a Block limit, until ctx ends); after Stop it returns
// [tinymq.ErrStopped]. A panic in the application's tracing code (a sampler, a
// span processor, the propagator) is reported to otel.Handle and never keeps
// the message from being published. A nil context, or a Publisher made with a
// nil MQ, is refused with an error wrapping [tinymq.ErrInvalidOption].
//
// Deprecated: use [Instrument] and [tinymq.MQ.PublishContext].
func (p *Publisher) Publish(ctx context.Context, exchange string, m Message, opts ...tinymq.PublishOption) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", tinymq.ErrInvalidOption)
	}
	if p.mq == nil {
		return fmt.Errorf("%w: tinymqotel: Publisher with a nil MQ", tinymq.ErrInvalidOption)
	}
	span, spanCtx := noSpan, ctx
	safely("starting the publish span", func() {
		spanCtx, span = p.t.tracer.Start(ctx, spanName("publish", exchange),
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(publishAttributes(exchange, m.RoutingKey)...))
	})
	headers := m.Headers
	safely("injecting the trace context", func() { headers = p.t.inject(spanCtx, headers) })

	all := make([]tinymq.PublishOption, 0, len(opts)+2)
	if m.RoutingKey != "" {
		all = append(all, tinymq.WithRoutingKey(m.RoutingKey))
	}
	if headers != nil {
		all = append(all, tinymq.WithHeaders(headers))
	}
	err := p.mq.PublishContext(spanCtx, exchange, m.Data, append(all, opts...)...)
	if err != nil {
		endWithError(span, err)
		return err
	}
	safely("ending the publish span", func() { span.End() })
	return nil
}
