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
// group is a queue bound to it (see QueueName): its subscriptions, from any
// number of Subscribers of the MQ, compete for its messages, and the queue
// keeps the messages published while none is open for as long as the MQ runs.
// A subscription without a group gets every message published while it is
// open. A message carries its payload as the TinyMQ message's Data and its
// UUID and metadata as headers, so TinyMQ consumers and publishers can share
// the exchanges (see UUIDHeader).
//
// # Delivery
//
// A queue's consumer hands a message to a subscription (every open one,
// without a group) and waits for its Ack. A Nack delivers the same message
// again before any later one, and so does a group subscription closing before
// its Ack, to another subscription of the group: at least once, and in publish
// order with the default Concurrency of 1.
//
// # Stopping
//
// Close the Publishers and Subscribers (or the Router) before stopping the
// MQ. MQ.Stop waits for a message a handler holds, as it waits for any
// consumer; a message no subscription can take any more (none attached, or
// nacked, while the MQ stops) is dropped with ErrNoSubscriber, which TinyMQ
// logs and counts. MQ.Shutdown bounds the wait and cancels the messages'
// contexts.
package tinymqwatermill
