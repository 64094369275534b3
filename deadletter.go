package tinymq

import (
	"errors"
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
	// Time is when it was dead-lettered.
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
// consumer's last error (cause). Either way m has reached its end here.
func (q *queue) deadLetter(m *Msg, reason DeathReason, cause error) {
	if q.leftOnDisk(m, cause) || !q.load(m) {
		return
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
		err = q.mq.publishDead(q.cfg.dlx, m.Data, key, m.Headers, deaths, src)
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
		return
	}
	q.c.dropped.Add(1)
	q.logFailure(m, cause, slog.LevelError, "tinymq: message dropped", reasonAttr, slog.String("drop_cause", err.Error()))
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
