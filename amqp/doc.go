// Package amqp runs a [tinymq.MQ] on a RabbitMQ broker, so that the code that
// registers queues, binds, publishes, starts and stops an in-process MQ runs
// unchanged across processes and restarts:
//
//	mq := tinymq.New(amqp.Engine("amqp://guest:guest@localhost:5672/"))
//	mq.RegisterQueue("user.created", tinymq.Fanout, tinymq.Handler(sendWelcomeEmail), 4,
//		tinymq.WithQueueName("welcome-email"),
//		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5}),
//		tinymq.WithDeadLetter("user.created.dead", ""))
//	mq.Start(ctx)
//	mq.Publish("user.created", UserCreated{ID: 42}) // returns once the broker confirmed it
//	defer mq.Stop()
//
// # Mapping
//
// Exchanges are declared durable with their type; an alternate exchange
// becomes the alternate-exchange argument. Queues are durable and named
// (a queue needs [tinymq.WithQueueName]); their options become arguments:
// WithDeadLetter is x-dead-letter-exchange and x-dead-letter-routing-key,
// WithMessageTTL is x-message-ttl, WithMaxLen is x-max-length with x-overflow
// drop-head or reject-publish. Bindings use the same keys, and headers
// arguments as AMQP tables with the field types the core's headers exchange
// assumes. A queue's concurrency is its number of workers and its prefetch
// ([WithQueuePrefetch] and [WithPrefetch] set a larger one). Exchanges that
// other services own ([WithExternalExchanges], and the broker's amq.*) are
// only checked with a passive declaration, never declared, changed or
// deleted; [DefaultExchange] is the default exchange, which routes to the
// queue its routing key names.
//
// Messages are encoded with the MQ's codec ([tinymq.WithCodec], JSON by
// default; the content-type property names it), published persistent with
// mandatory set, and confirmed by the broker before Publish returns.
// Consumers get Data as a [tinymq.Encoded], which [tinymq.Handler] decodes.
// A consumer that returns nil acks; a failure is retried through a wait queue
// (tinymq.retry.<queue>.<ms>ms) whose TTL dead-letters the message back to its
// queue (with jitter, one of at most 8 per backoff, so that each message of
// a wait queue waits as long and the broker expires each at its time), so backoffs survive a consumer restart and the attempt number is
// read from the broker's x-death counts; an exhausted or [tinymq.Permanent]
// failure is rejected, and the broker dead-letters it with x-death, from which
// Msg.Deaths is built. A delayed publish waits in a delay queue
// (tinymq.delay.<exchange>.<ms>ms) that dead-letters it into its exchange with
// its routing key when the delay ends. These helper queues have an x-expires
// of their TTL plus an hour, renewed while they are used, so the broker
// deletes those no longer used; README.md says how an upgrade from the
// earlier layout (no x-expires, no "ms" suffix) goes.
//
// # The topology at run time
//
// Each call maps onto the broker's own operation, on a channel of its own:
// DeclareQueue is queue.declare and queue.bind (WithQueueExpiry is
// x-expires); Consume is a basic.consume, on its own channel with its own
// prefetch, and Subscription.Cancel a basic.cancel that hands back, nacked
// with requeue, what the subscription prefetched and did not begin;
// DeleteQueue is queue.delete (if-unused and if-empty), which takes the
// queue's retry wait queues with it; PurgeQueue is queue.purge of the queue
// and its wait queues; Unbind is queue.unbind; DeleteExchange is
// exchange.delete (if-unused), which takes the exchange's delay queues with
// it; PauseQueue cancels this MQ's consumers of the queue and ResumeQueue
// has them consume again, keeping the subscriptions valid. What was deleted,
// unbound, expired or cancelled stays so after a reconnect: the engine
// declares again only what it still has, and its subscriptions consume
// again.
//
// # Failures
//
// The engine detects a lost connection or channel, reconnects with
// exponential backoff and jitter ([WithReconnectBackoff]), declares the
// topology again and resumes consuming. A Publish during an outage waits
// for the connection, then for the confirm, and sends the message again if the
// connection is lost before the confirm came, until its context ends or the
// publish timeout passes ([WithPublishTimeout]); then it fails with
// [ErrUnconfirmed]. It never returns nil for a message the broker did not
// confirm, and never [tinymq.ErrStopped] for one it may have. What the broker
// would refuse by closing the channel or the connection is refused before it
// is sent: a name over AMQP's 255 bytes ([tinymq.ErrKeyTooLong]), a header
// of the engine's or of the broker's dead-lettering
// ([tinymq.ErrUnsupported]), a message over the broker's size limit
// ([tinymq.ErrTooLarge]). A CC or BCC header, which RabbitMQ would take for
// more routing keys, is refused too ([tinymq.ErrUnsupported]). During a
// broker's memory or disk alarm (connection.blocked) the engine logs a
// warning with the broker's reason, Stats().Blocked holds it, and a Publish
// returns [ErrUnconfirmed] at its timeout, saying so.
//
// # Quorum queues and clusters
//
// [WithQuorumQueues] declares every queue (the application's, and the
// engine's retry wait and delay queues) as a quorum queue, replicated on the
// nodes of a cluster, and [WithNodes] gives the engine the other nodes, so
// that after a lost connection it reconnects to the next one that answers,
// declares its topology there and consumes again. Together, on three nodes,
// a message whose Publish returned nil survives losing one node (at least
// once: some are delivered twice), and publishing resumed on another node
// 0.5-5 s after a kill in the tests (which assert 30 s). Two lost nodes of
// three stop the queues; classic queues on a cluster live on one node. See
// README.md for what changes with quorum queues and what they cost.
//
// Shutdown (and Stop) cancels the consumers, lets the messages in consumers
// finish and the publishes under way have their confirm, hands back what was
// prefetched, and closes the connections; the broker keeps every other
// message for the next consumer. A broker that holds back its replies to a
// consumer's channel calls (basic.cancel, channel.close) for 2 s has the
// consuming connection closed, so that neither Shutdown, Cancel nor
// PauseQueue waits for it. See README.md for every difference from the
// in-memory engine.
package amqp
