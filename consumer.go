package tinymq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
	"github.com/tinymq/tinymq/internal/wal"
)

// ConsumerFunc handles one message of a queue.
//
// Returning nil acknowledges the message. Returning an error, or panicking, makes
// the delivery a failure: TinyMQ logs it with the exchange, queue and message ID
// (and the stack, for a panic, which reaches the log as a [*PanicError]) and goes
// on with the next message on the same worker.
//
// ctx is cancelled when the ctx given to [MQ.Start] is cancelled, or when
// [MQ.Shutdown]'s deadline passes; a consumer that may run long should honour it.
// The workers of one queue call the consumer concurrently, so it must be safe
// for that when the queue's concurrency is above 1.
type ConsumerFunc func(ctx context.Context, msg *Msg) error

// run is the goroutine of worker slot w: it delivers messages until the
// queue is closed and empty, or aborted. wg.Done is its join. A consumer that
// ends the goroutine with runtime.Goexit (as t.FailNow does) fails its
// message, and a new goroutine takes over the slot, so the queue keeps its
// workers.
func (w *worker) run(ctx context.Context, wg *sync.WaitGroup) {
	q := w.q
	id := q.mq.own.Enter()
	returned := false
	defer func() {
		q.mq.own.Leave(id)
		if !returned {
			wg.Add(1) // this goroutine has not called Done: the count is above 0
			go w.run(ctx, wg)
		}
		wg.Done()
	}()
	for {
		e, ok := w.claim()
		if !ok {
			if e, ok = q.take(w); !ok {
				returned = true
				return
			}
		}
		if !q.begin() {
			w.drop() // aborted: abort counted the rest as undelivered
			continue
		}
		q.wakeThief(w)
		q.deliver(ctx, w, &e)
	}
}

// deliver hands e's message to the consumer, unless it expired, and settles
// the outcome. A direct consumer ([RegisterHandler]) of a shared entry gets
// the message by value, and a Msg is made only if it fails.
func (q *queue) deliver(ctx context.Context, w *worker, e *entry) {
	var m *Msg
	if q.consumer.direct == nil || !e.m.shared {
		m = e.msg(q.name)
		if x := m.expires(); x != 0 && time.Now().UnixNano() >= x {
			q.c.expired.Add(1)
			q.deadLetter(m, ReasonExpired, m.lastErr())
			return
		}
		if !q.load(m) {
			return
		}
		m.Attempt++
	}
	w.delivered.Add(1)
	timed := w.calls%sampleEvery == 0
	w.calls++
	var start time.Time
	if timed {
		start = time.Now()
	}
	err := q.process(ctx, e, m)
	if timed {
		q.hist.observe(time.Since(start))
	}
	if err == nil {
		if m != nil {
			if k := m.dkey(); k != "" {
				q.mq.dur.ack(q.name, k, nil) // before the count, which tests wait for
			}
		}
		w.succeeded.Add(1)
		return
	}
	if m == nil {
		m = e.firstMsg(q.name)
	}
	q.settle(m, err)
}

// firstMsg is the Msg of a shared entry's first delivery, made once a direct
// consumer failed it.
func (e *entry) firstMsg(queue string) *Msg {
	m := e.msg(queue)
	m.Attempt = 1
	return m
}

// process runs the consumer on one message, m or (for a direct consumer, when
// m is nil) the shared entry e, turning a panic into a [*PanicError] and a
// typed nil error into [ErrTypedNil]. If the consumer calls runtime.Goexit,
// process settles the message itself with [ErrGoexit], as the goroutine will
// not return to do it.
func (q *queue) process(ctx context.Context, e *entry, m *Msg) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			err = freezer.FreezeAside(&q.mq.own, &PanicError{Value: r, Stack: debug.Stack()})
			return
		}
		if m == nil {
			m = e.firstMsg(q.name)
		}
		q.settle(m, fmt.Errorf("%w (queue %q)", ErrGoexit, q.name))
	}()
	switch {
	case m == nil:
		err = q.consumer.direct(ctx, e.delivery(q.name))
	case q.consumer.direct != nil:
		err = q.consumer.direct(ctx, m.delivery())
	default:
		err = q.consumer.fn(ctx, m)
	}
	if err != nil {
		err = freezer.Freeze(err) // still guarded: its methods may call Goexit too
	}
	returned = true
	return err
}

// freezer freezes a consumer's error (see process): the typed nil check, and
// its text, its ErrPermanent and its *PanicError asked once, so that
// settling, logging and dead-lettering never run the consumer's code again.
var freezer = guard.Freezer[*PanicError]{TypedNil: ErrTypedNil, Permanent: ErrPermanent, Panicked: ErrPanicked,
	Unpack: func(pe *PanicError) (any, []byte) { return pe.Value, pe.Stack },
	Pack:   func(text string, stack []byte) *PanicError { return &PanicError{Value: text, Stack: stack} }}

// settle counts a failed delivery of m (err is not nil; deliver counts the
// successes) and decides what follows: a retry, or a dead letter.
func (q *queue) settle(m *Msg, err error) {
	q.c.failed.Add(1)
	m.ext().lastErr = err
	if q.leftOnDisk(m, err) {
		return
	}
	if m.Attempt < q.cfg.retry.MaxAttempts && !guard.Is(err, ErrPermanent) {
		q.retryLater(m, err)
		return
	}
	q.deadLetter(m, ReasonRejected, err)
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

// retryLater schedules m for its next attempt after its backoff. The retry
// delivers a copy of m, as the consumer left it, so that a consumer that kept
// m does not see it change.
func (q *queue) retryLater(m *Msg, err error) {
	backoff := q.cfg.retry.backoff(m.Attempt)
	next := m.clone()
	if k := m.dkey(); k != "" {
		q.mq.dur.saveState(q.name, k, queueState{attempt: m.Attempt,
			dueAt: deadline(time.Now(), backoff), lastErr: guard.ErrorText(err)})
	}
	evicted, overflow, aborted := q.schedule(next, backoff)
	switch {
	case aborted:
		q.c.undelivered.Add(1)
		q.logFailure(m, err, slog.LevelError, "tinymq: delivery failed, no retry after the shutdown deadline")
		return
	case overflow != nil:
		q.c.overflowed.Add(1)
		q.deadLetter(m, ReasonMaxLen, err)
		return
	}
	q.c.retried.Add(1)
	q.logFailure(m, err, slog.LevelWarn, "tinymq: delivery failed, will retry", slog.Duration("backoff", backoff))
	if evicted != nil {
		q.c.overflowed.Add(1)
		q.deadLetter(evicted, ReasonMaxLen, nil)
	}
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
	dkey := m.dkey()
	acked := dkey == "" // nothing to acknowledge for an in-memory queue
	var src func(b *wal.Batch)
	if !acked {
		src = func(b *wal.Batch) { // the move to a durable queue is one batch
			q.mq.dur.ack(q.name, dkey, b)
			acked = true
		}
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
	if !acked {
		q.mq.dur.ack(q.name, dkey, nil)
	}
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

// logFailure logs what became of m, with err, the consumer's error (if any).
func (q *queue) logFailure(m *Msg, err error, level slog.Level, msg string, extra ...slog.Attr) {
	q.mq.logAttrs(level, msg, func(attrs []slog.Attr) []slog.Attr {
		attrs = append(attrs,
			slog.String("exchange", m.Exchange),
			slog.String("queue", q.name),
			slog.Uint64("msg_id", m.ID),
			slog.Int("attempt", m.Attempt))
		if err != nil {
			attrs = append(attrs, slog.String("err", guard.ErrorText(err)))
			if pe, _ := guard.As[*PanicError](err); pe != nil {
				attrs = append(attrs, slog.String("stack", string(pe.Stack)))
			}
		}
		return append(attrs, extra...)
	})
}
