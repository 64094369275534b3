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
// A Handler is a ConsumerFunc like any other, so the queue it is registered
// with does not know T: Publish takes any data for it, and data that is not a
// T fails at delivery. [RegisterHandler] and [ConsumeHandler] tell the queue T,
// and Publish then refuses other data at once with ErrPayloadType.
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
// [ErrPayloadType]. Unlike a Handler, the queue knows T: from then on
// Publish refuses, with ErrPayloadType and for every queue it matches,
// Data that is neither a T (a value implementing T, or nil, when T is an
// interface type) nor an Encoded, on in-memory and durable queues alike (an
// int64 is not an int, a *T not a T, a map not a struct, a json.RawMessage
// not the struct it encodes: publish bytes that are already encoded as an
// Encoded with their codec, which the consumer decodes); T any takes
// everything, and on a durable queue gets an Encoded, as a ConsumerFunc does
// (the codec's bytes do not say what type was published). On a durable
// queue, or an engine, T goes through the codec: what JSON changes (invalid
// UTF-8 replaced, NaN and infinities refused at Publish) changes there, and a
// T that is an interface with methods, which JSON cannot decode into, is
// refused at registration with ErrPayloadType (with another [WithCodec] it is
// the codec's to decode). The queue keeps T for its life, and refuses a typed consumer
// of another type ([ConsumeHandler]) with ErrPayloadType. A consumer of
// Encoded on a durable queue takes everything, which the codec encodes. Retries, dead-lettering, panics and the context work as
// for a ConsumerFunc. It is a function, not a method, because Go methods take
// no type parameters; it blocks, and behaves after Stop, as RegisterQueue
// does. A nil fn is [ErrNilConsumer].
func RegisterHandler[T any](m *MQ, exchange string, kind ExchangeType, fn func(ctx context.Context, v T) error, concurrency int, opts ...QueueOption) error {
	if m == nil {
		return fmt.Errorf("%w: nil MQ", ErrInvalidOption)
	}
	if fn == nil {
		return ErrNilConsumer
	}
	return m.register(exchange, kind, payloadConsumer(fn), concurrency, opts)
}

// payloadConsumer is the consumer of a function of payloads of T: the
// deliveryConsumer of fn, which a shared entry's delivery calls through
// data, without a Delivery.
func payloadConsumer[T any](fn func(ctx context.Context, v T) error) consumer {
	c := deliveryConsumer(func(ctx context.Context, d Delivery[T]) error { return fn(ctx, d.Data) })
	nilOK := reflect.TypeFor[T]().Kind() == reflect.Interface
	c.data = func(ctx context.Context, data any) error {
		v, err := payloadAs[T](data, nilOK)
		if err != nil {
			return err
		}
		return fn(ctx, v)
	}
	return c
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
			Headers: d.Headers, Data: v, Attempt: d.Attempt, Deaths: d.Deaths, Redelivered: d.Redelivered, Group: d.Group})
	}
	// On an engine the queue is consumed through a ConsumerFunc.
	asMsg := func(ctx context.Context, msg *Msg) error { return direct(ctx, msg.delivery()) }
	c := consumer{fn: asMsg, direct: direct}
	if t := reflect.TypeFor[T](); t != reflect.TypeFor[any]() { // a consumer of any takes everything
		c.payload = t
	}
	return c
}

// Typed publish: a queue consumed by a typed consumer ([RegisterHandler],
// [RegisterDeliveryHandler], [ConsumeHandler], [ConsumeDeliveries]) knows
// its payload type, and Publish refuses, with ErrPayloadType, data that its
// consumer could never take, rather than accept it and dead-letter it at
// delivery.

// payloadFits reports whether data can reach a typed consumer of t: it is a
// t (or implements t, an interface type), it is nil and t an interface
// type, or it is an [Encoded], which the consumer decodes. The rule is the
// same for in-memory and durable queues, although a durable queue's codec
// would turn some other values (an int64 for an int) into a t: what a queue
// accepts does not depend on where it keeps its messages.
func payloadFits(t reflect.Type, data any) bool {
	if data == nil {
		return t.Kind() == reflect.Interface
	}
	dt := reflect.TypeOf(data)
	if dt == t || (t.Kind() == reflect.Interface && dt.Implements(t)) {
		return true
	}
	_, ok := data.(Encoded)
	return ok
}

var encodedType = reflect.TypeFor[Encoded]()

// checkPayloads returns an error wrapping ErrPayloadType when some typed
// queue of dst could not take data. The caller holds the read lock.
func (m *MQ) checkPayloads(dst []*queue, data any) error {
	for _, q := range dst {
		if t := m.payloads[q]; t != nil && !payloadFits(t, data) && !((q.cfg.durable || m.engine != nil) && t == encodedType) {
			// (a consumer of Encoded on a durable queue, or on an engine,
			// gets the codec's encoding of whatever was published)
			return fmt.Errorf("%w: got %T, queue %q takes %v", ErrPayloadType, data, q.name, t)
		}
	}
	return nil
}

// decodable refuses a typed consumer c that could take nothing from a
// queue whose messages are encoded (durable, or on an engine) with JSON,
// which cannot decode into an interface with methods.
func (m *MQ) decodable(queue string, durable bool, c consumer) error {
	t := c.payload
	if t == nil || !(durable || m.engine != nil) || t.Kind() != reflect.Interface || t.NumMethod() == 0 {
		return nil
	}
	if _, ok := m.codec.(JSONCodec); !ok {
		return nil // another codec may decode into it
	}
	return fmt.Errorf("%w: queue %q keeps its messages encoded with JSON, which cannot decode into the interface %v", ErrPayloadType, queue, t)
}

// typeQueueLocked gives q the payload type of its consumer c, when c is
// typed. A queue keeps its type for its life, its typed consumers cancelled
// or not; a typed consumer of another type is refused with ErrPayloadType.
// The caller holds the write lock.
func (m *MQ) typeQueueLocked(q *queue, c consumer) error {
	if c.payload == nil {
		return nil
	}
	if err := m.decodable(q.name, q.cfg.durable, c); err != nil {
		return err
	}
	if t := m.payloads[q]; t != nil {
		if t != c.payload {
			return fmt.Errorf("%w: queue %q takes %v, not %v", ErrPayloadType, q.name, t, c.payload)
		}
		return nil
	}
	if m.payloads == nil {
		m.payloads = make(map[*queue]reflect.Type)
	}
	for o := range m.payloads { // deleted queues
		if o.gone {
			delete(m.payloads, o)
		}
	}
	m.payloads[q] = c.payload
	for _, ex := range m.exchanges {
		ex.retype(m)
	}
	return nil
}
