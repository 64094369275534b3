package tinymq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"sync"
	"time"
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

// Handler adapts a function of one payload type into a ConsumerFunc, so that
// a queue of UserCreated events can be consumed by
// func(ctx context.Context, e UserCreated) error. A message whose Data is an
// [Encoded] (a durable queue, a broker) is decoded into a T with its codec, so
// the function gets the same T on every engine, before and after a restart.
// A nil Data is the zero T when T is an interface type. A message whose Data
// is not a T otherwise fails with a [Permanent] error wrapping [ErrPayloadType], so it is
// dead-lettered without retries. Handler(nil) returns nil, which
// RegisterQueue refuses.
func Handler[T any](fn func(ctx context.Context, v T) error) ConsumerFunc {
	if fn == nil {
		return nil
	}
	// nil is a valid value of an interface type T, such as any or error.
	nilOK := reflect.TypeFor[T]().Kind() == reflect.Interface
	return func(ctx context.Context, msg *Msg) error {
		v, ok := msg.Data.(T)
		if !ok {
			switch d := msg.Data.(type) {
			case Encoded:
				if err := d.Decode(&v); err != nil {
					return Permanent(fmt.Errorf("%w, want %v", err, reflect.TypeFor[T]()))
				}
			case nil:
				if !nilOK {
					return Permanent(fmt.Errorf("%w: got nil, want %v", ErrPayloadType, reflect.TypeFor[T]()))
				}
			default:
				return Permanent(fmt.Errorf("%w: got %T, want %v", ErrPayloadType, msg.Data, reflect.TypeFor[T]()))
			}
		}
		return fn(ctx, v)
	}
}

// work is one worker: it delivers messages until the queue is closed and empty,
// or aborted. wg.Done is its join.
func (q *queue) work(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	batch := make([]entry, 0, maxBatch)
	held := false
	calls := 0
	for {
		var ok bool
		batch, ok = q.take(batch[:0], held)
		if !ok {
			return
		}
		held = true
		for i, e := range batch {
			batch[i] = entry{}
			if !q.begin() {
				clear(batch[i:]) // aborted: abort counted the rest as undelivered
				break
			}
			q.deliver(ctx, e.msg(q.name), calls%sampleEvery == 0)
			calls++
		}
	}
}

// deliver hands m to the consumer, unless it expired, and settles the outcome:
// success, a retry, or a dead letter.
func (q *queue) deliver(ctx context.Context, m *Msg, timed bool) {
	if m.expires != 0 && time.Now().UnixNano() >= m.expires {
		q.c.expired.Add(1)
		q.deadLetter(m, ReasonExpired, nil)
		return
	}
	m.Attempt++
	q.c.delivered.Add(1)
	var start time.Time
	if timed {
		start = time.Now()
	}
	err := q.process(ctx, m)
	if timed {
		q.hist.observe(time.Since(start))
	}
	if err == nil {
		q.c.succeeded.Add(1)
		return
	}
	q.c.failed.Add(1)
	if m.Attempt < q.retry.MaxAttempts && !errors.Is(err, ErrPermanent) {
		q.retryLater(m, err)
		return
	}
	q.deadLetter(m, ReasonRejected, err)
}

// process runs the consumer on one message, turning a panic into an error.
func (q *queue) process(ctx context.Context, m *Msg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return q.consumer(ctx, m)
}

// retryLater schedules m for its next attempt after its backoff. The retry
// delivers a copy of m, as the consumer left it, so that a consumer that kept
// m does not see it change.
func (q *queue) retryLater(m *Msg, err error) {
	backoff := q.retry.backoff(m.Attempt)
	next := new(Msg)
	*next = *m
	q.mu.Lock()
	if q.aborted {
		q.mu.Unlock()
		q.c.undelivered.Add(1)
		q.logFailure(m, err, slog.LevelError, "tinymq: delivery failed, no retry after the shutdown deadline")
		return
	}
	q.scheduled++
	q.entered++
	q.mu.Unlock()
	q.c.retried.Add(1)
	q.logFailure(m, err, slog.LevelWarn, "tinymq: delivery failed, will retry", slog.Duration("backoff", backoff))
	q.mq.sched.add(time.Now().Add(backoff), q, next)
}

// deadLetter publishes m to the queue's dead-letter exchange, or drops it when
// there is none or it cannot route m, and logs which with the reason and the
// consumer's last error (cause). Either way m has reached its end here.
func (q *queue) deadLetter(m *Msg, reason DeathReason, cause error) {
	now := time.Now()
	death := Death{Reason: reason, Exchange: m.Exchange, Queue: q.name, RoutingKey: m.RoutingKey,
		Attempts: m.Attempt, Time: now}
	if cause != nil {
		death.LastError = cause.Error()
	}
	var err error
	switch {
	case q.dlx == "":
		err = errNoDeadLetterExchange
	case reason != ReasonRejected && diedHereBefore(m.Deaths, q.name, reason):
		err = errDeadLetterCycle
	default:
		key := q.dlxKey
		if key == "" {
			key = m.RoutingKey
		}
		deaths := make([]Death, 0, len(m.Deaths)+1)
		deaths = append(append(deaths, death), m.Deaths...)
		err = q.mq.publishDead(q.dlx, m.Data, key, m.Headers, deaths)
	}
	reasonAttr := slog.String("reason", string(reason))
	death.MessageID = m.ID
	rec := DeadLetter{Death: death}
	if err == nil {
		rec.DeadLetterExchange = q.dlx
	} else {
		rec.Dropped, rec.DropCause = true, err.Error()
	}
	q.mq.deadLetters.add(rec)
	if err == nil {
		q.c.deadLettered.Add(1)
		q.logFailure(m, cause, slog.LevelWarn, "tinymq: message dead-lettered", reasonAttr,
			slog.String("dead_letter_exchange", q.dlx))
		return
	}
	q.c.dropped.Add(1)
	q.logFailure(m, cause, slog.LevelError, "tinymq: message dropped", reasonAttr, slog.String("drop_cause", err.Error()))
}

var (
	errNoDeadLetterExchange = errors.New("no dead-letter exchange")
	errDeadLetterCycle      = errors.New("dead-letter cycle")
)

func diedHereBefore(deaths []Death, queue string, reason DeathReason) bool {
	for _, d := range deaths {
		if d.Queue == queue && d.Reason == reason {
			return true
		}
	}
	return false
}

// logFailure logs what became of m, with err, the consumer's error (if any).
func (q *queue) logFailure(m *Msg, err error, level slog.Level, msg string, extra ...slog.Attr) {
	ctx := context.Background()
	if !q.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String("exchange", m.Exchange),
		slog.String("queue", q.name),
		slog.Uint64("msg_id", m.ID),
		slog.Int("attempt", m.Attempt))
	if err != nil {
		attrs = append(attrs, slog.Any("err", err))
		var pe *PanicError
		if errors.As(err, &pe) {
			attrs = append(attrs, slog.String("stack", string(pe.Stack)))
		}
	}
	q.log.LogAttrs(ctx, level, msg, append(attrs, extra...)...)
}
