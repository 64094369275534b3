package tinymqwatermill

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tinymq/tinymq"
)

// PublisherConfig configures a Publisher. The zero value is ready to use.
type PublisherConfig struct {
	// FailUnroutable makes Publish return an error wrapping
	// tinymq.ErrNoRoute (or tinymq.ErrUnknownExchange) when no queue takes the
	// message: no consumer group has subscribed to the topic and no broadcast
	// subscription is open. By default Publish drops such a message and
	// returns nil, as watermill's GoChannel does with a message nobody
	// subscribed to; TinyMQ counts the drop in Stats().Exchanges[topic].Unroutable
	// once the topic's exchange exists.
	FailUnroutable bool
}

// Publisher is a watermill message.Publisher that publishes to a TinyMQ MQ:
// a topic is the fanout exchange of that name, and each consumer group's
// queue, and each open broadcast subscription's queue, bound to it gets a
// copy. Create it with NewPublisher; it is safe for concurrent use and starts
// no goroutine.
type Publisher struct {
	mq     *tinymq.MQ
	cfg    PublisherConfig
	closed atomic.Bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher to mq. Any number of Publishers and
// Subscribers may share one MQ. It does not block and works whatever the MQ's
// state (a Publisher of a stopped MQ returns its ErrStopped from Publish). It
// returns ErrNilMQ for a nil mq.
func NewPublisher(mq *tinymq.MQ, cfg PublisherConfig) (*Publisher, error) {
	if mq == nil {
		return nil, ErrNilMQ
	}
	return &Publisher{mq: mq, cfg: cfg}, nil
}

// Publish publishes msgs to topic, in order, each with tinymq.MQ.PublishContext
// under the message's context: its payload becomes the TinyMQ message's Data
// and its UUID and metadata its headers (see UUIDHeader). Do not modify a
// message's payload after Publish: subscribers share it.
//
// Publish never waits for a subscriber; it blocks only while a queue bound to
// the topic with a tinymq.Block length limit is full, until the message's
// context ends. It returns at the first message the MQ refuses, with an error
// that wraps TinyMQ's (tinymq.ErrStopped once the MQ stops); the messages
// before it were published. It returns ErrClosed after Close, and an error
// for an empty topic (tinymq.ErrEmptyName) or a nil message.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if p.closed.Load() {
		return ErrClosed
	}
	if topic == "" {
		return fmt.Errorf("tinymqwatermill: publish: %w: topic", tinymq.ErrEmptyName)
	}
	for i, msg := range msgs {
		if msg == nil {
			return fmt.Errorf("tinymqwatermill: publish to %q: message %d is nil", topic, i)
		}
		payload, headers := encode(msg)
		err := p.mq.PublishContext(msg.Context(), topic, payload, tinymq.WithHeaders(headers))
		if err == nil {
			continue
		}
		if !p.cfg.FailUnroutable && (errors.Is(err, tinymq.ErrNoRoute) || errors.Is(err, tinymq.ErrUnknownExchange)) {
			continue
		}
		return fmt.Errorf("tinymqwatermill: publish message %s to %q: %w", msg.UUID, topic, err)
	}
	return nil
}

// Close makes later calls to Publish return ErrClosed; Publish calls already
// running finish. It does not stop the MQ, which has its own owner. Close is
// idempotent, does not block and always returns nil.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}
