package tinymq

import (
	"context"
	"fmt"
	"runtime/debug"
)

// DeliveryFunc is one consumer call as a [Middleware] sees it: the message's
// metadata and Data (as the queue holds it: the published value, or an
// [Encoded] on a durable queue or an engine), the call's context, and the
// outcome it returns.
type DeliveryFunc func(ctx context.Context, d Delivery[any]) error

// Middleware wraps every consumer call of an MQ ([WithMiddleware]): it gets
// the next function in the chain (the consumer itself, last) and returns the
// function the MQ calls instead. A middleware may read d, add values to the
// context it passes on (a trace span), call next or not, and return a
// different outcome; the MQ acts on what the outermost returns (nil
// acknowledges; an error retries or dead-letters). It runs on the worker's
// goroutine as part of the consumer call, so it is guarded as a consumer is
// (a panic or a Goexit fails that delivery alone) and [WithDeliveryTimeout]
// counts its time. What it changes in d before calling next reaches a typed
// consumer ([RegisterHandler] and its kin, whose Data must stay a T) but not a
// [ConsumerFunc], which receives the message's *Msg as it is.
type Middleware func(next DeliveryFunc) DeliveryFunc

// WithMiddleware wraps every consumer of the MQ, of every queue and every
// form (RegisterQueue, RegisterHandler, RegisterDeliveryHandler, Consume,
// ConsumeHandler, ConsumeDeliveries, on the in-memory engine and on an
// [Engine]), in mw: the first is the outermost. Several WithMiddleware
// options add up, in order. It applies to consumers registered after New;
// nil middlewares are skipped. Without it a consumer call costs nothing more.
func WithMiddleware(mw ...Middleware) Option {
	return optionFunc(func(m *MQ) {
		for _, f := range mw {
			if f != nil {
				m.middleware = append(m.middleware, f)
			}
		}
	})
}

// PublishFunc is one publish as a [PublishMiddleware] sees it. p is the
// publish, its options applied and checked; a middleware may change its
// RoutingKey, Headers (a new map: the caller's may be shared) and Data
// before it calls next, and next checks them again. Once next returned nil,
// p.ID is the message's ID (see Publishing.ID).
type PublishFunc func(ctx context.Context, p *Publishing) error

// PublishMiddleware wraps every [MQ.Publish] and [MQ.PublishContext] of an MQ
// ([WithPublishMiddleware]), as [Middleware] wraps consumer calls: it sees
// the exchange, routing key, headers and data, may add headers (a trace
// context) and sees the outcome, the error Publish returns. It runs on the
// publisher's goroutine, before the message is routed; a panic in it fails
// that publish with a [*PanicError]. A middleware that does not call next
// decides the outcome itself: a nil it returns without calling next is a
// publish that routed nothing.
type PublishMiddleware func(next PublishFunc) PublishFunc

// WithPublishMiddleware wraps every publish of the MQ in mw, the first
// outermost; several options add up, in order, and nil ones are skipped.
// Dead letters and retries are the MQ's own moves, not publishes: a
// [Middleware] sees them when they are delivered (Delivery.Attempt,
// Delivery.Deaths). Without it a publish costs nothing more.
func WithPublishMiddleware(mw ...PublishMiddleware) Option {
	return optionFunc(func(m *MQ) {
		for _, f := range mw {
			if f != nil {
				m.pubMiddleware = append(m.pubMiddleware, f)
			}
		}
	})
}

// Options combines opts into one Option, applied in order (nil ones
// skipped): for an integration that configures several things at once, such
// as a middleware, a publish middleware and a [WithSetup].
func Options(opts ...Option) Option {
	return optionFunc(func(m *MQ) {
		for _, o := range opts {
			if o != nil {
				o.applyMQ(m)
			}
		}
	})
}

// WithSetup has New call fn with the new MQ once every option is applied,
// before New returns (fn runs on New's goroutine, and may declare queues or
// register a metrics collector over the MQ). Several run in order; a nil fn
// is skipped. A panic in fn is New's caller's, as the fn is.
func WithSetup(fn func(*MQ)) Option {
	return optionFunc(func(m *MQ) {
		if fn != nil {
			m.setup = append(m.setup, fn)
		}
	})
}

// wrapConsumer wraps c in the MQ's middleware, once, when it is registered.
func (m *MQ) wrapConsumer(c consumer) consumer {
	if len(m.middleware) == 0 {
		return c
	}
	c.data = nil // the middleware takes Deliveries
	var inner DeliveryFunc
	if c.direct != nil {
		inner = c.direct
	} else {
		fn := c.fn
		inner = func(ctx context.Context, d Delivery[any]) error { return fn(ctx, d.msg) }
	}
	for i := len(m.middleware) - 1; i >= 0; i-- {
		inner = m.middleware[i](inner)
		if inner == nil {
			return consumer{fn: func(context.Context, *Msg) error { return errNilMiddleware }, payload: c.payload}
		}
	}
	if c.direct != nil {
		c.direct = inner
		c.fn = func(ctx context.Context, msg *Msg) error { return inner(ctx, msg.delivery()) }
		return c
	}
	c.fn = func(ctx context.Context, msg *Msg) error {
		d := msg.delivery()
		d.msg = msg
		return inner(ctx, d)
	}
	return c
}

// errNilMiddleware fails every delivery of a consumer whose middleware
// returned a nil function.
var errNilMiddleware = Permanent(fmt.Errorf("%w: a Middleware returned a nil DeliveryFunc", ErrNilConsumer))

// publishChain builds the MQ's publish middleware around publishInner,
// once (init). A middleware that returns nil fails every publish.
func (m *MQ) publishChain() PublishFunc {
	next := PublishFunc(m.publishInner)
	for i := len(m.pubMiddleware) - 1; i >= 0; i-- {
		if next = m.pubMiddleware[i](next); next == nil {
			return func(context.Context, *Publishing) error {
				return fmt.Errorf("%w: a PublishMiddleware returned a nil PublishFunc", ErrInvalidOption)
			}
		}
	}
	return next
}

// publishThrough is PublishContext through the MQ's publish middleware; a
// panic in it fails the publish.
func (m *MQ) publishThrough(ctx context.Context, exchange string, data any, opts []PublishOption) (err error) {
	r := &records{data: data}
	if err := r.pc.apply(opts); err != nil {
		return err
	}
	pc := &r.pc
	p := &Publishing{Exchange: exchange, RoutingKey: pc.routingKey, Headers: pc.headers, Data: r.data,
		Expiration: pc.ttl, Delay: pc.delay, r: r}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return m.pubChain(ctx, p)
}

// publishInner is the end of the publish middleware's chain: the publish,
// with what the middleware changed checked again.
func (m *MQ) publishInner(ctx context.Context, p *Publishing) error {
	r := p.r
	if r == nil {
		return fmt.Errorf("%w: a PublishMiddleware passed on a Publishing of its own", ErrInvalidOption)
	}
	pc := &r.pc
	if p.RoutingKey != pc.routingKey {
		if len(p.RoutingKey) > maxKeyLen {
			return ErrKeyTooLong
		}
		pc.routingKey = p.RoutingKey
	}
	if p.Headers != nil {
		if err := validateTable(p.Headers, 0); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidHeaders, err)
		}
	}
	pc.headers = p.Headers
	if p.Expiration < 0 || p.Delay < 0 {
		return fmt.Errorf("%w: a negative duration", ErrInvalidOption)
	}
	pc.ttl, pc.delay = p.Expiration, p.Delay
	r.data = p.Data
	err := m.publishChecked(ctx, p.Exchange, r)
	if err == nil {
		p.ID = r.id
	}
	return err
}
