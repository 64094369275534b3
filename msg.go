package tinymq

// Msg is one message as a consumer receives it.
//
// Every queue that a message is routed to gets its own Msg, so a consumer may
// modify the fields of the Msg it was given while it runs, and keep the Msg
// afterwards; a retry delivers a copy of it as the consumer left it. Once the
// consumer has returned, TinyMQ may still read the Msg (to retry, dead-letter
// or log it), so a kept Msg must not be modified after that. Data, Headers and
// Deaths are not copied: all copies share them, so treat them as read-only
// after Publish.
type Msg struct {
	// ID is the sequence number the exchange stamped on the message when Publish
	// accepted it: 1 for the first message of an exchange, and the same in every
	// queue's copy. With a data directory ([WithDataDir]) IDs stay unique across
	// restarts: a restarted exchange goes on after the IDs it had reserved.
	ID uint64
	// Exchange is the exchange the message was published to. A message that
	// reached the queue through an alternate exchange keeps the name of the
	// exchange it was published to.
	Exchange string
	// Queue is the name of the queue this copy was delivered to.
	Queue string
	// RoutingKey is the key given with WithRoutingKey, or "".
	RoutingKey string
	// Headers are the headers given with WithHeaders, or nil. Shared by all copies.
	Headers map[string]any
	// Data is the payload given to Publish. Shared by all copies.
	Data any
	// Attempt is 1 on the first delivery to a consumer and grows by one with
	// each retry (see [WithRetry]).
	Attempt int
	// Deaths lists the times the message was dead-lettered, the latest first;
	// empty unless it reached this queue through a dead-letter exchange.
	Deaths []Death
	// Redelivered is set when the message may already have been handed to a
	// consumer before: by an earlier process of a durable queue, or by a
	// broker (RabbitMQ's redelivered flag).
	Redelivered bool

	shared bool    // a record that entries of several queues share, never delivered (see entry)
	x      *msgExt // what few messages need; nil for most, so a Msg stays 128 bytes
}

// msgExt holds the state of a message that has a deadline, lives in the log
// or failed. Copies of a Msg get a copy of it (see clone).
type msgExt struct {
	expires int64  // UnixNano after which it is expired; 0: never
	lastErr error  // the consumer's last error, kept for a later death
	dkey    string // its key in the write-ahead log, for a durable queue
	unread  bool   // restored, with its value still in the log (see lazyMsg)
	group   string // WithMessageGroup's ID, or ""
}

func (m *Msg) ext() *msgExt {
	if m.x == nil {
		m.x = new(msgExt)
	}
	return m.x
}

// expires is when m expires (UnixNano), or 0.
func (m *Msg) expires() int64 {
	if m.x == nil {
		return 0
	}
	return m.x.expires
}

// lastErr is the consumer's last error on m, or nil.
func (m *Msg) lastErr() error {
	if m.x == nil {
		return nil
	}
	return m.x.lastErr
}

// dkey is m's key in the log, or "" for a message of an in-memory queue.
func (m *Msg) dkey() string {
	if m.x == nil {
		return ""
	}
	return m.x.dkey
}

// clone returns a copy of m with its own msgExt.
func (m *Msg) clone() *Msg {
	c := *m
	if m.x != nil {
		x := *m.x
		c.x = &x
	}
	return &c
}

// Group returns the group the message was published in with
// [WithMessageGroup], or "". It is safe to call on a Msg the consumer holds,
// and does not block.
func (m *Msg) Group() string {
	if m.x == nil {
		return ""
	}
	return m.x.group
}
