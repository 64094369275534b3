package amqp

import "errors"

// ErrUnconfirmed is wrapped by the error of a Publish that ended (its context
// ended, or the publish timeout passed, see [WithPublishTimeout]) before the
// broker confirmed the message, together with the context's error. The
// message may or may not have reached the broker: a Publish that returns
// ErrUnconfirmed never means the message is safe, and publishing it again may
// deliver it twice.
var ErrUnconfirmed = errors.New("tinymq/amqp: not confirmed by the broker")
