package tinymqwatermill

import "errors"

var (
	// ErrClosed is returned by Publish after Publisher.Close and by Subscribe
	// and SubscribeInitialize after Subscriber.Close.
	ErrClosed = errors.New("tinymqwatermill: closed")

	// ErrNoSubscriber is the consumer error of a message that the MQ stopped
	// before any subscription of its queue acknowledged: no subscription was
	// attached, the subscription nacked it during the stop, or it never read
	// its channel. TinyMQ logs such a message and counts it as dropped (see
	// tinymq.QueueStats.Dropped); it also wraps the drop of a broadcast
	// message whose last subscription closed before it arrived.
	ErrNoSubscriber = errors.New("tinymqwatermill: no subscriber took the message")

	// ErrNilMQ is returned by NewPublisher and NewSubscriber for a nil MQ.
	ErrNilMQ = errors.New("tinymqwatermill: nil MQ")
)
