package tinymq

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by TinyMQ. Errors returned by the library wrap one of
// these with more context, so match them with [errors.Is].
var (
	// ErrStopped is returned by Publish, RegisterQueue, DeclareQueue,
	// Consume, Bind, Unbind, DeleteQueue, PurgeQueue, DeleteExchange,
	// PauseQueue, ResumeQueue and Start once Stop or Shutdown has begun.
	ErrStopped = errors.New("tinymq: stopped")

	// ErrAlreadyStarted is returned by a second call to Start.
	ErrAlreadyStarted = errors.New("tinymq: already started")

	// ErrEmptyName is returned when an exchange or queue name is empty.
	ErrEmptyName = errors.New("tinymq: empty name")

	// ErrNilConsumer is returned by RegisterQueue when the consumer is nil.
	ErrNilConsumer = errors.New("tinymq: nil consumer")

	// ErrInvalidConcurrency is returned by RegisterQueue when concurrency is
	// below 1 or above [MaxConcurrency].
	ErrInvalidConcurrency = errors.New("tinymq: concurrency must be 1 to MaxConcurrency")

	// ErrInvalidKind is returned for an ExchangeType that is not one of the declared
	// constants.
	ErrInvalidKind = errors.New("tinymq: invalid exchange kind")

	// ErrExchangeMismatch is returned when an exchange is declared again with another
	// kind or other options than it already has.
	ErrExchangeMismatch = errors.New("tinymq: exchange already declared differently")

	// ErrUnknownExchange is returned by Publish, Unbind and DeleteExchange
	// for an exchange that was never declared, or was deleted.
	ErrUnknownExchange = errors.New("tinymq: unknown exchange")

	// ErrUnknownQueue is returned by Bind, Unbind, Consume, DeleteQueue,
	// PurgeQueue, PauseQueue and ResumeQueue for a queue that was never
	// declared, or was deleted.
	ErrUnknownQueue = errors.New("tinymq: unknown queue")

	// ErrDuplicateQueue is returned by RegisterQueue when a queue of that
	// name exists, and by DeclareQueue when it exists with other settings.
	ErrDuplicateQueue = errors.New("tinymq: queue already registered")

	// ErrNoRoute is returned by Publish when no queue would receive the message and
	// no alternate exchange took it. The message was not accepted.
	ErrNoRoute = errors.New("tinymq: no route")

	// ErrInvalidBinding is returned for binding options that make no sense for the
	// exchange kind or cannot match anything: a binding key on a fanout or headers
	// exchange, binding arguments on a non-headers exchange, a direct or topic queue
	// without a binding key, an unknown x-match value, or an argument of a type
	// that has no AMQP equivalent.
	ErrInvalidBinding = errors.New("tinymq: invalid binding")

	// ErrKeyTooLong is returned for a binding or routing key longer than 255 bytes,
	// the AMQP limit.
	ErrKeyTooLong = errors.New("tinymq: key longer than 255 bytes")

	// ErrInvalidHeaders is returned by Publish when a header value has a type that
	// has no AMQP equivalent, or when the headers nest too deeply, contain
	// themselves or are too large (see [WithHeaders]).
	ErrInvalidHeaders = errors.New("tinymq: invalid headers")

	// ErrInvalidOption is returned for an option that is nil, out of range, or not
	// allowed in that call.
	ErrInvalidOption = errors.New("tinymq: invalid option")

	// ErrQueueFull is returned by Publish when a matching queue is at its length
	// limit with [RejectPublish]. No queue got the message.
	ErrQueueFull = errors.New("tinymq: queue full")

	// ErrPayloadType is the (permanent) error of a [Handler] consumer handed a
	// Msg whose Data is not of its type. Publish returns it, and no queue
	// gets the message, when a matching queue of a typed consumer
	// ([RegisterHandler]) could never take the Data; ConsumeHandler and its
	// kin return it for a queue that has a typed consumer of another type.
	ErrPayloadType = errors.New("tinymq: payload of the wrong type")

	// ErrPermanent is matched, with errors.Is, by every error that [Permanent]
	// wraps.
	ErrPermanent = errors.New("tinymq: permanent failure")

	// ErrTypedNil is the error of a delivery whose consumer returned a typed
	// nil: a nil pointer (or map, slice, ...) in a non-nil error interface.
	// It counts as a failure, since the error is not nil; its text names the
	// type, so that the mistake can be found.
	ErrTypedNil = errors.New("tinymq: consumer returned a typed nil error")

	// ErrGoexit is the error of a delivery whose consumer called
	// runtime.Goexit (as testing's t.FailNow does). The delivery fails, and a
	// new goroutine takes the worker's place.
	ErrGoexit = errors.New("tinymq: consumer called runtime.Goexit")

	// ErrCalledFromConsumer is returned by Shutdown when it is called from a
	// consumer, or from anything else the MQ's own goroutines run (a logger).
	// Waiting there would wait for the caller itself, so the stop begins and
	// goes on in the background, and Shutdown returns at once.
	ErrCalledFromConsumer = errors.New("tinymq: stop called from a consumer; it goes on in the background")

	// ErrPanicked is matched, with errors.Is, by every [*PanicError].
	ErrPanicked = errors.New("tinymq: panic")

	// ErrLocked is returned (wrapped) when the data directory ([WithDataDir])
	// is in use by another MQ, in this process or another.
	ErrLocked = errors.New("tinymq: data directory locked by another MQ")

	// ErrLog is wrapped by the errors of the write-ahead log: opening it,
	// or writing to it (a full disk, a failed fsync). A Publish that returns
	// it was not accepted by any queue. Once a write or an fsync has failed,
	// every durable publish fails until the MQ is stopped and started again,
	// which re-reads what really is on disk; in-memory queues keep working.
	ErrLog = errors.New("tinymq: write-ahead log")

	// ErrUnsupported is returned by an MQ on an [Engine] for an option or call
	// that the engine cannot honour; the error names the difference.
	ErrUnsupported = errors.New("tinymq: not supported by this engine")

	// ErrUndelivered is wrapped by the error of Shutdown (and logged by Stop) when
	// accepted messages could not be handed to a consumer: the deadline expired, or
	// the MQ was stopped before it was started.
	ErrUndelivered = errors.New("tinymq: accepted messages not delivered")

	// ErrInUse is returned by DeleteQueue with [IfUnused] while the queue
	// has a consumer, and by DeleteExchange with IfUnused while the
	// exchange has bindings. Nothing was deleted.
	ErrInUse = errors.New("tinymq: in use")

	// ErrNotEmpty is returned by DeleteQueue with [IfEmpty] while messages
	// wait in the queue or are in its consumers. Nothing was deleted.
	ErrNotEmpty = errors.New("tinymq: not empty")

	// ErrNotStarted is returned by Health before Start.
	ErrNotStarted = errors.New("tinymq: not started")

	// ErrNoDeath is returned (wrapped) by ReplayDeadLetters for messages
	// that have no death record, and so nowhere to go back to: they stay
	// where they are.
	ErrNoDeath = errors.New("tinymq: message has no death record")

	// ErrTooLarge is returned by Publish for a message larger than the MQ's
	// limit (see [WithMaxMessageSize]). No queue got the message.
	ErrTooLarge = errors.New("tinymq: message too large")
)

// Sentinel errors of the options that pace a queue's consumers.
var (
	// ErrDeliveryTimeout is wrapped by the error of a delivery whose
	// consumer had not returned when [WithDeliveryTimeout]'s deadline
	// passed. The delivery failed: the retry policy and dead-lettering
	// apply, and what the late call returns is ignored.
	ErrDeliveryTimeout = errors.New("tinymq: delivery timed out")
)

// PanicError is the error a consumer's panic becomes. It is logged and counted as
// a failed delivery; the worker that recovered it goes on with the next message.
type PanicError struct {
	// Value is what the consumer passed to panic.
	Value any
	// Stack is the stack of the panicking goroutine, as [runtime/debug.Stack]
	// formats it.
	Stack []byte
}

// Error returns the panic value; the stack is in Stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("tinymq: panic: %v", e.Value)
}

// Is reports whether target is [ErrPanicked].
func (e *PanicError) Is(target error) bool { return target == ErrPanicked }

// Unwrap returns the panic value when it is an error, so that errors.Is and
// errors.As see through a panic(err).
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}
