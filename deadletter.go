package tinymq

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
)

// DeathReason says why a message was dead-lettered, in RabbitMQ's words.
type DeathReason string

const (
	// ReasonRejected: the consumer failed on the last allowed attempt, or
	// returned a Permanent error.
	ReasonRejected DeathReason = "rejected"
	// ReasonExpired: the message's TTL passed before a consumer got it.
	ReasonExpired DeathReason = "expired"
	// ReasonMaxLen: the queue was at its length limit with DropHead, and this
	// was its oldest message.
	ReasonMaxLen DeathReason = "maxlen"
)

// Death records one dead-lettering of a message, as RabbitMQ's x-death header
// does.
type Death struct {
	Reason DeathReason
	// Exchange, Queue and RoutingKey say where the message was when it died:
	// the exchange it had been published to, the queue it was dead-lettered
	// from, and its routing key there.
	Exchange   string
	Queue      string
	RoutingKey string
	// Attempts is how many times a consumer had been handed the message.
	Attempts int
	// Count is how many times the message died in this queue for this reason
	// (RabbitMQ's x-death count): a message keeps one Death per queue and
	// reason, which keeps the exchange and routing key of its first death.
	Count int
	// MessageID is the message's [Msg.ID] in the queue it died in.
	MessageID uint64
	// LastError is the text of the consumer's last error, if any.
	LastError string
	// Time is when it was dead-lettered: for a Count above 1, the first
	// time, as for the exchange and routing key.
	Time time.Time
}

// leftOnDisk handles a durable message that failed, or must die, after a
// Shutdown deadline aborted its queue: the consumer was most likely cancelled
// by the deadline, so rather than drop or dead-letter it (into queues that
// are shut) it stays in the log unacknowledged, counted undelivered, and is
// delivered again after a restart, as a broker requeues what a closing
// consumer did not acknowledge.
func (q *queue) leftOnDisk(m *Msg, err error) bool {
	if m.dkey() == "" || q.begun.Load()&abortBit == 0 {
		return false
	}
	q.c.undelivered.Add(1)
	q.logFailure(m, err, slog.LevelWarn, "tinymq: shutdown deadline passed; the message stays in the log for the next start")
	return true
}

// deadLetter publishes m to the queue's dead-letter exchange, or drops it when
// there is none or it cannot route m, and logs which with the reason and the
// consumer's last error (cause). Either way m has reached its end here. It
// reports whether a Shutdown deadline's abort ended m: left on disk, or
// dropped after it.
func (q *queue) deadLetter(m *Msg, reason DeathReason, cause error) (aborted bool) {
	if q.leftOnDisk(m, cause) {
		return true
	}
	if !q.load(m) {
		return false
	}
	death := Death{Reason: reason, Exchange: m.Exchange, Queue: q.name, RoutingKey: m.RoutingKey,
		Attempts: m.Attempt, Count: 1, MessageID: m.ID, Time: time.Now()}
	if cause != nil {
		death.LastError = guard.ErrorText(cause)
	}
	deaths := addDeath(m.Deaths, death)
	var src *deadSource // nil: nothing to acknowledge for an in-memory queue
	if dkey := m.dkey(); dkey != "" {
		src = &deadSource{queue: q.name, key: dkey}
	}
	var err error
	if q.cfg.dlx == "" {
		err = errNoDeadLetterExchange
	} else {
		key := q.cfg.dlxKey
		if key == "" {
			key = m.RoutingKey
		}
		err = q.mq.publishDead(q.cfg.dlx, m.Data, key, m.Group(), m.Headers, deaths, src)
	}
	q.mq.dur.ackUnmoved(src)
	rec := DeadLetter{Death: deaths[0]}
	if err == nil {
		rec.DeadLetterExchange = q.cfg.dlx
	} else {
		rec.Dropped, rec.DropCause = true, err.Error()
	}
	q.mq.deadLetters.add(rec)
	reasonAttr := slog.String("reason", string(reason))
	if err == nil {
		q.c.deadLettered.Add(1)
		q.logFailure(m, cause, slog.LevelWarn, "tinymq: message dead-lettered", reasonAttr,
			slog.String("dead_letter_exchange", q.cfg.dlx))
		return false
	}
	q.c.dropped.Add(1)
	q.logFailure(m, cause, slog.LevelError, "tinymq: message dropped", reasonAttr, slog.String("drop_cause", err.Error()))
	return q.mq.pastDeadline()
}

var (
	errNoDeadLetterExchange = errors.New("no dead-letter exchange")
	errDeadLetterCycle      = errors.New("dead-letter cycle: every queue it routes to is one it died in without a rejection since")
)

// addDeath returns deaths with d recorded as RabbitMQ records x-death: one
// entry per queue and reason, the latest first. A death in a queue for a
// reason already recorded increments that entry's Count and moves it to the
// front; it keeps the exchange, routing key, message ID and time of the
// first such death, and takes the new attempts and last error. deaths is
// not modified: other copies of the message share it.
func addDeath(deaths []Death, d Death) []Death {
	out := make([]Death, 0, len(deaths)+1)
	out = append(out, d)
	for _, old := range deaths {
		if old.Queue == d.Queue && old.Reason == d.Reason {
			old.Count++
			old.Attempts, old.LastError = d.Attempts, d.LastError
			out[0] = old
			continue
		}
		out = append(out, old)
	}
	return out
}

// isCycle reports whether a message with these deaths (the latest first,
// the one being dead-lettered now included) would cycle if delivered to
// queue, as RabbitMQ decides it: it died in queue before, and no death since
// then, that one included, was a rejection.
func isCycle(deaths []Death, queue string) bool {
	for _, d := range deaths {
		if d.Reason == ReasonRejected {
			return false
		}
		if d.Queue == queue {
			return true
		}
	}
	return false
}

// ReplayDeadLetters moves up to n messages from the head of the queue
// (typically one that a dead-letter exchange routes to) back to where they
// died: each is published to the exchange and routing key of its newest
// death record ([Msg].Deaths[0]), with its data, headers and death records,
// as a shovel moves dead letters back once the bug that killed them is
// fixed. Each move is all or nothing, as a Publish is, and atomic: the
// message is in exactly one of the two places, also across a crash when
// both are durable queues (the source's acknowledgement is in the record
// that publishes the copy). The copy gets a new ID from the exchange; the
// source counts it in [QueueStats].Replayed. A message that cannot be moved
// (its exchange is gone, a queue refuses it) stops the replay: it and those
// behind it stay, in order, and the error says why; a message with no death
// record stays where it is, the replay goes on past it, and the error wraps
// [ErrNoDeath]. It returns how many messages moved. It blocks while a
// durable move's record is written. It returns [ErrUnknownQueue] for a queue
// that does not exist, [ErrInvalidOption] for a negative n, and
// [ErrStopped] once Stop has begun. An [Engine] refuses it with
// [ErrUnsupported].
func (m *MQ) ReplayDeadLetters(queue string, n int) (int, error) {
	m.init()
	if n < 0 {
		return 0, fmt.Errorf("%w: ReplayDeadLetters of %d messages", ErrInvalidOption, n)
	}
	m.mu.RLock()
	stopping := m.state >= stateStopping
	q := m.queues[queue]
	m.mu.RUnlock()
	switch {
	case stopping:
		return 0, ErrStopped
	case q == nil:
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	case m.engine != nil:
		return 0, fmt.Errorf("%w: ReplayDeadLetters", ErrUnsupported)
	}
	moved := 0
	var kept []stamped // messages with no death record, in order, to put back
	var err error
	for moved+len(kept) < n {
		h, ok := q.takeHead()
		if !ok {
			break
		}
		e := h.e
		msg := e.msg(q.name)
		if msg.x != nil && msg.x.unread {
			if msg = msg.clone(); m.dur.read(msg) != nil {
				q.putBack([]stamped{h}) // the log failed: it stays, unread
				err = fmt.Errorf("%w: reading a message of %q", ErrLog, q.name)
				break
			}
		}
		if len(msg.Deaths) == 0 {
			kept = append(kept, h)
			continue
		}
		d := msg.Deaths[0]
		var src *deadSource
		if k := msg.dkey(); k != "" {
			src = &deadSource{queue: q.name, key: k}
		}
		r := records{data: msg.Data, pc: publishConfig{routingKey: d.RoutingKey, headers: msg.Headers, group: msg.Group()}, deaths: msg.Deaths}
		_, perr := m.publish(d.Exchange, &r, &deadLetter{src: src, replay: true})
		settleEvicted(r.evicted)
		if perr != nil {
			q.putBack([]stamped{h})
			err = fmt.Errorf("replaying message %d of %q to exchange %q: %w", msg.ID, q.name, d.Exchange, perr)
			break
		}
		m.dur.ackUnmoved(src)
		q.c.replayed.Add(1)
		q.doneHead(&e)
		moved++
	}
	if len(kept) > 0 {
		q.putBack(kept)
		err = errors.Join(err, fmt.Errorf("%w: %d messages of %q stayed", ErrNoDeath, len(kept), q.name))
	}
	if moved > 0 {
		m.logAttrs(slog.LevelInfo, "tinymq: dead letters replayed", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.String("queue", q.name), slog.Int("count", moved))
		})
	}
	return moved, err
}

// takeHead takes the head of the queue for ReplayDeadLetters, as a worker
// takes a message: it counts as begun, and the queue as busy (so that a
// stopping MQ waits for it) until doneHead or putBack. It reports false when
// nothing waits, or the queue was deleted or aborted.
func (q *queue) takeHead() (stamped, bool) {
	q.lock()
	defer q.mu.Unlock()
	if q.closed {
		return stamped{}, false
	}
	q.giveBackLocked(q.workers)
	if q.buf.n == 0 {
		return stamped{}, false
	}
	// Not popLocked: a grouped head keeps its group until doneHead (putBack
	// returns it to the head of buf, its group's message out still).
	e, at := q.buf.popOne()
	q.begun.Add(1)
	q.busy++
	q.freeRoomLocked()
	return stamped{e, at}, true
}

// doneHead ends what takeHead began, for e, a message that left the queue:
// its group (WithGroupOrdering) goes on.
func (q *queue) doneHead(e *entry) {
	q.lock()
	q.busy--
	if q.cfg.groups {
		if g := e.group(); g != "" {
			q.groupDoneLocked(g)
		}
	}
	q.reportIfQuiescentLocked()
	q.mu.Unlock()
}

// putBack returns what takeHead took to the head of the queue, in order: they
// enter it again, as a retry does. A queue deleted or aborted meanwhile could
// not count them (they were begun), so it counts them now: removed, or
// undelivered.
func (q *queue) putBack(es []stamped) {
	q.lock()
	q.busy -= len(es)
	switch {
	case q.gone:
		q.c.removed.Add(uint64(len(es)))
		for i := range es {
			if k := es[i].e.dkey(); k != "" {
				defer q.mq.dur.ack(q.name, k, nil) // once q.mu is released
			}
		}
	case q.aborted:
		q.c.undelivered.Add(uint64(len(es)))
		q.abortLost += uint64(len(es))
	default:
		for i := len(es) - 1; i >= 0; i-- {
			q.buf.pushFront(es[i].e, es[i].at)
		}
		q.entered += uint64(len(es))
	}
	wake := !q.paused && q.wakeIfWaitingLocked()
	expiry := q.armExpiryLocked()
	q.reportIfQuiescentLocked()
	q.mu.Unlock()
	q.wakeAfter(wake, expiry)
}
