package tinymq

import (
	"fmt"
	"maps"
	"slices"
)

// Peek returns copies of up to n messages waiting at the head of the queue,
// in the order a consumer would get them, and changes nothing: no message
// moves, none is marked redelivered, no count changes (RabbitMQ's "get
// messages" with requeue, without its side effect). Messages that a worker
// has taken in a batch and not begun are the head; messages waiting for a
// delay or a retry are not, since they are not in line yet. A copy shares
// nothing the queue's message holds but Data: its Headers and Deaths are its
// own. A durable queue's messages are read from the log (one read each). It
// blocks only on those reads, works in every state (after Stop it shows
// nothing: Stop counted what it could not deliver as undelivered, and a
// durable queue's stays in the log, where [OpenDataDir] reads it), and returns [ErrUnknownQueue] for a queue that does not exist
// and [ErrInvalidOption] for a negative n. An [Engine] refuses it with
// [ErrUnsupported].
func (m *MQ) Peek(queue string, n int) ([]*Msg, error) {
	m.init()
	if n < 0 {
		return nil, fmt.Errorf("%w: Peek of %d messages", ErrInvalidOption, n)
	}
	m.mu.RLock()
	q := m.queues[queue]
	if q == nil {
		m.mu.RUnlock()
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	if m.engine != nil {
		m.mu.RUnlock()
		return nil, fmt.Errorf("%w: Peek", ErrUnsupported)
	}
	q.lock()
	head, wake := q.headLocked(n)
	msgs := make([]*Msg, 0, len(head))
	for i := range head {
		msgs = append(msgs, head[i].peekMsg(q.name))
	}
	q.mu.Unlock()
	q.wakeAfter(wake, 0)
	m.mu.RUnlock()
	out := msgs[:0]
	for _, msg := range msgs {
		if msg.x != nil && msg.x.unread {
			if err := m.dur.read(msg); err != nil {
				continue // acknowledged meanwhile, or the log failed: not waiting any more
			}
		}
		out = append(out, msg)
	}
	return out, nil
}

// headLocked returns the first n entries that wait in q, in the order a
// worker would begin them. Those taken in batches and not begun are the
// head: they are given back to buf first (as giveBackLocked does, in the
// order they were taken), since a batch's unclaimed entries cannot be read
// while its owner may claim them; that moves nothing in the queue's order
// and changes no count, and it reports whether a parked worker should wake
// for them. q.mu is held.
func (q *queue) headLocked(n int) (head []entry, wake bool) {
	if q.giveBackLocked(q.workers) > 0 && !q.paused {
		wake = q.wakeIfWaitingLocked()
	}
	out := make([]entry, 0, min(n, q.buf.n))
	q.buf.each(func(e *entry) bool {
		if len(out) == n {
			return false
		}
		out = append(out, *e)
		return true
	})
	out = q.backlogLocked(out, n) // the groups' backlogs wait too
	return out, wake
}

// peekMsg is a copy of e's message for Peek: a Msg of its own, with its own
// Headers and Deaths, not yet read from the log if it is a restored one.
func (e *entry) peekMsg(queue string) *Msg {
	var c *Msg
	if e.m.shared || e.m == restoredMark {
		c = e.msg(queue) // new
	} else {
		c = e.m.clone()
	}
	if c.Headers != nil {
		c.Headers = maps.Clone(c.Headers)
	}
	c.Deaths = slices.Clone(c.Deaths)
	return c
}
