// Package tinymqwatermill connects watermill (github.com/ThreeDotsLabs/watermill)
// to TinyMQ: a Publisher and a Subscriber backed by a *tinymq.MQ, so that
// watermill's Router, middlewares and handlers run on an in-process TinyMQ.
//
//	mq := tinymq.New()
//	pub, _ := tinymqwatermill.NewPublisher(mq, tinymqwatermill.PublisherConfig{})
//	sub, _ := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing"})
//	mq.Start(ctx)
//	msgs, _ := sub.Subscribe(ctx, "orders")
//	pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("42")))
//	msg := <-msgs
//	msg.Ack()
//	sub.Close(); pub.Close() // then
//	mq.Stop()
//
// # Model
//
// A watermill topic is the TinyMQ fanout exchange of the same name. A consumer
// group is a queue bound to it (see QueueName), declared with no consumer
// (tinymq.MQ.DeclareQueue): its subscriptions, from any number of Subscribers
// of the MQ, compete for its messages, and the queue keeps the messages
// published while none is open for as long as the MQ runs (and, with
// SubscriberConfig.Durable, across restarts). A subscription
// without a group has a queue of its own, declared when it opens and deleted
// when it closes, so it gets every message published while it is open, and
// two Router handlers on one topic do not hold each other back. A
// message carries its payload as the TinyMQ message's Data and its UUID and
// metadata as headers, so TinyMQ consumers and publishers can share the
// exchanges (see UUIDHeader).
//
// # Delivery
//
// While a subscription is open, its queue has a TinyMQ consumer
// (tinymq.MQ.Consume), which hands a message to a subscription and waits for
// its Ack. By default a Nack delivers the same message again before any later
// one, and so does a group subscription closing before its Ack, to another
// subscription of the group: at least once, and in publish order with the
// default Concurrency of 1.
//
// # Queue settings
//
// SubscriberConfig's queue settings are TinyMQ's queue options: Durable keeps
// a group's queue in the MQ's write-ahead log, MessageTTL and MaxLen bound
// what waits, Retry makes a Nack a failed TinyMQ attempt, retried after a
// backoff on a timer while the queue goes on, and DeadLetterTopic is where
// the messages that used up their attempts, expired or overflowed are
// published, with the Death metadata keys (DeathReasonKey and the others).
// So a handler that keeps failing holds back no queue, where watermill's Retry
// middleware keeps the message, and its queue, in the handler while it waits.
//
// # Closing
//
// A subscription ends when the context given to Subscribe ends or the
// Subscriber closes. Its TinyMQ consumer is cancelled (Subscription.Cancel):
// the messages the consumer had taken and not begun go back to the head of
// the group's queue, and the one a closed subscription held or was about to
// be handed goes to another subscription of the group, or, if none is open,
// first to the group's next one. A broadcast subscription's queue is deleted,
// with what was still in it for that subscription. Nothing is left running
// for a closed subscription but the consumer calls that keep the group's
// messages for its next subscription (at most Concurrency of them).
//
// # Stopping
//
// Close the Publishers and Subscribers (or the Router) before stopping the
// MQ. MQ.Stop waits for a message a handler holds, as it waits for any
// consumer. A group's queue with no open subscription has no consumer: Stop
// leaves its messages undelivered, counted and logged by TinyMQ. A message no
// subscription can take any more (the one a closed subscription held, or one
// nacked or left unread while the MQ stops) is dropped with ErrNoSubscriber,
// which TinyMQ logs and counts; with Retry, that is a failed attempt, and
// Stop waits for the message's remaining attempts and backoffs. MQ.Shutdown
// bounds the wait and cancels the messages' contexts.
package tinymqwatermill
