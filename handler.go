package tinymq

import (
	"context"
	"fmt"
	"reflect"
)

// Handler adapts a function of one payload type into a ConsumerFunc, so that
// a queue of UserCreated events can be consumed by
// func(ctx context.Context, e UserCreated) error. A message whose Data is an
// [Encoded] (a durable queue, a broker) is decoded into a T with its codec, so
// the function gets the same T on every engine, before and after a restart.
// A nil Data is the zero T when T is an interface type. A message whose Data
// is not a T otherwise fails with a [Permanent] error wrapping [ErrPayloadType], so it is
// dead-lettered without retries. Handler(nil) returns nil, which
// RegisterQueue refuses.
//
// A ConsumerFunc receives a *Msg of its own, allocated for each delivery. To
// consume without that allocation, register the function with
// [RegisterHandler] instead.
func Handler[T any](fn func(ctx context.Context, v T) error) ConsumerFunc {
	if fn == nil {
		return nil
	}
	nilOK := reflect.TypeFor[T]().Kind() == reflect.Interface
	return func(ctx context.Context, msg *Msg) error {
		v, err := payloadAs[T](msg.Data, nilOK)
		if err != nil {
			return err
		}
		return fn(ctx, v)
	}
}

// payloadAs returns data as a T, decoding an [Encoded]; nilOK says whether a
// nil data is the zero T (T is an interface type).
func payloadAs[T any](data any, nilOK bool) (T, error) {
	if v, ok := data.(T); ok {
		return v, nil
	}
	return decodeAs[T](data, nilOK)
}

// decodeAs is payloadAs for a data that is not a T, apart so that the
// common case allocates nothing.
func decodeAs[T any](data any, nilOK bool) (T, error) {
	var v T
	switch d := data.(type) {
	case Encoded:
		if err := d.Decode(&v); err != nil {
			return v, Permanent(fmt.Errorf("%w, want %v", err, reflect.TypeFor[T]()))
		}
		return v, nil
	case nil:
		if nilOK {
			return v, nil
		}
		return v, Permanent(fmt.Errorf("%w: got nil, want %v", ErrPayloadType, reflect.TypeFor[T]()))
	default:
		return v, Permanent(fmt.Errorf("%w: got %T, want %v", ErrPayloadType, data, reflect.TypeFor[T]()))
	}
}

// RegisterHandler is [MQ.RegisterQueue] for a consumer of one payload type,
// which never sees a [Msg]: a delivery whose Data is already a T allocates
// nothing, where a [ConsumerFunc] gets a newly allocated *Msg every time.
// The payload rules are [Handler]'s: an [Encoded] Data is decoded into a T, and
// Data of another type fails the message with a [Permanent] error wrapping
// [ErrPayloadType]. Retries, dead-lettering, panics and the context work as
// for a ConsumerFunc. It is a function, not a method, because Go methods take
// no type parameters; it blocks, and behaves after Stop, as RegisterQueue
// does. A nil fn is [ErrNilConsumer].
func RegisterHandler[T any](m *MQ, exchange string, kind ExchangeType, fn func(ctx context.Context, v T) error, concurrency int, opts ...QueueOption) error {
	if fn == nil {
		return ErrNilConsumer
	}
	return RegisterDeliveryHandler(m, exchange, kind, func(ctx context.Context, d Delivery[T]) error {
		return fn(ctx, d.Data)
	}, concurrency, opts...)
}

// RegisterDeliveryHandler is [RegisterHandler] for a consumer that needs the
// message's metadata (its ID, routing key, headers, attempt, deaths) as well
// as its payload: it receives a [Delivery] by value, and a delivery whose Data
// is already a T allocates nothing. A nil fn is [ErrNilConsumer].
func RegisterDeliveryHandler[T any](m *MQ, exchange string, kind ExchangeType, fn func(ctx context.Context, d Delivery[T]) error, concurrency int, opts ...QueueOption) error {
	if m == nil {
		return fmt.Errorf("%w: nil MQ", ErrInvalidOption)
	}
	if fn == nil {
		return ErrNilConsumer
	}
	return m.register(exchange, kind, deliveryConsumer(fn), concurrency, opts)
}

// deliveryConsumer is the consumer of a function of Deliveries of T: direct,
// and a ConsumerFunc for engines.
func deliveryConsumer[T any](fn func(ctx context.Context, d Delivery[T]) error) consumer {
	nilOK := reflect.TypeFor[T]().Kind() == reflect.Interface
	direct := func(ctx context.Context, d Delivery[any]) error {
		v, err := payloadAs[T](d.Data, nilOK)
		if err != nil {
			return err
		}
		return fn(ctx, Delivery[T]{ID: d.ID, Exchange: d.Exchange, Queue: d.Queue, RoutingKey: d.RoutingKey,
			Headers: d.Headers, Data: v, Attempt: d.Attempt, Deaths: d.Deaths, Redelivered: d.Redelivered})
	}
	// On an engine the queue is consumed through a ConsumerFunc.
	asMsg := func(ctx context.Context, msg *Msg) error { return direct(ctx, msg.delivery()) }
	return consumer{fn: asMsg, direct: direct}
}
