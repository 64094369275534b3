package tinymq

import (
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// This file is the topology at run time: queues declared without a consumer,
// deleted, purged, paused and expired; bindings and exchanges removed. Each
// call maps onto one RabbitMQ operation (see the README).

// DeclareQueue declares a queue named name, with no consumer, and binds it to
// exchange (declared with kind on first use) with the binding options among
// opts, as RabbitMQ's queue.declare and queue.bind do. Messages wait in it
// until a [MQ.Consume] takes them; TTLs, length limits and head expiry apply
// as usual, and dead letters routed to it wait too (a parking queue).
// Declaring it again with the same settings changes nothing but adding the
// binding, if it is new, and returns nil (another exchange may be bound that
// way); with other settings it returns an error wrapping [ErrDuplicateQueue]
// and changes nothing. A [WithDurable] queue declared after a restart gets
// its backlog from the log. It does not block on consumers; after Stop it
// returns [ErrStopped]. Invalid arguments are refused as by RegisterQueue
// (a [WithQueueName] other than name is [ErrInvalidOption]).
func (m *MQ) DeclareQueue(name, exchange string, kind ExchangeType, opts ...QueueOption) error {
	m.init()
	if name == "" {
		return fmt.Errorf("%w: queue name", ErrEmptyName)
	}
	cfg, hbs, err := queueOptions(kind, opts)
	if err != nil {
		return err
	}
	if cfg.name != "" && cfg.name != name {
		return fmt.Errorf("%w: WithQueueName(%q) in the declare of queue %q", ErrInvalidOption, cfg.name, name)
	}
	cfg.name = name
	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	if q := m.queues[name]; q != nil {
		return m.redeclareLocked(q, exchange, kind, cfg, hbs)
	}
	q, err := m.createQueueLocked(exchange, kind, name, cfg, hbs, nil, 0)
	if err != nil {
		return err
	}
	q.armQueueExpiry()
	return nil
}

// redeclareLocked is DeclareQueue of an existing queue q: the same settings
// add the binding if it is new, and count as a use of q. The caller holds the
// write lock.
func (m *MQ) redeclareLocked(q *queue, exchange string, kind ExchangeType, cfg queueConfig, hbs []headersBinding) error {
	want := cfg
	want.retry = cfg.retry
	if want.retry.MaxAttempts == 0 {
		want.retry.MaxAttempts = 1
	}
	if !q.cfg.same(want) {
		return fmt.Errorf("%w: %q exists with other settings (delete it and declare it again)", ErrDuplicateQueue, q.name)
	}
	if exchange == "" {
		return fmt.Errorf("%w: exchange name", ErrEmptyName)
	}
	ex, err := m.declareLocked(exchange, kind, exchangeConfig{}, false)
	if err != nil {
		return err
	}
	if m.engine != nil {
		spec := QueueSpec{QueueInfo: queueInfo(q.name, 0, q.cfg), Named: true,
			Binding: BindingSpec{Queue: q.name, Exchange: exchange, Kind: kind, Keys: cfg.binding.keys, Args: cfg.binding.args},
			Retry:   q.cfg.retry, Filter: q.cfg.filter}
		if err := m.engine.DeclareQueue(spec); err != nil {
			return err
		}
	}
	if !ex.hasBinding(q, cfg.binding) {
		ex.bind(q, cfg.binding, hbs)
		m.logDeclared(q)
	}
	q.lock()
	q.usedAt = time.Now().UnixNano()
	q.mu.Unlock()
	return nil
}

// createQueueLocked creates the queue name, binds it to exchange, restores a
// durable one's backlog and, with c, subscribes c with concurrency workers.
// The caller holds the write lock, has checked that no queue has the name,
// and validated cfg and hbs.
func (m *MQ) createQueueLocked(exchange string, kind ExchangeType, name string, cfg queueConfig, hbs []headersBinding, c *consumer, concurrency int) (*queue, error) {
	if m.engine != nil {
		return m.createOnEngine(exchange, kind, name, cfg, hbs, c, concurrency)
	}
	if cfg.durable {
		if cfg.name == "" || m.dataDir == "" {
			return nil, fmt.Errorf("%w: a durable queue needs WithQueueName and the MQ WithDataDir", ErrInvalidOption)
		}
		if err := m.openLog(); err != nil {
			return nil, err
		}
	}
	ex, err := m.declareLocked(exchange, kind, exchangeConfig{}, false)
	if err != nil {
		return nil, err
	}
	m.queueSeq++
	q := newQueue(m.queueSeq, name, cfg, m)
	m.queues[name] = q
	m.order = append(m.order, q)
	ex.bind(q, cfg.binding, hbs)
	m.logDeclared(q)
	if cfg.durable {
		m.restore(q)
	}
	if c != nil {
		m.subscribeLocked(q, *c, concurrency)
	}
	return q, nil
}

// createOnEngine is createQueueLocked on an engine. The queue is recorded,
// without workers, so that names stay unique and Bind finds it.
func (m *MQ) createOnEngine(exchange string, kind ExchangeType, name string, cfg queueConfig, hbs []headersBinding, c *consumer, concurrency int) (*queue, error) {
	if exchange == "" {
		return nil, fmt.Errorf("%w: exchange name", ErrEmptyName)
	}
	// An engine would ignore these silently (its QueueSpec.QueueInfo has the
	// fields, always zero): refuse them.
	if cfg.durable { // the broker keeps the queue's messages, durable or not by its own settings
		return nil, fmt.Errorf("%w: WithDurable", ErrUnsupported)
	}
	if cfg.deliveryTimeout > 0 {
		return nil, fmt.Errorf("%w: WithDeliveryTimeout", ErrUnsupported)
	}
	if cfg.rate > 0 {
		return nil, fmt.Errorf("%w: WithRateLimit", ErrUnsupported)
	}
	if cfg.groups {
		return nil, fmt.Errorf("%w: WithGroupOrdering", ErrUnsupported)
	}
	retry := cfg.retry
	if retry.MaxAttempts == 0 {
		retry.MaxAttempts = 1
	}
	spec := QueueSpec{
		QueueInfo: queueInfo(name, concurrency, cfg),
		Named:     cfg.name != "",
		Binding:   BindingSpec{Queue: name, Exchange: exchange, Kind: kind, Keys: cfg.binding.keys, Args: cfg.binding.args},
		Retry:     retry,
		Filter:    cfg.filter,
	}
	if c != nil {
		spec.Consumer = c.fn
	}
	ex, err := m.declareLocked(exchange, kind, exchangeConfig{}, false) // validates the kind
	if err != nil {
		return nil, err
	}
	if err := m.engine.DeclareQueue(spec); err != nil {
		return nil, err
	}
	m.queueSeq++
	q := newQueue(m.queueSeq, name, cfg, m)
	m.queues[name] = q
	m.order = append(m.order, q)
	ex.bind(q, cfg.binding, hbs) // the mirror routes too: typed publish (see checkEnginePayloads)
	if c != nil {
		q.subs = []*Subscription{{m: m, q: q, c: *c, n: concurrency, done: make(chan struct{})}}
		q.active = concurrency
	}
	return q, nil
}

// armQueueExpiry has the scheduler check, once q's WithQueueExpiry has
// passed since its last use, whether q is still unused (see expireQueue).
func (q *queue) armQueueExpiry() {
	if q.cfg.expiry <= 0 || q.mq.engine != nil {
		return
	}
	q.lock()
	if q.expiryArmed || len(q.subs) > 0 || q.gone {
		q.mu.Unlock()
		return
	}
	q.expiryArmed = true
	due := time.Unix(0, q.usedAt).Add(q.cfg.expiry)
	q.mu.Unlock()
	q.mq.sched.add(schedItem{due: due, q: q, expire: true})
}

// expireQueue deletes q if it has been unused for its WithQueueExpiry, or
// checks again when it will have been. The scheduler calls it.
func (m *MQ) expireQueue(q *queue) {
	m.mu.Lock()
	q.lock()
	q.expiryArmed = false
	unused := len(q.subs) == 0 && !q.gone
	due := time.Unix(0, q.usedAt).Add(q.cfg.expiry)
	q.mu.Unlock()
	if m.state >= stateStopping || !unused || m.queues[q.name] != q {
		m.unlock()
		return
	}
	if time.Now().Before(due) {
		m.unlock()
		q.armQueueExpiry()
		return
	}
	// Settling (see MQ.settling) under the MQ's lock, which abortAll takes:
	// the delete's messages reach their end, and it is logged after.
	m.settleBegin()
	defer m.settling.Add(-1)
	d := m.deleteLocked(q, true)
	m.unlock()
	n, err := d.finish()
	if err != nil {
		m.logAttrs(slog.LevelError, "tinymq: the log did not take an expired queue's delete; it may come back after a restart", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.String("queue", q.name), slog.String("err", err.Error()))
		})
	}
	m.logAttrs(slog.LevelInfo, "tinymq: queue expired: unused for its expiry; its messages were removed", func(a []slog.Attr) []slog.Attr {
		return append(a, slog.String("queue", q.name), slog.Duration("expiry", q.cfg.expiry), slog.Int("removed", n))
	})
}

// DeleteQueue deletes the queue, as RabbitMQ's queue.delete does: its
// bindings go, its consumers are cancelled (their deliveries in flight
// finish: a success counts, a failure is not retried), and its waiting
// messages are removed, not dead-lettered. It returns how many waiting
// messages it removed: counted in [Stats].Deleted.Removed and logged. A
// publish racing the delete either reached the queue before it (and is
// counted in what it removed) or does not reach it. For a durable queue the
// delete is one log record: after a crash the queue stays deleted, and
// declaring it again starts it empty; the record is synced whatever
// [WithSync] says. [IfUnused] refuses, with [ErrInUse], a
// queue that has a consumer; [IfEmpty] refuses, with [ErrNotEmpty], one in
// which messages wait or are in a consumer. It blocks only while a durable
// queue's record is written, or a publish it counts is; called from a
// consumer it does not wait for publishes. It returns [ErrUnknownQueue] for
// a queue that does not exist, and [ErrStopped] once Stop has begun.
func (m *MQ) DeleteQueue(name string, opts ...DeleteOption) (int, error) {
	m.init()
	dc, err := deleteOptions(opts)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	if m.state >= stateStopping {
		m.unlock()
		return 0, ErrStopped
	}
	q := m.queues[name]
	if q == nil {
		m.unlock()
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	q.lock()
	inUse := len(q.subs) > 0
	nonEmpty := q.buf.n+q.batchedLocked()+q.scheduled+q.grouped+q.inbound > 0 || q.busy > 0 || q.inFlightLocked() > 0
	q.mu.Unlock()
	switch {
	case dc.ifUnused && inUse:
		m.unlock()
		return 0, fmt.Errorf("%w: queue %q has a consumer", ErrInUse, name)
	case dc.ifEmpty && nonEmpty:
		m.unlock()
		return 0, fmt.Errorf("%w: queue %q", ErrNotEmpty, name)
	}
	if m.engine != nil {
		n, err := m.engine.DeleteQueue(name, dc.ifUnused, dc.ifEmpty)
		if err == nil {
			m.forgetQueueLocked(q)
		}
		m.unlock()
		return n, err
	}
	d := m.deleteLocked(q, false)
	m.unlock()
	n, err := d.finish()
	m.logAttrs(slog.LevelInfo, "tinymq: queue deleted; its waiting messages were removed", func(a []slog.Attr) []slog.Attr {
		return append(a, slog.String("queue", name), slog.Int("removed", n))
	})
	if err != nil {
		return n, fmt.Errorf("queue %q is deleted, but it may come back after a restart: %w", name, err)
	}
	return n, nil
}

// deletion is what deleteLocked leaves for finish, once the MQ's lock is
// released.
type deletion struct {
	m       *MQ
	q       *queue
	removed int
	keys    []string          // the durable messages removed, to acknowledge with the delete's record
	upTo    map[string]uint64 // the IDs so far, for the durable queue's tombstone (see durableLog.deleteQueue)
	inbound chan struct{}     // closed when the last inbound publish arrived; nil: none
}

// deleteLocked deletes q: it takes it out of every exchange and of the MQ,
// cancels its subscriptions and removes its waiting messages, and counts
// them. The caller holds the write lock, and calls finish once it released
// it.
func (m *MQ) deleteLocked(q *queue, expired bool) *deletion {
	m.forgetQueueLocked(q)
	m.deletedQueues++
	if expired {
		m.expiredQueues++
	}
	d := &deletion{m: m, q: q}
	if q.cfg.durable && m.dur != nil {
		d.upTo = m.idsUpTo()
	}
	q.lock()
	q.gone, q.closed = true, true
	q.shut.Store(true)
	for _, s := range q.subs {
		q.cancelLocked(s)
	}
	d.removed = q.buf.n + q.scheduled + q.grouped
	for q.buf.n > 0 {
		e := q.popLocked()
		if k := e.dkey(); k != "" {
			d.keys = append(d.keys, k)
		}
	}
	q.dropBacklogsLocked(func(e *entry) {
		if k := e.dkey(); k != "" {
			d.keys = append(d.keys, k)
		}
	})
	q.scheduled = 0
	q.gen++
	q.freeRoomLocked()
	if q.inbound > 0 {
		q.inboundGone = make(chan struct{})
		d.inbound = q.inboundGone
	}
	q.mu.Unlock()
	q.cond.Broadcast()
	for _, it := range m.sched.dropQueue(q) {
		if it.m != nil {
			if k := it.m.dkey(); k != "" {
				d.keys = append(d.keys, k)
			}
		}
	}
	q.c.removed.Add(uint64(d.removed))
	m.deletedStats(true) // folds the queues deleted before that have settled
	m.deleted = append(m.deleted, q)
	return d
}

// forgetOnEngine is an engine's EngineConfig.Forget: the broker deleted the
// queue (its x-expires passed).
func (m *MQ) forgetOnEngine(name string) {
	m.mu.Lock()
	defer m.unlock()
	if q := m.queues[name]; q != nil {
		m.forgetQueueLocked(q)
		q.lock()
		q.gone = true
		for _, s := range q.subs {
			q.cancelLocked(s)
		}
		q.mu.Unlock()
	}
}

// forgetQueueLocked takes q out of every exchange and of the MQ's maps. The
// caller holds the write lock.
func (m *MQ) forgetQueueLocked(q *queue) {
	for _, ex := range m.exchanges {
		ex.unbindQueue(q, nil)
	}
	delete(m.queues, q.name)
	m.order = slices.DeleteFunc(m.order, func(o *queue) bool { return o == q })
}

// finish ends a delete once the MQ's lock is released: it writes a durable
// queue's record (waiting for its sync), then waits for the publishes that
// the queue had admitted before it was deleted, unless called from the MQ's
// own goroutines. It returns how many messages the delete removed, and the
// log's error if the record could not be written.
func (d *deletion) finish() (int, error) {
	q := d.q
	var err error
	if d.upTo != nil {
		err = d.m.dur.deleteQueue(q.name, d.keys, d.upTo)
	}
	if d.inbound != nil && !d.m.own.Mine() {
		<-d.inbound
		return int(q.c.removed.Load()), err
	}
	return d.removed, err
}

// removedInFlight settles a failed delivery of a deleted queue: no retry,
// no dead letter (as for the messages the delete removed); it is counted as
// removed, and logged. It reports false for a queue that was not deleted.
func (q *queue) removedInFlight(m *Msg, err error) bool {
	q.lock()
	gone := q.gone
	q.mu.Unlock()
	if !gone {
		return false
	}
	q.removeInFlight(m, err)
	return true
}

// removeInFlight counts and logs m, whose delivery failed after its queue
// was deleted, as removed, and acknowledges it in the log.
func (q *queue) removeInFlight(m *Msg, err error) {
	q.c.removed.Add(1)
	if k := m.dkey(); k != "" {
		q.mq.dur.ack(q.name, k, nil)
	}
	q.logFailure(m, err, slog.LevelWarn, "tinymq: delivery failed after its queue was deleted; the message is removed")
}

// PurgeQueue removes the messages waiting in the queue (ready, delayed, or
// waiting for a retry), not those in a consumer, and returns how many, as
// RabbitMQ's queue.purge does. They are counted in the queue's
// [QueueStats].Purged and logged, not dead-lettered. For a durable queue the
// purge is one log record, synced whatever [WithSync] says: a purged message
// never comes back. It blocks only
// while that record is written. It returns [ErrUnknownQueue] for a queue that
// does not exist, and [ErrStopped] once Stop has begun.
func (m *MQ) PurgeQueue(name string) (int, error) {
	m.init()
	m.mu.RLock()
	if m.state >= stateStopping {
		m.mu.RUnlock()
		return 0, ErrStopped
	}
	q := m.queues[name]
	if q == nil {
		m.mu.RUnlock()
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if m.engine != nil {
		m.mu.RUnlock()
		return m.engine.PurgeQueue(name) // the engine counts it in its Stats
	}
	var keys []string
	q.lock()
	q.giveBackLocked(q.workers)
	n := q.buf.n + q.scheduled + q.grouped
	for q.buf.n > 0 {
		e := q.popLocked() // a grouped one brings the next of its group into buf
		if k := e.dkey(); k != "" {
			keys = append(keys, k)
		}
	}
	q.dropBacklogsLocked(func(e *entry) { // the groups whose message is out
		if k := e.dkey(); k != "" {
			keys = append(keys, k)
		}
	})
	scheduled := q.scheduled > 0
	q.begun.Add(uint64(q.scheduled))
	q.scheduled = 0
	q.gen++
	q.purgeGen = q.gen
	gen := q.gen
	q.freeRoomLocked()
	q.reportIfQuiescentLocked()
	q.mu.Unlock()
	if scheduled {
		items := m.sched.dropPurged(q, gen)
		for _, it := range items {
			if k := it.m.dkey(); k != "" {
				keys = append(keys, k)
			}
		}
		if q.cfg.groups {
			// A retry held its group (WithGroupOrdering): the group goes on.
			// (A retry the scheduler had already taken goes on in release.)
			q.lock()
			for _, it := range items {
				if it.m.Attempt > 0 {
					q.groupDoneLocked(it.m.Group())
				}
			}
			q.mu.Unlock()
		}
	}
	q.c.purged.Add(uint64(n))
	m.mu.RUnlock()
	var err error
	if q.cfg.durable && len(keys) > 0 {
		if err = m.dur.ackAll(q.name, keys); err != nil {
			err = fmt.Errorf("queue %q is purged, but its messages may come back after a restart: %w", name, err)
		}
	}
	if n > 0 {
		m.logAttrs(slog.LevelInfo, "tinymq: queue purged", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.String("queue", name), slog.Int("removed", n))
		})
	}
	return n, err
}

// PauseQueue pauses the queue: it goes on accepting messages (TTLs and
// length limits apply as usual) but hands none to its consumers until
// [MQ.ResumeQueue]; deliveries in flight finish, and what the workers had
// taken and not begun goes back to the head of the queue. Stop does not
// wait for a paused queue's messages: it reports them as undelivered (a
// durable queue keeps them in the log). Pausing a paused queue does nothing.
// It does not block. It returns [ErrUnknownQueue] for a queue that does not
// exist, and [ErrStopped] once Stop has begun.
func (m *MQ) PauseQueue(name string) error {
	return m.setPaused(name, true)
}

// ResumeQueue resumes a queue that [MQ.PauseQueue] paused: its consumers
// take its messages again. Resuming a queue that is not paused does nothing.
// It does not block. It returns [ErrUnknownQueue] for a queue that does not
// exist, and [ErrStopped] once Stop has begun.
func (m *MQ) ResumeQueue(name string) error {
	return m.setPaused(name, false)
}

func (m *MQ) setPaused(name string, paused bool) error {
	m.init()
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	q := m.queues[name]
	if q == nil {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if m.engine != nil {
		var err error
		if paused {
			err = m.engine.PauseQueue(name)
		} else {
			err = m.engine.ResumeQueue(name)
		}
		if err != nil {
			return err
		}
	}
	q.lock()
	changed := q.paused != paused
	q.paused = paused
	if changed {
		m.topologyClock().Add(1) // QueueInfo.Paused
		if paused {
			q.giveBackLocked(q.workers)
		}
	}
	q.reportIfQuiescentLocked()
	q.mu.Unlock()
	if changed {
		q.cond.Broadcast()
	}
	return nil
}

// Unbind removes the binding of the queue to exchange that the binding
// options name (the same keys, or arguments), as RabbitMQ's queue.unbind
// does; a binding that does not exist is not an error. A publish racing the
// unbind reaches the queue through that binding before it, or not at all.
// It does not block. It returns [ErrUnknownQueue] or [ErrUnknownExchange] for
// names that do not exist, an error matching [ErrInvalidBinding] for options
// that do not fit the exchange's kind, and [ErrStopped] once Stop has begun.
func (m *MQ) Unbind(queue, exchange string, opts ...BindingOption) error {
	m.init()
	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	q := m.queues[queue]
	if q == nil {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	ex := m.exchanges[exchange]
	if ex == nil {
		return fmt.Errorf("%w: %q", ErrUnknownExchange, exchange)
	}
	b, _, err := bindingOptions(ex.kind, opts)
	if err != nil {
		return err
	}
	if m.engine != nil {
		if err := m.engine.Unbind(BindingSpec{Queue: queue, Exchange: exchange, Kind: ex.kind, Keys: b.keys, Args: b.args}); err != nil {
			return err
		}
	}
	ex.unbindQueue(q, &b)
	m.logDeclared(q)
	return nil
}

// DeleteExchange deletes the exchange and its bindings, as RabbitMQ's
// exchange.delete does; the queues stay. Publishing to it then returns
// [ErrUnknownExchange], and an exchange whose alternate it was, or a queue
// whose dead-letter exchange it was, routes nothing there. Declaring it again
// makes a new exchange; its message IDs go on from the old one's. [IfUnused]
// refuses, with [ErrInUse], an exchange that has bindings. It does not block.
// It returns [ErrUnknownExchange] for an exchange that does not exist, and
// [ErrStopped] once Stop has begun.
func (m *MQ) DeleteExchange(name string, opts ...DeleteOption) error {
	m.init()
	dc, err := deleteOptions(opts)
	if err != nil {
		return err
	}
	if dc.ifEmpty {
		return fmt.Errorf("%w: IfEmpty is for queues", ErrInvalidOption)
	}
	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	ex := m.exchanges[name]
	if ex == nil {
		return fmt.Errorf("%w: %q", ErrUnknownExchange, name)
	}
	if dc.ifUnused && len(ex.bindings) > 0 {
		return fmt.Errorf("%w: exchange %q has %d bindings", ErrInUse, name, len(ex.bindings))
	}
	if m.engine != nil {
		if err := m.engine.DeleteExchange(name, dc.ifUnused); err != nil {
			return err
		}
	}
	delete(m.exchanges, name)
	for _, s := range ex.bindings { // their durable queues' records lose these bindings
		if q := m.queues[s.Queue]; q != nil {
			m.logDeclared(q)
		}
	}
	m.lastEx.CompareAndSwap(ex, nil)
	ex.gone = true
	if m.retiredSeqs == nil {
		m.retiredSeqs = make(map[string]retiredSeq)
	}
	m.retiredSeqs[name] = retiredSeq{seq: ex.seq.Load(), reserved: ex.reserved.Load()}
	if m.dur != nil {
		m.dur.forgetDedup(ex) // queued under the lock, without waiting for the disk
	}
	return nil
}

// retiredSeq is where a deleted exchange's IDs ended, for the exchange of its
// name declared next.
type retiredSeq struct {
	seq, reserved uint64
}
