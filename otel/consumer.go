package tinymqotel

import (
	"context"

	"github.com/tinymq/tinymq"
)

// Consumer returns a consumer that runs next inside a span "process
// <exchange>" of kind Consumer, one per delivery attempt, linked to the trace
// context found in the message's headers and, unless [WithLinkOnly], its
// child: every attempt of a retried message, and the delivery of its dead
// letter, is a child of the span of the publish that sent it. A message
// without one starts a new trace (the span in the consumer's context, from
// [tinymq.MQ.Start], is a link, not the parent). next gets a context with the
// span, and with the baggage the propagator read, if any. Unlike
// [Instrument], it records no retry or dead-letter span.
//
// An error from next marks the span as failed and is returned unchanged. A
// panic in next is recorded on the span with its stack, and then goes on with
// the same value to TinyMQ, which counts a failed delivery. A panic in the
// application's tracing code is reported to otel.Handle and never fails the
// delivery. The headers are only read. Consumer(nil) returns nil, which
// RegisterQueue refuses.
//
// Deprecated: use [Instrument], which traces every consumer of the MQ, of
// every form (a typed [tinymq.RegisterHandler] too), with the retry and
// dead-letter hops. Do not use both: each would start a process span.
func Consumer(next tinymq.ConsumerFunc, opts ...Option) tinymq.ConsumerFunc {
	if next == nil {
		return nil
	}
	t := newTracing(opts)
	return func(ctx context.Context, msg *tinymq.Msg) error {
		if msg == nil {
			return next(ctx, msg)
		}
		d := tinymq.Delivery[any]{ID: msg.ID, Exchange: msg.Exchange, Queue: msg.Queue, RoutingKey: msg.RoutingKey,
			Headers: msg.Headers, Attempt: msg.Attempt, Deaths: msg.Deaths}
		return t.deliver(ctx, &d, false, func(ctx context.Context) error { return next(ctx, msg) })
	}
}
