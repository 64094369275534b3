package amqp

import "errors"

// ErrUnconfirmed is wrapped by the error of a Publish whose outcome is
// unknown: it ended before the broker confirmed the message, and the broker
// may or may not have it (may even have delivered it). That is a Publish
// whose context ended, or whose publish timeout passed ([WithPublishTimeout]),
// first (the error then wraps the context's error too); one still waiting for
// its confirm when a Shutdown deadline passed; one whose connection was lost
// after it was sent, and that Shutdown kept from being sent again; and one
// that the broker had received when it closed the channel because of another
// publish (sending it again could deliver it twice). A Publish that returns
// ErrUnconfirmed never means the message is safe, and publishing it again may
// deliver it twice. Only a message that was never sent makes Publish return
// [tinymq.ErrStopped].
var ErrUnconfirmed = errors.New("tinymq/amqp: not confirmed by the broker")
