package tinymq

import (
	"context"
	"log/slog"
	"time"
)

// Engine is the seam between an [MQ] and a backend other than the in-memory
// one, such as a RabbitMQ broker (module github.com/tinymq/tinymq/amqp). An
// MQ made with [WithEngine] keeps its own state machine (New, running,
// stopping) and validates every argument and option exactly as the in-memory
// MQ does, then hands the validated call to the engine; so an engine sees only
// well-formed specs, in a legal order, and never after Shutdown began. An
// engine that cannot honour an option returns an error wrapping
// [ErrUnsupported] that names the difference.
//
// Without an engine the MQ runs in memory and none of this is used: the
// in-memory path pays one nil check per call.
//
// The MQ calls Init once, from New, before any other method; every other
// method may be called concurrently. Messages handed to a consumer must have
// Data as [Encoded] (or the published value, when the engine has it) so that
// [Handler] consumers work unchanged.
type Engine interface {
	// Init hands the engine the MQ's settings. It must not block or do I/O.
	Init(cfg EngineConfig)
	// DeclareExchange declares an exchange ([MQ.DeclareExchange]).
	DeclareExchange(spec ExchangeSpec) error
	// DeclareQueue declares the queue's exchange, the queue and its binding,
	// and attaches its consumer ([MQ.RegisterQueue]); with a nil
	// spec.Consumer it attaches none ([MQ.DeclareQueue]), and a queue that
	// exists already with the same settings only gets the binding.
	// Consumption starts at Start, or at once when the MQ is running.
	DeclareQueue(spec QueueSpec) error
	// Bind binds an existing queue to another exchange ([MQ.Bind]).
	Bind(spec BindingSpec) error
	// Unbind removes a binding made by DeclareQueue or Bind ([MQ.Unbind]);
	// a binding that does not exist is not an error.
	Unbind(spec BindingSpec) error
	// Consume attaches concurrency workers running c to a declared queue
	// ([MQ.Consume]); consumption starts at Start, or at once when the MQ is
	// running. The subscription ends with its Cancel, or at Shutdown.
	Consume(queue string, c ConsumerFunc, concurrency int) (EngineSubscription, error)
	// DeleteQueue deletes a queue and returns how many waiting messages went
	// with it ([MQ.DeleteQueue]); ifUnused and ifEmpty are [IfUnused] and
	// [IfEmpty], refused with errors wrapping [ErrInUse] and [ErrNotEmpty].
	DeleteQueue(name string, ifUnused, ifEmpty bool) (int, error)
	// PurgeQueue removes a queue's waiting messages and returns how many
	// ([MQ.PurgeQueue]).
	PurgeQueue(name string) (int, error)
	// DeleteExchange deletes an exchange and its bindings
	// ([MQ.DeleteExchange]); with ifUnused it is refused, wrapping
	// [ErrInUse], while the exchange has bindings.
	DeleteExchange(name string, ifUnused bool) error
	// PauseQueue and ResumeQueue stop and restart deliveries from a queue
	// to its consumers ([MQ.PauseQueue]).
	PauseQueue(name string) error
	ResumeQueue(name string) error
	// Publish accepts one message ([MQ.PublishContext]): it returns nil only
	// once the message is as safe as the engine promises (a broker's
	// confirm), and waits at most until ctx ends.
	Publish(ctx context.Context, p Publishing) error
	// Start starts consuming; consumers get contexts derived from ctx.
	Start(ctx context.Context) error
	// Shutdown stops consuming and releases the engine's resources, waiting
	// for in-flight consumers until ctx ends ([MQ.Shutdown]). Publishes
	// that began before it may still be running: Shutdown makes them return
	// (confirmed, or with an error) by the time it returns. The MQ may call
	// it more than once; later calls wait as the first does.
	Shutdown(ctx context.Context) error
	// Stats reports what the engine knows ([MQ.Stats]).
	Stats() Stats
}

// EngineSubscription is a consumer that [Engine.Consume] attached.
type EngineSubscription interface {
	// Cancel stops the consumer taking messages, gives back those it took
	// and did not begin, and waits for those it is handling until ctx ends
	// ([Subscription.Cancel]). It is idempotent; called from the
	// subscription's own consumer it does not wait for the deliveries in
	// flight, but may wait, until ctx ends, for the broker to stop
	// delivering to it, so that what is published after it returns goes to
	// the queue's other consumers.
	Cancel(ctx context.Context) error
}

// EngineConfig is what an [Engine] gets from its MQ.
type EngineConfig struct {
	// Logger is the MQ's logger ([WithLogger]); never nil.
	Logger *slog.Logger
	// Codec encodes published Data ([WithCodec]); never nil.
	Codec Codec
	// Forget tells the MQ that the broker deleted a queue on its own (its
	// x-expires passed), so that the MQ forgets it as it forgets a queue
	// that [MQ.DeleteQueue] deleted. It takes the MQ's lock: call it with
	// none of the engine's locks held, never from a call the MQ made.
	Forget func(queue string)
}

// ExchangeSpec describes a validated exchange declaration.
type ExchangeSpec struct {
	Name string
	Kind ExchangeType
	// Alternate is the alternate exchange ([WithAlternateExchange]), or "".
	Alternate string
}

// BindingSpec describes a validated binding of a queue to an exchange.
type BindingSpec struct {
	Queue    string
	Exchange string
	Kind     ExchangeType
	// Keys are the binding keys (direct and topic exchanges).
	Keys []string
	// Args are the binding arguments (headers exchanges), one map per
	// binding; nil for other kinds.
	Args []map[string]any
}

// QueueSpec describes a validated [MQ.RegisterQueue] or [MQ.DeclareQueue]
// call (then Consumer is nil): the queue as
// [MQ.Topology] describes it (its name, concurrency, limits, dead-letter
// exchange: Name is the queue's name; Filtered says whether Filter is set),
// and what an engine needs besides.
type QueueSpec struct {
	QueueInfo
	// Named says whether [WithQueueName] gave Name (otherwise the MQ made it
	// up, as "exchange#3").
	Named bool
	// Binding binds the queue to its exchange; Binding.Queue is Name.
	Binding  BindingSpec
	Consumer ConsumerFunc
	// Retry is normalized; Retry.MaxAttempts, like QueueInfo.MaxAttempts, is
	// 1 when the queue has no retry policy.
	Retry RetryPolicy
	// Filter is [WithFilter], or nil.
	Filter func(*Msg) bool
}

// Publishing describes a validated publish.
type Publishing struct {
	Exchange   string
	RoutingKey string
	Headers    map[string]any
	Data       any
	// Expiration is [WithExpiration], or 0; Delay is [WithDelay], or 0.
	Expiration time.Duration
	Delay      time.Duration
	// ID is, for a [PublishMiddleware] once its next returned nil, the ID
	// the exchange stamped on the message ([Msg].ID); 0 on an engine, or
	// for a duplicate ([WithDeduplicationID]), which was not routed again.
	ID uint64

	r *records // a publish going through PublishMiddleware: see publishInner
}
