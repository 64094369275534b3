package tinymq

import (
	"context"
	"reflect"
)

// ConsumerFunc handles one message of a queue.
//
// Returning nil acknowledges the message. Returning an error, or panicking, makes
// the delivery a failure: TinyMQ logs it with the exchange, queue and message ID
// (and the stack, for a panic, which reaches the log as a [*PanicError]) and goes
// on with the next message on the same worker.
//
// ctx is cancelled when the ctx given to [MQ.Start] is cancelled, or when
// [MQ.Shutdown]'s deadline passes; a consumer that may run long should honour it.
// The workers of one queue call the consumer concurrently, so it must be safe
// for that when the queue's concurrency is above 1.
type ConsumerFunc func(ctx context.Context, msg *Msg) error

// consumer is a queue's consumer: fn, or direct when it is set (fn is then
// the same consumer as a ConsumerFunc, for engines).
type consumer struct {
	fn     ConsumerFunc
	direct func(ctx context.Context, d Delivery[any]) error
	// data, when set, is direct for a consumer of the payload alone
	// ([RegisterHandler] without middleware): a shared entry's delivery
	// builds no Delivery for it.
	data func(ctx context.Context, data any) error

	payload reflect.Type // the T of a typed consumer (see typeQueueLocked), or nil
}
