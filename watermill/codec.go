package tinymqwatermill

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tinymq/tinymq"
)

// UUIDHeader is the TinyMQ header that carries a watermill message's UUID,
// named as watermill's AMQP marshaler names it. Every other header is a
// metadata entry.
const UUIDHeader = "_watermill_message_uuid"

// The metadata keys of a dead letter (see SubscriberConfig.DeadLetterTopic):
// a Subscriber sets them on a message that reached its queue through a
// dead-letter exchange, from the message's latest tinymq.Death, replacing
// metadata of the same names.
const (
	// DeathReasonKey is why the message died: "rejected" (it used up its
	// Retry attempts), "expired" (MessageTTL) or "maxlen" (dropped from a
	// full queue); see tinymq.DeathReason.
	DeathReasonKey = "tinymq_death_reason"
	// DeathTopicKey is the topic the message had been published to.
	DeathTopicKey = "tinymq_death_topic"
	// DeathQueueKey is the queue it died in: QueueName(topic, group) for a
	// consumer group's.
	DeathQueueKey = "tinymq_death_queue"
	// DeathAttemptsKey is how many times it had been delivered, in decimal.
	DeathAttemptsKey = "tinymq_death_attempts"
)

// encode returns the payload and headers that carry msg through TinyMQ: the
// payload as the message's Data, the metadata and the UUID as its headers.
// The headers map is new; the payload is shared with msg.
func encode(msg *message.Message) ([]byte, map[string]any) {
	h := make(map[string]any, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		h[k] = v
	}
	h[UUIDHeader] = msg.UUID
	return msg.Payload, h
}

// decoded is a TinyMQ message taken apart into a watermill message's fields.
type decoded struct {
	uuid     string
	metadata map[string]string
	payload  []byte
}

// decode takes apart a message published by a Publisher, or by any TinyMQ
// publisher: Data []byte, string or nil is the payload as it is; a
// tinymq.Encoded (a message that left memory) is decoded into the []byte a
// Publisher sent, or else taken as its encoded body; any other Data is
// encoded as JSON. String and []byte headers become metadata, others are
// formatted with fmt; a message without a UUID header gets a new UUID. A dead
// letter's latest death is set under the Death keys.
func decode(m *tinymq.Msg) (decoded, error) {
	d := decoded{metadata: make(map[string]string, len(m.Headers))}
	for k, v := range m.Headers {
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		default:
			s = fmt.Sprint(v)
		}
		if k == UUIDHeader {
			d.uuid = s
			continue
		}
		d.metadata[k] = s
	}
	if d.uuid == "" {
		d.uuid = watermill.NewUUID()
	}
	if len(m.Deaths) > 0 {
		death := m.Deaths[0]
		d.metadata[DeathReasonKey] = string(death.Reason)
		d.metadata[DeathTopicKey] = death.Exchange
		d.metadata[DeathQueueKey] = death.Queue
		d.metadata[DeathAttemptsKey] = strconv.Itoa(death.Attempts)
	}
	switch data := m.Data.(type) {
	case nil:
	case []byte:
		d.payload = data
	case json.RawMessage:
		d.payload = data
	case string:
		d.payload = []byte(data)
	case tinymq.Encoded:
		if data.Codec == nil || data.Decode(&d.payload) != nil {
			d.payload = data.Body
		}
	default:
		p, err := json.Marshal(data)
		if err != nil {
			return d, fmt.Errorf("tinymqwatermill: encode payload of type %T: %w", data, err)
		}
		d.payload = p
	}
	return d, nil
}

// message returns a new watermill message carrying d, with its own metadata
// map, so that what one delivery's handler changes is not seen by the next.
func (d *decoded) message() *message.Message {
	msg := message.NewMessage(d.uuid, d.payload)
	for k, v := range d.metadata {
		msg.Metadata[k] = v
	}
	return msg
}
