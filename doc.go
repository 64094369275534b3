// Package tinymq is an in-process message queue with RabbitMQ's model:
// publishers send messages to named exchanges, exchanges route copies of them to
// bound queues, and each queue is drained by a fixed pool of consumer
// goroutines. It uses only the standard library.
//
// # Quick start
//
//	mq := tinymq.New()
//	mq.RegisterQueue("user.created", tinymq.Fanout, sendWelcomeEmail, 2)
//	mq.RegisterQueue("user.created", tinymq.Fanout, writeAuditRecord, 1)
//	mq.Start(ctx)
//	mq.Publish("user.created", UserCreated{ID: 42})
//	mq.Stop() // delivers what was accepted, then returns
//
// # Exchanges and routing
//
// An exchange is declared by [MQ.RegisterQueue] (or [MQ.DeclareExchange]) with
// an [ExchangeType] that decides which bound queues get a message, exactly as
// RabbitMQ's exchange of that kind would:
//
//   - [Fanout]: every bound queue.
//   - [Direct]: queues whose [WithBindingKey] equals the [WithRoutingKey].
//   - [Topic]: queues whose binding pattern matches the routing key, "*" being
//     one word and "#" zero or more.
//   - [Headers]: queues whose [WithBindingArgs] match the [WithHeaders].
//
// [MQ.Bind] binds one queue to further exchanges. [WithFilter] narrows what a
// queue accepts. A message that no queue accepts is not silently dropped:
// [MQ.Publish] returns [ErrNoRoute], unless the exchange has an alternate
// exchange ([WithAlternateExchange]) that takes it.
//
// # Delivery
//
// Publish stamps the message with the exchange's next sequence number
// ([Msg.ID]) and appends a copy to each matching queue's buffer, which is
// unbounded unless the queue has a length limit ([WithMaxLen]); it never waits
// for a consumer (only, with the [Block] overflow, for room). Each queue's
// workers call its [ConsumerFunc]. A consumer that returns an error or panics
// fails that delivery only: the failure is logged (see [WithLogger]), retried
// as [WithRetry] says, then dead-lettered ([WithDeadLetter]), and the worker
// goes on. With concurrency 1 a queue delivers in publish order. [WithMessageTTL],
// [WithExpiration] and [WithDelay] add time to it.
//
// # Consumer forms
//
// A [ConsumerFunc] gets a *[Msg] of its own for each delivery, which it may
// keep and modify: one 128-byte allocation per delivery. [Handler] adapts a
// function of the payload type into one. [RegisterHandler] registers a
// function of the payload type directly, and [RegisterDeliveryHandler] one
// that also needs the metadata, received as a [Delivery] value: neither
// allocates anything to deliver a message whose Data is already of that type.
//
// # User code
//
// Consumers, filters, loggers and codecs are called as untrusted code: a
// panic, a typed nil error or runtime.Goexit fails one delivery and never a
// worker. They may call back into the MQ: [MQ.Publish], [MQ.Stats],
// [MQ.RegisterQueue] and [MQ.Bind] work as from anywhere else; [MQ.Stop] and
// [MQ.Shutdown], called from a consumer or a logger, begin the stop and
// return at once, since waiting would wait for the caller. Filters run with
// no lock held. What they must not do is block forever.
//
// # Lifecycle
//
// [MQ.Start] starts the workers; messages published before it wait for it.
// [MQ.Stop] stops accepting, delivers everything already accepted that a
// consumer takes and waits for every worker (what waits in a queue with no
// consumer, or a paused one, stays there: reported as undelivered, and kept
// in the log for a durable queue). [MQ.Shutdown] does the same within a deadline, and reports
// how many messages it could not deliver when the deadline passes. Cancelling
// the context given to Start stops the MQ as Stop does.
//
// # Topology at run time
//
// A queue need not come with its consumer. [MQ.DeclareQueue] declares a queue
// whose messages wait (a device's queue while it is offline, a parking queue
// for dead letters); [MQ.Consume] attaches consumers to it, several
// competing, and [Subscription.Cancel] detaches them, giving back what they
// had taken and not begun. [MQ.PauseQueue] and [MQ.ResumeQueue] hold and
// release deliveries; [MQ.PurgeQueue], [MQ.DeleteQueue], [MQ.Unbind] and
// [MQ.DeleteExchange] remove messages, queues, bindings and exchanges, and
// [WithQueueExpiry] deletes a queue left unused, as RabbitMQ's x-expires
// does. Each matches a RabbitMQ operation, and a publish racing any of them
// is still all or nothing. What they remove is counted in [MQ.Stats], and a
// durable queue's deletes and purges are records in the log, so that they
// hold after a crash.
//
// # Durability
//
// By default messages live in memory. With [WithDataDir] an MQ keeps a
// write-ahead log, and queues registered [WithDurable] keep their messages in
// it: a Publish to such a queue returns nil only once the message is on disk,
// and after a crash or a kill -9 the next MQ on the same directory delivers
// again what was not acknowledged. [WithSync] trades the last interval of a
// power loss for speed; [WithMaxMessageSize] bounds a message.
//
// # Engines
//
// [WithEngine] runs the same API on another broker: the nested module
// github.com/tinymq/tinymq/amqp runs it on RabbitMQ, so that several processes
// share queues. What an engine cannot do is refused with [ErrUnsupported].
//
// # Observing
//
// [MQ.Stats] counts what happened in every exchange and queue (every accepted
// message ends in exactly one of Succeeded, DeadLettered, Dropped,
// Undelivered, Purged or, once its queue is deleted, Removed), [MQ.Topology] lists exchanges, queues and bindings, and
// [MQ.RecentDeadLetters] keeps the latest dead letters. The package
// tinymq/admin serves them as a page, and the nested modules prometheus and
// otel export them; [WithLogger] receives what cannot be returned as an
// error.
//
// # Errors
//
// Every error wraps one of the sentinels in errors.go, such as [ErrNoRoute] or
// [ErrStopped]; match them with [errors.Is]. A panic in a consumer or filter
// becomes a [*PanicError] carrying the value and the stack.
package tinymq
