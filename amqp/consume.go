package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/backoff"
	"github.com/tinymq/tinymq/internal/guard"
	"github.com/tinymq/tinymq/internal/hist"
)

// cqueue is one registered queue and its consumer.
//
// Goroutines: run, the queue's manager, is started by startQueue and joined
// by finish (mgrWG); it starts the queue's workers (wrkWG, joined by finish;
// also by run itself unless a Shutdown deadline passed). The manager opens a
// channel on the consuming connection, consumes, and publishes the delivery
// channel in cur; the workers take deliveries from whichever cur is current,
// so they live across reconnects. Lock order: engine mu before cqueue mu.
type cqueue struct {
	e        *engine
	spec     tinymq.QueueSpec
	prefetch int
	waits    []int64 // the retry wait of attempt i+1, in ms, before jitter
	waitQs   []string
	tag      string // consumer tag

	mu       sync.Mutex
	cur      <-chan amqp091.Delivery // nil while not consuming
	changed  chan struct{}           // closed and replaced when cur or stopping change
	stopping bool

	workers sync.WaitGroup

	inFlight atomic.Int64
	c        queueCounters
	hist     hist.Histogram // the core's buckets: ConsumerTime means the same on both engines
}

type queueCounters struct {
	delivered, succeeded, failed, retried, deadLettered, dropped atomic.Uint64
}

// retryBackoff is the backoff of a queue's retry policy, computed as the
// core computes it.
func retryBackoff(p tinymq.RetryPolicy) backoff.Policy {
	return backoff.Policy{Initial: p.InitialBackoff, Max: p.MaxBackoff, Multiplier: p.Multiplier, Jitter: p.Jitter}
}

// retryWaits returns the backoffs of a policy before jitter, in ms, by failed
// attempt, up to the first that reaches MaxBackoff: every later attempt
// waits as long (see waitFor).
func retryWaits(p tinymq.RetryPolicy) []int64 {
	b := retryBackoff(p)
	var waits []int64
	for a := 1; a < p.MaxAttempts; a++ {
		d := b.Base(a)
		waits = append(waits, millis(d))
		if d >= p.MaxBackoff {
			break // every later wait is the same
		}
	}
	return waits
}

// waitFor returns the wait queue and the wait after the given failed attempt.
func (q *cqueue) waitFor(attempt int) (queue string, ms int64) {
	i := min(attempt, len(q.waits)) - 1
	return q.waitQs[i], q.waits[i]
}

func newQueue(e *engine, spec tinymq.QueueSpec, prefetch int) *cqueue {
	q := &cqueue{e: e, spec: spec, prefetch: prefetch, changed: make(chan struct{})}
	q.tag = "tinymq-" + strconv.FormatUint(rand.Uint64(), 36)
	if spec.Retry.MaxAttempts > 1 {
		q.waits = retryWaits(spec.Retry)
		for _, ms := range q.waits {
			q.waitQs = append(q.waitQs, retryQueueName(spec.Name, ms))
		}
	}
	return q
}

// run is the queue's manager (see cqueue).
func (q *cqueue) run(ctx context.Context) {
	defer q.e.mgrWG.Done()
	defer q.e.own.Leave(q.e.own.Enter()) // it logs: the logger may call Stop
	for range q.spec.Concurrency {
		q.workers.Add(1)
		q.e.wrkWG.Add(1)
		go q.work(ctx)
	}
	// failed counts the attempts since the last that got as far as consuming.
	failed := 0
	for {
		conn, lost, ok := q.e.waitSub()
		if !ok {
			break
		}
		stopped, consumed := q.consume(conn, lost)
		if stopped {
			return
		}
		if consumed {
			failed = 0
		}
		failed++
		t := time.NewTimer(q.e.cfg.reconnect.Wait(failed))
		select {
		case <-t.C:
		case <-q.e.stop:
			t.Stop()
		}
	}
	q.setStopping()
	q.awaitWorkers()
}

// consume consumes on one channel until it or its connection is lost, or
// the engine stops. stopped says that it handled the stop; consumed, that it
// got as far as consuming.
func (q *cqueue) consume(conn *amqp091.Connection, lost <-chan struct{}) (stopped, consumed bool) {
	ch, err := conn.Channel()
	if err != nil {
		return false, false
	}
	defer ch.Close()
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	if err := ch.Qos(q.prefetch, 0, false); err != nil {
		q.e.logWarn("tinymq/amqp: setting the prefetch failed", "queue", q.spec.Name, "err", err.Error())
		return false, false
	}
	dels, err := ch.Consume(q.spec.Name, q.tag, false, false, false, false, nil)
	if err != nil {
		q.e.logWarn("tinymq/amqp: consuming failed; declaring and trying again", "queue", q.spec.Name, "err", err.Error())
		if !conn.IsClosed() {
			q.e.redeclareAll(conn) // the queue may have been deleted
		}
		return false, false
	}
	q.setCur(dels)
	select {
	case <-lost:
	case aerr := <-closed:
		q.e.logWarn("tinymq/amqp: consumer channel closed; consuming again", "queue", q.spec.Name, "err", guard.ErrorText(aerr))
	case _, ok := <-cancelled:
		if !ok {
			return false, true // the channel closed: closed or lost says why
		}
		q.e.logWarn("tinymq/amqp: the broker cancelled the consumer (queue deleted?); declaring and consuming again", "queue", q.spec.Name)
		q.e.redeclareAll(conn)
	case <-q.e.stop:
		// Stop taking new deliveries; the workers finish the messages they
		// are in, hand back what the library had buffered, and return when
		// the delivery channel closes. Then closing the channel requeues
		// whatever is still unacknowledged.
		q.setStopping()
		if err := ch.Cancel(q.tag, false); err != nil {
			_ = ch.Close() // the workers must not wait for a cancel that never comes
		}
		q.awaitWorkers()
		return true, true
	}
	return false, true
}

// awaitWorkers waits for this queue's workers, or until a Shutdown deadline
// passed: then finish waits for them.
func (q *cqueue) awaitWorkers() {
	done := make(chan struct{})
	go func() { // joined below, or ends when the workers do
		q.workers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-q.e.abort:
	}
}

func (q *cqueue) setCur(c <-chan amqp091.Delivery) {
	q.mu.Lock()
	q.cur = c
	close(q.changed)
	q.changed = make(chan struct{})
	q.mu.Unlock()
}

func (q *cqueue) setStopping() {
	q.mu.Lock()
	if !q.stopping {
		q.stopping = true
		close(q.changed)
		q.changed = make(chan struct{})
	}
	q.mu.Unlock()
}

// next returns the next delivery, waiting across reconnects; ok is false
// when the queue stops and its current delivery channel is drained.
func (q *cqueue) next() (d amqp091.Delivery, stopping, ok bool) {
	for {
		q.mu.Lock()
		cur, changed, stopping := q.cur, q.changed, q.stopping
		q.mu.Unlock()
		if cur == nil {
			if stopping {
				return d, true, false
			}
			<-changed
			continue
		}
		select {
		case d, ok := <-cur:
			if ok {
				return d, stopping, true
			}
			q.mu.Lock()
			if q.cur == cur {
				q.cur = nil
			}
			q.mu.Unlock()
		case <-changed:
		}
	}
}

// work is one worker; see cqueue. A consumer that ends the goroutine with
// runtime.Goexit (as t.FailNow does) fails its delivery, and a new goroutine
// takes over the slot, so the queue keeps its workers.
func (q *cqueue) work(ctx context.Context) {
	id := q.e.own.Enter()
	returned := false
	defer func() {
		q.e.own.Leave(id)
		if !returned {
			// Neither count has reached 0: this goroutine has not called Done.
			q.workers.Add(1)
			q.e.wrkWG.Add(1)
			go q.work(ctx)
		}
		q.workers.Done()
		q.e.wrkWG.Done()
	}()
	for {
		d, stopping, ok := q.next()
		if !ok {
			returned = true
			return
		}
		if stopping {
			_ = d.Nack(false, true) // not begun: back to the broker for the next consumer
			continue
		}
		q.handle(ctx, &d)
	}
}

// handle runs the consumer on one delivery and settles it.
func (q *cqueue) handle(ctx context.Context, d *amqp091.Delivery) {
	m := q.e.toMsg(q.spec.Name, d)
	q.c.delivered.Add(1)
	q.inFlight.Add(1)
	start := time.Now()
	err := q.process(ctx, d, m, start)
	q.done(start)
	q.settle(d, m, err)
}

func (q *cqueue) done(start time.Time) {
	q.hist.Observe(time.Since(start))
	q.inFlight.Add(-1)
}

// process runs the consumer and returns its error frozen (see freezer), as
// the core does: a panic becomes a *tinymq.PanicError whose value is its
// text, a typed nil error one wrapping tinymq.ErrTypedNil, and any other
// error one whose methods never run the consumer's code again, so that
// settle and logMsg cannot. If the consumer calls runtime.Goexit (or its
// error's methods do), process settles the delivery itself with
// tinymq.ErrGoexit, as the goroutine will not return to do it.
func (q *cqueue) process(ctx context.Context, d *amqp091.Delivery, m *tinymq.Msg, start time.Time) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			err = freezer.FreezeAside(&q.e.own, &tinymq.PanicError{Value: r, Stack: debug.Stack()})
			return
		}
		q.done(start)
		q.settle(d, m, fmt.Errorf("%w (queue %q)", tinymq.ErrGoexit, q.spec.Name))
	}()
	err = q.spec.Consumer(ctx, m)
	if err != nil {
		err = freezer.Freeze(err) // still guarded: its methods may call Goexit too
	}
	returned = true
	return err
}

// freezer freezes consumers' errors into the core's types, as the core does.
var freezer = guard.Freezer[*tinymq.PanicError]{
	TypedNil:  tinymq.ErrTypedNil,
	Permanent: tinymq.ErrPermanent,
	Panicked:  tinymq.ErrPanicked,
	Unpack:    func(pe *tinymq.PanicError) (any, []byte) { return pe.Value, pe.Stack },
	Pack: func(text string, stack []byte) *tinymq.PanicError {
		return &tinymq.PanicError{Value: text, Stack: stack}
	},
}

// settle acks a success; retries a failure through a wait queue, then acks;
// or nacks it without requeue, which the broker dead-letters to the queue's
// x-dead-letter-exchange.
func (q *cqueue) settle(d *amqp091.Delivery, m *tinymq.Msg, err error) {
	if err == nil {
		q.c.succeeded.Add(1)
		if aerr := d.Ack(false); aerr != nil {
			q.logMsg(slog.LevelWarn, m, "tinymq/amqp: ack failed; the broker will deliver the message again", aerr)
		}
		return
	}
	q.c.failed.Add(1)
	select {
	case <-q.e.abort:
		// Past a Shutdown deadline: neither retry nor dead-letter a message
		// whose consumer was cut short. Its channel is closing; the broker
		// delivers it again, marked redelivered, to the next consumer.
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: delivery failed after the shutdown deadline; the broker delivers it again", err)
		return
	default:
	}
	if m.Attempt < q.spec.Retry.MaxAttempts && !guard.Is(err, tinymq.ErrPermanent) {
		if rerr := q.retry(d, m); rerr != nil {
			q.logMsg(slog.LevelError, m, "tinymq/amqp: delivery failed and its retry could not be scheduled; the broker delivers it again at once", err,
				slog.String("retry_err", rerr.Error()))
			_ = d.Nack(false, true)
			return
		}
		q.c.retried.Add(1)
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: delivery failed, will retry", err)
		if aerr := d.Ack(false); aerr != nil {
			q.logMsg(slog.LevelWarn, m, "tinymq/amqp: ack after scheduling a retry failed; the message may run twice", aerr)
		}
		return
	}
	if q.spec.DeadLetterExchange != "" {
		q.c.deadLettered.Add(1)
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: message dead-lettered", err,
			slog.String("reason", string(tinymq.ReasonRejected)), slog.String("dead_letter_exchange", q.spec.DeadLetterExchange))
	} else {
		q.c.dropped.Add(1)
		q.logMsg(slog.LevelError, m, "tinymq/amqp: message dropped", err,
			slog.String("reason", string(tinymq.ReasonRejected)), slog.String("drop_cause", "no dead-letter exchange"))
	}
	if aerr := d.Nack(false, false); aerr != nil {
		q.logMsg(slog.LevelWarn, m, "tinymq/amqp: nack failed; the broker will deliver the message again", aerr)
	}
}

// retry publishes a copy of d to the wait queue of attempt m.Attempt, with
// d's properties and headers (x-death included, which counts the attempts)
// and its routing key, and waits for the broker's confirm.
func (q *cqueue) retry(d *amqp091.Delivery, m *tinymq.Msg) error {
	wait, ms := q.waitFor(m.Attempt)
	if q.spec.Retry.Jitter > 0 {
		ms = millis(retryBackoff(q.spec.Retry).Jittered(time.Duration(ms) * time.Millisecond))
	}
	h := make(amqp091.Table, len(d.Headers)+4)
	for k, v := range d.Headers {
		h[k] = v
	}
	h[hdrWait] = wait
	h[hdrQueue] = q.spec.Name
	h[hdrExchange] = m.Exchange
	h[hdrAttempt] = int64(m.Attempt + 1)
	msg := amqp091.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp091.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
	if q.spec.Retry.Jitter > 0 {
		msg.Expiration = strconv.FormatInt(ms, 10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.e.cfg.publishTimeout)
	defer cancel()
	return q.e.publishConfirmed(ctx, waitExchange, d.RoutingKey, &msg)
}

// logMsg logs what became of m, with the consumer's error.
func (q *cqueue) logMsg(level slog.Level, m *tinymq.Msg, msg string, err error, extra ...slog.Attr) {
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String("exchange", m.Exchange),
		slog.String("queue", q.spec.Name),
		slog.Uint64("msg_id", m.ID),
		slog.Int("attempt", m.Attempt))
	if err != nil {
		attrs = append(attrs, slog.String("err", guard.ErrorText(err)))
		if pe, _ := guard.As[*tinymq.PanicError](err); pe != nil {
			attrs = append(attrs, slog.String("stack", string(pe.Stack)))
		}
	}
	q.e.logAttrs(level, msg, append(attrs, extra...)...)
}
