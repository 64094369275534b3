package tinymq

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"
)

// Publish is [MQ.PublishContext] with a context that never ends. It blocks only
// while a matching queue with a [Block] length limit is full.
func (m *MQ) Publish(exchange string, data any, opts ...PublishOption) error {
	return m.PublishContext(context.Background(), exchange, data, opts...)
}

// PublishContext routes data through the named exchange and accepts it into
// every matching queue, where each gets its own [Msg] sharing data. It returns
// nil once the message is accepted: from then on it is delivered, retried,
// dead-lettered, or reported (logged and counted in [MQ.Stats]), never silently
// lost. Delivery happens later on the queues' workers: PublishContext never
// waits for a consumer, and waits at all only while a matching queue with a
// [Block] length limit is full, until ctx ends.
//
// It returns an error, and no queue gets the message, when: the exchange does
// not exist ([ErrUnknownExchange]); no queue matches and no alternate exchange
// takes the message ([ErrNoRoute]); a matching queue is full
// ([ErrQueueFull], wrapping ctx.Err() when waiting for room ended); an option
// is invalid ([ErrKeyTooLong], [ErrInvalidHeaders], [ErrInvalidOption]); a
// filter panics ([*PanicError]); or Stop has begun ([ErrStopped]). Publishing
// before Start is allowed: the message waits for Start. It is safe for
// concurrent use.
func (m *MQ) PublishContext(ctx context.Context, exchange string, data any, opts ...PublishOption) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	var pc publishConfig
	if len(opts) > 0 {
		if err := pc.apply(opts); err != nil {
			return err
		}
	}
	if m.engine != nil {
		return m.publishOnEngine(ctx, exchange, data, &pc)
	}
	for {
		m.mu.RLock()
		r := m.publishLocked(exchange, data, &pc, nil, false)
		m.mu.RUnlock()
		if r.room == nil {
			settleEvicted(r.evicted)
			return r.err
		}
		select {
		case <-r.room:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for room: %w", ErrQueueFull, ctx.Err())
		}
	}
}

// publishDead publishes a dead-lettered message. It never blocks: a full
// queue refuses it whatever its overflow, and it goes on while the MQ stops.
func (m *MQ) publishDead(exchange string, data any, key string, headers map[string]any, deaths []Death) error {
	pc := publishConfig{routingKey: key, headers: headers}
	m.mu.RLock()
	r := m.publishLocked(exchange, data, &pc, deaths, true)
	m.mu.RUnlock()
	settleEvicted(r.evicted)
	return r.err
}

// publishResult is what publishLocked did: err, or wait on room and try
// again, or dead-letter the messages that DropHead evicted.
type publishResult struct {
	err     error
	room    <-chan struct{}
	evicted []eviction
}

type eviction struct {
	q *queue
	m *Msg
}

func settleEvicted(evs []eviction) {
	for _, e := range evs {
		e.q.c.overflowed.Add(1)
		e.q.deadLetter(e.m, ReasonMaxLen, nil)
	}
}

// publishLocked routes and enqueues under the read lock, so that Stop, which
// takes the write lock, sees each publish either completely or not at all.
// internal publishes (dead letters) go on while the MQ stops.
func (m *MQ) publishLocked(name string, data any, pc *publishConfig, deaths []Death, internal bool) publishResult {
	if !internal && m.state >= stateStopping {
		return publishResult{err: ErrStopped}
	}
	ex := m.exchanges[name]
	if ex == nil {
		return publishResult{err: fmt.Errorf("%w: %q", ErrUnknownExchange, name)}
	}
	var qbuf [8]*queue
	var mbuf [8]*Msg
	// A plain message needs no Msg of its own until a worker delivers it.
	plain := pc.routingKey == "" && pc.headers == nil && pc.ttl == 0 && pc.delay == 0 && deaths == nil
	// Follow alternate exchanges; a cycle ends after every exchange was tried.
	for cur, hops := ex, 0; cur != nil && hops <= len(m.exchanges); hops++ {
		dst := cur.route(pc.routingKey, pc.headers, qbuf[:0])
		msgs := mbuf[:0]
		n := 0
		for _, q := range dst {
			if plain && q.takesShared() {
				dst[n] = q
				msgs = append(msgs, ex.proto)
				n++
				continue
			}
			msg := &Msg{Exchange: ex.name, Queue: q.name, RoutingKey: pc.routingKey, Headers: pc.headers, Data: data, Deaths: deaths}
			if q.filter != nil {
				keep, err := runFilter(q.filter, msg)
				if err != nil {
					return publishResult{err: err}
				}
				if !keep {
					continue
				}
			}
			dst[n] = q
			msgs = append(msgs, msg)
			n++
		}
		if n > 0 {
			return enqueue(ex, dst[:n], msgs, data, pc, internal)
		}
		if cur.cfg.alternate == "" {
			break
		}
		cur = m.exchanges[cur.cfg.alternate]
	}
	ex.unroutable.Add(1)
	return publishResult{err: fmt.Errorf("%w: exchange %q, routing key %q", ErrNoRoute, name, pc.routingKey)}
}

// enqueue accepts msgs[i] into dst[i], all or none. The one exception: a dead
// letter published while Shutdown's deadline is aborting the queues may reach
// some of them before it meets a closed one; it then counts as dropped.
func enqueue(ex *exchange, dst []*queue, msgs []*Msg, data any, pc *publishConfig, internal bool) publishResult {
	timed := pc.delay > 0 || pc.ttl > 0
	bounded := false
	for _, q := range dst {
		timed = timed || q.ttl > 0
		bounded = bounded || q.maxLen > 0
	}
	var now time.Time
	if timed {
		now = time.Now()
	}
	if !bounded && pc.delay == 0 {
		// The common case: no queue can refuse the message (they close only
		// after Stop took the write lock, or when aborted), so one queue at a
		// time will do.
		id := ex.seq.Add(1)
		for i, q := range dst {
			e := newEntry(msgs[i], id, data)
			q.mu.Lock()
			if q.closed {
				q.mu.Unlock()
				return publishResult{err: ErrStopped}
			}
			_, wake := q.enqueueLocked(e, now, 0, pc.ttl)
			q.mu.Unlock()
			if wake {
				q.cond.Signal()
			}
		}
		return publishResult{}
	}
	return enqueueBounded(ex, dst, msgs, data, pc, now, internal)
}

// enqueueBounded is enqueue where a queue may refuse the message: it locks
// every queue (in id order, the one order all multi-queue lockers use), checks
// their limits, then stamps the ID and enqueues.
func enqueueBounded(ex *exchange, dst []*queue, msgs []*Msg, data any, pc *publishConfig, now time.Time, internal bool) publishResult {
	sortByID(dst, msgs)
	for _, q := range dst {
		q.mu.Lock()
	}
	unlockAll := func() {
		for _, q := range dst {
			q.mu.Unlock()
		}
	}
	for _, q := range dst {
		if q.closed {
			unlockAll()
			return publishResult{err: ErrStopped}
		}
		if !q.fullLocked() || q.overflow == DropHead {
			continue
		}
		if q.overflow == Block && !internal {
			room := q.roomLocked()
			unlockAll()
			return publishResult{room: room}
		}
		unlockAll()
		q.c.rejected.Add(1)
		return publishResult{err: fmt.Errorf("%w: %q", ErrQueueFull, q.name)}
	}
	id := ex.seq.Add(1)
	var res publishResult
	var wbuf [8]bool
	wake := wbuf[:0]
	for i, q := range dst {
		ev, w := q.enqueueLocked(newEntry(msgs[i], id, data), now, pc.delay, pc.ttl)
		if ev != nil {
			res.evicted = append(res.evicted, eviction{q, ev})
		}
		wake = append(wake, w)
	}
	unlockAll()
	for i, q := range dst {
		if wake[i] {
			q.cond.Signal()
		}
		if pc.delay > 0 && !evictedSelf(res.evicted, msgs[i]) {
			q.mq.sched.add(now.Add(pc.delay), q, msgs[i])
		}
	}
	return res
}

// newEntry is the entry for message m, stamped with id: m is its exchange's
// prototype (a plain message: the entry carries id and data) or the queue's
// own Msg, which gets the id.
func newEntry(m *Msg, id uint64, data any) entry {
	if m.shared {
		return entry{m: m, id: id, data: data}
	}
	m.ID = id
	return entry{m: m}
}

// evictedSelf reports whether DropHead turned m away on arrival.
func evictedSelf(evs []eviction, m *Msg) bool {
	for _, e := range evs {
		if e.m == m {
			return true
		}
	}
	return false
}

// sortByID sorts dst by queue id, keeping msgs in step: an insertion sort, as
// dst is short and usually sorted.
func sortByID(dst []*queue, msgs []*Msg) {
	for i := 1; i < len(dst); i++ {
		for j := i; j > 0 && dst[j].id < dst[j-1].id; j-- {
			dst[j], dst[j-1] = dst[j-1], dst[j]
			msgs[j], msgs[j-1] = msgs[j-1], msgs[j]
		}
	}
}

// runFilter calls a queue's filter, turning a panic into an error.
func runFilter(keep func(*Msg) bool, msg *Msg) (ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return keep(msg), nil
}

// publishOnEngine is PublishContext on an engine. It holds the read lock so
// that Stop, which takes the write lock, sees each publish completely or not
// at all, as in memory.
func (m *MQ) publishOnEngine(ctx context.Context, exchange string, data any, pc *publishConfig) error {
	if exchange == "" {
		return fmt.Errorf("%w: exchange name", ErrEmptyName)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	return m.engine.Publish(ctx, Publishing{Exchange: exchange, RoutingKey: pc.routingKey, Headers: pc.headers,
		Data: data, Expiration: pc.ttl, Delay: pc.delay})
}
