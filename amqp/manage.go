package amqp

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// This file is the topology at run time on the broker: deletes, purges,
// unbinds and expiries. Each runs the broker's own operation on a channel of
// its own (a refusal closes only that channel) and then takes what it
// removed out of the recorded steps, so that no reconnect declares it again.
// They hold declMu, so the record changes one change at a time; the steps go
// before the operation runs (a reconnect meanwhile must not bring them back)
// and come back if the broker refuses it.

// DeleteQueue deletes the queue (queue.delete, with if-unused and if-empty),
// then its retry wait queues, and returns how many messages went with them.
// The broker cancels the queue's consumers, this MQ's and other processes';
// this MQ's subscriptions end, and their deliveries in flight finish: a
// success is acked, a failure is neither retried nor dead-lettered. ifUnused
// counts every process's consumers, as the broker does (refused with an
// error wrapping [tinymq.ErrInUse]); ifEmpty counts ready messages, those
// waiting for a retry and this MQ's deliveries in flight (refused with
// [tinymq.ErrNotEmpty]), not messages prefetched and not begun, nor other
// processes' unacknowledged ones, which the broker's if-empty does not
// count either. It waits for the broker, at most the publish timeout.
func (e *engine) DeleteQueue(name string, ifUnused, ifEmpty bool) (int, error) {
	if err := e.usable(); err != nil {
		return 0, err
	}
	e.declMu.Lock()
	defer e.declMu.Unlock()
	q := e.queue(name)
	var waitQs []string
	if q != nil {
		if n := q.inFlight.Load(); ifEmpty && n > 0 {
			return 0, fmt.Errorf("%w: queue %q: %d messages are in this MQ's consumers", tinymq.ErrNotEmpty, name, n)
		}
		waitQs = q.waitQs
		q.setDeleting(true) // its managers expect the broker's cancel
		defer q.setDeleting(false)
	}
	e.topoMu.Lock()
	old := e.removeStepsLocked(func(s step) bool {
		return s.kind != stepExchange && (s.name == name || slices.Contains(waitQs, s.name))
	})
	gen := e.gen
	e.topoMu.Unlock()
	n := 0
	err := e.operate(func(conn *amqp091.Connection) error {
		if ifEmpty {
			for _, w := range waitQs {
				depth, err := queueDepth(conn, w)
				if err != nil {
					return err
				}
				if depth > 0 {
					return fmt.Errorf("%w: queue %q: %d messages wait for a retry (in %q)", tinymq.ErrNotEmpty, name, depth, w)
				}
			}
		}
		return withChannel(conn, func(ch *amqp091.Channel) (err error) {
			n, err = e.deleteQueue(ch, name, ifUnused, ifEmpty)
			return err
		})
	})
	if err != nil {
		e.restoreSteps(old, gen)
		return 0, refusal(fmt.Sprintf("deleting queue %q", name), err, ifUnused, ifEmpty)
	}
	// Its wait queues go with it: nothing would take their messages back.
	for _, w := range waitQs {
		werr := e.operate(func(conn *amqp091.Connection) error {
			return withChannel(conn, func(ch *amqp091.Channel) error {
				k, err := ch.QueueDelete(w, false, false, false)
				n += k
				return err
			})
		})
		if werr != nil {
			e.logLater(slog.LevelWarn, "tinymq/amqp: deleting a deleted queue's retry wait queue failed; it stays on the broker",
				"queue", name, "wait_queue", w, "err", werr.Error())
		}
	}
	e.helpers.forget(waitQs)
	if q != nil {
		e.forgetQueue(q, false, uint64(n))
	}
	e.logLater(slog.LevelInfo, "tinymq/amqp: queue deleted; its waiting messages were removed", "queue", name, "removed", n)
	return n, nil
}

// PurgeQueue removes the ready messages of the queue and those waiting in its
// retry wait queues (queue.purge of each), and returns how many; the
// messages in consumers, and those prefetched by one, stay.
func (e *engine) PurgeQueue(name string) (int, error) {
	if err := e.usable(); err != nil {
		return 0, err
	}
	q := e.queue(name)
	if q == nil {
		return 0, fmt.Errorf("%w: %q (deleted, or expired on the broker)", tinymq.ErrUnknownQueue, name)
	}
	n := 0
	var on *amqp091.Connection
	err := e.operate(func(conn *amqp091.Connection) error {
		on = conn
		err := withChannel(conn, func(ch *amqp091.Channel) (err error) {
			n, err = ch.QueuePurge(name, false)
			return err
		})
		if err != nil {
			return err
		}
		for _, w := range q.waitQs {
			err := withChannel(conn, func(ch *amqp091.Channel) error {
				k, err := ch.QueuePurge(w, false)
				n += k
				return err
			})
			if err != nil && amqpCode(err) != amqp091.NotFound {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if amqpCode(err) == amqp091.NotFound {
			if q.spec.Expiry > 0 {
				e.expire(q, on)
			}
			return 0, fmt.Errorf("%w: %q is not on the broker: %w", tinymq.ErrUnknownQueue, name, err)
		}
		return 0, fmt.Errorf("tinymq/amqp: purging queue %q: %w", name, err)
	}
	q.c.purged.Add(uint64(n))
	if n > 0 {
		e.logLater(slog.LevelInfo, "tinymq/amqp: queue purged", "queue", name, "removed", n)
	}
	return n, nil
}

// Unbind removes the bindings that spec describes (queue.unbind, one per key
// or argument table); a binding that the broker does not have is not an
// error.
func (e *engine) Unbind(spec tinymq.BindingSpec) error {
	if err := e.usable(); err != nil {
		return err
	}
	if spec.Exchange == DefaultExchange {
		return fmt.Errorf("%w: unbinding from the default exchange (it routes to every queue by its name)", tinymq.ErrUnsupported)
	}
	binds, err := bindingSteps(spec)
	if err != nil {
		return err
	}
	e.declMu.Lock()
	defer e.declMu.Unlock()
	e.topoMu.Lock()
	old := e.removeStepsLocked(func(s step) bool {
		return slices.ContainsFunc(binds, func(b step) bool { return sameStep(s, b) })
	})
	gen := e.gen
	e.topoMu.Unlock()
	err = e.operate(func(conn *amqp091.Connection) error {
		for _, b := range binds {
			err := withChannel(conn, func(ch *amqp091.Channel) error {
				return ch.QueueUnbind(b.name, b.key, b.exchange, b.args)
			})
			if err != nil && amqpCode(err) != amqp091.NotFound {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.restoreSteps(old, gen)
		return fmt.Errorf("tinymq/amqp: unbinding queue %q from exchange %q: %w", spec.Queue, spec.Exchange, err)
	}
	return nil
}

// DeleteExchange deletes the exchange (exchange.delete, with if-unused,
// which counts every binding on the broker: an error wrapping
// [tinymq.ErrInUse]), then its delay queues with the delayed messages in
// them, which had nowhere left to go.
func (e *engine) DeleteExchange(name string, ifUnused bool) error {
	if err := e.usable(); err != nil {
		return err
	}
	if e.external(name) {
		return fmt.Errorf("%w: deleting external exchange %q (its owner's; see amqp.WithExternalExchanges)", tinymq.ErrUnsupported, name)
	}
	e.declMu.Lock()
	defer e.declMu.Unlock()
	e.topoMu.Lock()
	var delays []string
	for dq, ex := range e.delays {
		if ex == name {
			delays = append(delays, dq)
		}
	}
	old := e.removeStepsLocked(func(s step) bool {
		switch s.kind {
		case stepExchange:
			return s.name == name
		case stepBind:
			return s.exchange == name || slices.Contains(delays, s.name)
		}
		return slices.Contains(delays, s.name)
	})
	gen := e.gen
	e.topoMu.Unlock()
	err := e.operate(func(conn *amqp091.Connection) error {
		return withChannel(conn, func(ch *amqp091.Channel) error { return ch.ExchangeDelete(name, ifUnused, false) })
	})
	if err != nil {
		e.restoreSteps(old, gen)
		return refusal(fmt.Sprintf("deleting exchange %q", name), err, ifUnused, false)
	}
	e.topoMu.Lock()
	delete(e.exchanges, name)
	for _, dq := range delays {
		delete(e.delays, dq)
	}
	e.topoMu.Unlock()
	e.helpers.forget(delays)
	for _, dq := range delays {
		n := 0
		derr := e.operate(func(conn *amqp091.Connection) error {
			return withChannel(conn, func(ch *amqp091.Channel) (err error) {
				n, err = ch.QueueDelete(dq, false, false, false)
				return err
			})
		})
		switch {
		case derr != nil:
			e.logLater(slog.LevelWarn, "tinymq/amqp: deleting a deleted exchange's delay queue failed; it stays on the broker",
				"exchange", name, "delay_queue", dq, "err", derr.Error())
		case n > 0:
			e.logLater(slog.LevelInfo, "tinymq/amqp: exchange deleted; the messages delayed for it were removed",
				"exchange", name, "delay_queue", dq, "removed", n)
		}
	}
	return nil
}

// expire forgets q, declared with an expiry, if the broker no longer has it:
// unused for its x-expires, the broker deleted it with its messages (which
// are not counted: the broker does not say how many). Its wait queues are
// deleted (on conn, if it is not nil) and its subscriptions end. It only
// tries declMu, since its callers (Stats, a subscription's manager) must not
// wait for a declaration, and checks again under it that the queue is gone
// (a DeclareQueue may have declared it again). It reports whether q is gone.
func (e *engine) expire(q *cqueue, conn *amqp091.Connection) bool {
	if q.isGone() {
		return true
	}
	if conn == nil || !e.declMu.TryLock() {
		return false
	}
	defer e.declMu.Unlock()
	if q.isGone() {
		return true
	}
	if exists, err := probeQueue(conn, q.spec.Name); err != nil || exists {
		return false
	}
	removed := 0
	for _, w := range q.waitQs {
		_ = withChannel(conn, func(ch *amqp091.Channel) error {
			k, err := ch.QueueDelete(w, false, false, false)
			removed += k
			return err
		})
	}
	e.forgetQueue(q, true, uint64(removed))
	if forget := e.forget; forget != nil {
		name := q.spec.Name
		e.tellLater(func() { forget(name) })
	}
	e.logLater(slog.LevelInfo, "tinymq/amqp: queue expired: unused for its expiry, the broker deleted it with its messages",
		"queue", q.spec.Name, "expiry", q.spec.Expiry)
	return true
}

// forgetQueue takes q, deleted or expired, out of the record and of the
// engine, counts it, and ends its subscriptions (their deliveries in flight
// finish). The caller holds declMu.
func (e *engine) forgetQueue(q *cqueue, expired bool, removed uint64) {
	e.topoMu.Lock()
	e.steps = slices.DeleteFunc(e.steps, q.owns)
	e.topoMu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byName[q.spec.Name] == q {
		delete(e.byName, q.spec.Name)
	}
	e.queues = slices.DeleteFunc(e.queues, func(o *cqueue) bool { return o == q })
	e.deleted = append(e.deleted, q)
	e.deletedQueues++
	if expired {
		e.expiredQueues++
	}
	q.c.removed.Add(removed)
	q.mu.Lock()
	q.gone = true
	q.retired = slices.Clone(q.subs)
	for _, s := range q.retired {
		s.cancelLocked()
	}
	q.signalLocked()
	q.mu.Unlock()
	e.deletedStatsLocked() // folds those that settled, so that the list stays short without Stats
}

// queueDepth returns the ready messages of a queue (0 when the broker does not
// have it), with a passive declaration on a channel of its own.
func queueDepth(conn *amqp091.Connection, name string) (int, error) {
	n := 0
	err := withChannel(conn, func(ch *amqp091.Channel) error {
		qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		n = qi.Messages
		return err
	})
	if amqpCode(err) == amqp091.NotFound {
		return 0, nil
	}
	return n, err
}

// refusal wraps the broker's refusal of a delete with if-unused or if-empty
// in [tinymq.ErrInUse] or [tinymq.ErrNotEmpty], and any other error with what
// was being done.
func refusal(what string, err error, ifUnused, ifEmpty bool) error {
	if errors.Is(err, tinymq.ErrNotEmpty) || errors.Is(err, tinymq.ErrInUse) {
		return err
	}
	var ae *amqp091.Error
	if errors.As(err, &ae) && ae.Code == amqp091.PreconditionFailed {
		switch {
		case ifUnused && strings.Contains(ae.Reason, "in use"):
			return fmt.Errorf("%w: %s: the broker refused: %w", tinymq.ErrInUse, what, err)
		case ifEmpty && strings.Contains(ae.Reason, "not empty"):
			return fmt.Errorf("%w: %s: the broker refused: %w", tinymq.ErrNotEmpty, what, err)
		}
	}
	return fmt.Errorf("tinymq/amqp: %s: %w", what, err)
}
