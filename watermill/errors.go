package tinymqwatermill

import "errors"

var (
	// ErrClosed is returned by Publish after Publisher.Close and by Subscribe
	// and SubscribeInitialize after Subscriber.Close.
	ErrClosed = errors.New("tinymqwatermill: closed")

	// ErrNoSubscriber is the consumer error of a message that no
	// subscription of its queue acknowledged: the MQ stopped while no
	// subscription of the group was open to take it, while a subscription
	// nacked it, or while it was not read; or a broadcast subscription closed
	// before it acked it. TinyMQ logs such a message and counts it as dropped
	// (see tinymq.QueueStats.Dropped), or, for a broadcast subscription's
	// deleted queue, as removed (tinymq.Stats.Deleted). On a queue with a
	// retry policy (SubscriberConfig.Retry) it is a failed attempt, as
	// ErrNacked is: the last one dead-letters the message.
	ErrNoSubscriber = errors.New("tinymqwatermill: no subscriber took the message")

	// ErrNacked is the consumer error of a message nacked on a queue with a
	// retry policy (SubscriberConfig.Retry): TinyMQ delivers the message
	// again after its backoff, and dead-letters it once it has used up its
	// attempts, with this error's text as tinymq.Death.LastError.
	ErrNacked = errors.New("tinymqwatermill: nacked")

	// ErrNilMQ is returned by NewPublisher and NewSubscriber for a nil MQ.
	ErrNilMQ = errors.New("tinymqwatermill: nil MQ")
)
