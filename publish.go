package tinymq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
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
// is invalid ([ErrKeyTooLong], [ErrInvalidHeaders], [ErrInvalidOption]); the
// message is larger than [WithMaxMessageSize] allows ([ErrTooLarge]); a
// filter panics ([*PanicError]); a matching queue of a typed consumer
// ([RegisterHandler] and its kin) could never take data ([ErrPayloadType]);
// or Stop has begun ([ErrStopped]). With [WithDeduplicationID], a publish of
// an ID that the exchange accepted within its window returns nil and routes
// nothing (even once Stop has begun), and one of an ID whose first publish
// is under way waits for it. Publishing before Start is allowed: the message
// waits for Start. It is safe for concurrent use.
func (m *MQ) PublishContext(ctx context.Context, exchange string, data any, opts ...PublishOption) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	m.init()
	if m.pubChain != nil {
		return m.publishThrough(ctx, exchange, data, opts)
	}
	if len(opts) == 0 {
		if done, err := m.publishPlain(exchange, data); done {
			return err
		}
	}
	r := records{data: data} // on the stack: publishThrough has its own
	if len(opts) > 0 {
		if err := r.pc.apply(opts); err != nil {
			return err
		}
	}
	return m.publishChecked(ctx, exchange, &r)
}

// publishPlain is PublishContext for a publish with no options, to the
// exchange last published to, when that publish is plain (see
// exchange.plain) and nothing is durable: the common case, without the
// records the general path fills in. It reports whether it published (or
// refused data too large, or saw Stop begun); when it did not, the general
// path takes the publish from the start.
func (m *MQ) publishPlain(name string, data any) (done bool, err error) {
	if m.engine != nil || m.anyDurable.Load() {
		return false, nil
	}
	if err := m.checkSize(data); err != nil { // WithMaxMessageSize
		return true, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.state >= stateStopping {
		return true, ErrStopped
	}
	ex := m.lastEx.Load()
	if ex == nil || ex.name != name || !m.takesPlain(ex, data) {
		return false, nil
	}
	_, err = ex.acceptPlain(data)
	return true, err
}

// takesPlain reports whether a publish of data with no options to ex is
// plain: one entry that every queue of ex takes as it is (see
// exchange.plain). The caller holds the read lock.
func (m *MQ) takesPlain(ex *exchange, data any) bool {
	// Data that does not fit a typed queue takes the general path, which
	// says why.
	return ex.plain && m.dur == nil && (!ex.typed || payloadFits(ex.oneType, data))
}

// publishChecked is PublishContext once the options are applied (and the
// publish middleware has run).
func (m *MQ) publishChecked(ctx context.Context, exchange string, r *records) error {
	if err := m.checkSize(r.data); err != nil { // WithMaxMessageSize, before any copy or encoding
		return err
	}
	if m.engine != nil {
		return m.publishOnEngine(ctx, exchange, r.data, &r.pc)
	}
	if r.pc.dedupID != "" {
		return m.publishOnce(ctx, exchange, r)
	}
	return m.publishRecords(ctx, exchange, r)
}

// publishRecords is PublishContext once the options are checked: it encodes
// what a durable queue needs, and routes r, waiting for room as need be.
func (m *MQ) publishRecords(ctx context.Context, exchange string, r *records) error {
	if m.anyDurable.Load() {
		r.userCode() // the codec
		if err := m.preEncode(exchange, r.data, &r.pc); err != nil {
			return err
		}
	}
	for {
		room, err := m.publish(exchange, r, nil)
		if room == nil {
			if len(r.evicted) > 0 {
				r.userCode() // dead-lettering: loggers, filters and codecs
			}
			settleEvicted(r.evicted)
			return err
		}
		select {
		case <-room:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for room: %w", ErrQueueFull, ctx.Err())
		}
	}
}

// publishOnEngine is PublishContext on an engine. It checks the state under
// the read lock but does not hold it while the engine publishes (a broker's
// confirm may take long), so that Shutdown is never held up by a publish:
// the engine's Shutdown makes the publishes still under way return.
func (m *MQ) publishOnEngine(ctx context.Context, exchange string, data any, pc *publishConfig) error {
	if exchange == "" {
		return fmt.Errorf("%w: exchange name", ErrEmptyName)
	}
	m.mu.RLock()
	stopping := m.state >= stateStopping
	var typeErr error
	if !stopping {
		typeErr = m.checkEnginePayloads(exchange, data, pc)
	}
	m.mu.RUnlock()
	if stopping {
		return ErrStopped
	}
	if typeErr != nil {
		return typeErr
	}
	if pc.dedupID != "" {
		return fmt.Errorf("%w: WithDeduplicationID", ErrUnsupported)
	}
	if pc.group != "" { // Publishing carries no group: an engine would drop it silently
		return fmt.Errorf("%w: WithMessageGroup", ErrUnsupported)
	}
	return m.engine.Publish(ctx, Publishing{Exchange: exchange, RoutingKey: pc.routingKey, Headers: pc.headers,
		Data: data, Expiration: pc.ttl, Delay: pc.delay})
}

// checkEnginePayloads is typed publish on an engine (see handler.go): the
// broker routes, but the MQ's exchanges mirror the bindings it declared, so
// it refuses, all or nothing, data that a typed queue of this MQ which the
// message would reach could never take, as an in-memory publish does. (A
// queue that another process bound is unknown here; its consumer
// dead-letters such data.) The caller holds the read lock.
func (m *MQ) checkEnginePayloads(exchange string, data any, pc *publishConfig) error {
	if len(m.payloads) == 0 {
		return nil
	}
	var qbuf [8]*queue
	for cur, hops := m.exchanges[exchange], 0; cur != nil && hops <= len(m.exchanges); hops++ {
		if dst := cur.route(pc.routingKey, pc.headers, qbuf[:0]); len(dst) > 0 {
			if cur.typed {
				return m.checkPayloads(dst, data)
			}
			return nil
		}
		if cur.cfg.alternate == "" {
			return nil
		}
		cur = m.exchanges[cur.cfg.alternate]
	}
	return nil
}

// publishDead publishes a dead-lettered message with its deaths, the latest
// first. It never blocks, and goes on while the MQ stops. Unlike a Publish it
// is not all or nothing, as RabbitMQ's dead-lettering is not: a target queue
// that is full or closed, or that the message would cycle through (see
// isCycle), does not get its copy, and the others do. It fails only when no
// queue gets the message.
//
// The copy keeps group, the message's [WithMessageGroup], so that a queue
// with [WithGroupOrdering] behind the dead-letter exchange keeps its order.
//
// src, when not nil, is the durable source queue's message: its
// acknowledgement joins the log record of a dead letter that reaches a
// durable queue, so that the move is atomic (see deadSource).
func (m *MQ) publishDead(exchange string, data any, key, group string, headers map[string]any, deaths []Death, src *deadSource) error {
	r := records{data: data, pc: publishConfig{routingKey: key, headers: headers, group: group}, deaths: deaths}
	_, err := m.publish(exchange, &r, &deadLetter{src: src})
	settleEvicted(r.evicted)
	return err
}

type eviction struct {
	q *queue
	m *Msg
}

// settleEvicted dead-letters what DropHead evicted, with reason maxlen, and
// ends each one's transit (see MQ.transit).
func settleEvicted(evs []eviction) {
	for _, e := range evs {
		e.q.c.overflowed.Add(1)
		e.q.deadLetter(e.m, ReasonMaxLen, nil)
		e.q.mq.evicting.Add(-1)
		e.q.mq.transitDone(1)
	}
}

// deadLetter marks a publish as a dead letter: internal, not all or nothing,
// and going on while the MQ stops.
type deadLetter struct {
	src *deadSource // see publishDead; may be nil
	// replay: ReplayDeadLetters moves the message back, as a Publish would
	// (all or nothing, refused while stopping, never waiting for room), but
	// with its deaths and src.
	replay bool
}

// internal reports whether dl is a dead letter of the MQ's own: not all or
// nothing, and going on while the MQ stops. A nil dl is a Publish.
func (dl *deadLetter) internal() bool { return dl != nil && !dl.replay }

// publish routes and enqueues under the read lock, so that Stop, which takes
// the write lock, sees each publish either completely or not at all.
// internal publishes (dead letters) go on while the MQ stops. Filters are
// user code and may call back into the MQ, so they run without the lock: the
// message is routed, the lock released while the filters decide, and the
// queues they kept then take it under the lock again.
func (m *MQ) publish(name string, r *records, dl *deadLetter) (room <-chan struct{}, err error) {
	internal := dl.internal()
	pc, deaths := &r.pc, r.deaths
	m.mu.RLock()
	if !internal && m.state >= stateStopping {
		m.mu.RUnlock()
		return nil, ErrStopped
	}
	ex := m.lastEx.Load()
	if ex == nil || ex.name != name {
		// DeleteExchange clears lastEx under the write lock, so the last
		// one found is valid under the read lock.
		if ex = m.exchanges[name]; ex == nil {
			m.mu.RUnlock()
			return nil, fmt.Errorf("%w: %q", ErrUnknownExchange, name)
		}
		m.lastEx.Store(ex)
	}
	r.ex = ex
	if dl == nil && pc.routingKey == "" && pc.headers == nil && pc.ttl == 0 && pc.delay == 0 && pc.group == "" && m.takesPlain(ex, r.data) {
		r.id, err = ex.acceptPlain(r.data)
		m.mu.RUnlock()
		return nil, err
	}
	var qbuf [8]*queue
	// Follow alternate exchanges; a cycle ends after every exchange was tried.
	for cur, hops := ex, 0; cur != nil && hops <= len(m.exchanges); hops++ {
		// dst may be the exchange's own list (fanout, direct): read-only.
		dst := cur.route(pc.routingKey, pc.headers, qbuf[:0])
		if internal && len(dst) > 0 && deaths[0].Reason != ReasonRejected {
			dst = slices.DeleteFunc(slices.Clone(dst), func(q *queue) bool { return isCycle(deaths, q.name) })
			if len(dst) == 0 {
				m.mu.RUnlock()
				return nil, errDeadLetterCycle
			}
		}
		r.n = len(dst)
		var msgs []*Msg // nil: enqueue asks r for each queue's
		if slices.ContainsFunc(dst, func(q *queue) bool { return q.cfg.filter != nil }) {
			// The filters see the Msg that their queue will deliver, and
			// run without the lock: dst is copied first.
			dst = slices.Clone(dst)
			msgs = make([]*Msg, 0, len(dst))
			for _, q := range dst {
				msgs = append(msgs, r.msgFor(q))
			}
			m.mu.RUnlock()
			r.userCode()
			// A dead letter's filters run on a goroutine of their own: the
			// goroutine that dead-letters (the scheduler, a worker, the
			// publisher settling an eviction) must go on whatever a filter
			// does, runtime.Goexit included.
			var own *guard.Owned
			if internal {
				own = &m.own
			}
			n, err := runFilters(dst, msgs, own)
			m.mu.RLock()
			if err != nil {
				m.mu.RUnlock()
				return nil, err
			}
			if !internal && m.state >= stateStopping {
				m.mu.RUnlock()
				return nil, ErrStopped
			}
			dst, msgs = dst[:n], msgs[:n]
			// Without the lock, the topology may have changed: a queue
			// deleted, or unbound, meanwhile does not get the message, as
			// if the change came first.
			if ex.gone || cur.gone {
				m.mu.RUnlock()
				return nil, fmt.Errorf("%w: %q", ErrUnknownExchange, name)
			}
			keep := 0
			for i, q := range dst {
				if !q.gone && slices.Contains(cur.route(pc.routingKey, pc.headers, nil), q) {
					dst[keep], msgs[keep] = q, msgs[i]
					keep++
				}
			}
			dst, msgs = dst[:keep], msgs[:keep]
		}
		if len(dst) > 0 {
			if cur.typed && !internal { // typed publish (and replay), all or nothing: see handler.go
				if err := m.checkPayloads(dst, r.data); err != nil {
					m.mu.RUnlock()
					return nil, err
				}
			}
			return m.enqueue(r, dst, msgs, dl) // releases the read lock
		}
		if cur.cfg.alternate == "" {
			break
		}
		cur = m.exchanges[cur.cfg.alternate]
	}
	m.mu.RUnlock()
	ex.unroutable.Add(1)
	return nil, fmt.Errorf("%w: exchange %q, routing key %q", ErrNoRoute, name, pc.routingKey)
}

// records hands each queue that a publish reaches the Msg it holds. A queue
// that needs no Msg of its own until a worker delivers the message (see
// takesShared) shares one record of it with the others: its exchange's
// prototype for a plain message (no routing key, headers or deaths), else one
// Msg made for this publish when it reaches several queues (a message for one
// queue gets its own Msg, the one its consumer receives: one allocation
// either way). A message with a TTL or a delay gets a Msg per queue, which
// its queue stamps with its own deadline.
type records struct {
	ex     *exchange // the exchange published to
	data   any
	pc     publishConfig
	deaths []Death
	rec    *Msg // the record made for this publish, once a queue needs it
	n      int  // the queues it is routed to: one needs no shared record

	evicted []eviction // what DropHead evicted to make room: dead-letter them after

	dedup *dedupClaim // the publish's claim of its WithDeduplicationID, or nil
	id    uint64      // the ID the exchange stamped, once it did
}

func (r *records) msgFor(q *queue) *Msg {
	pc := &r.pc
	if pc.group != "" {
		return r.groupMsgFor(q)
	}
	if pc.ttl == 0 && pc.delay == 0 && q.takesShared() {
		if pc.routingKey == "" && pc.headers == nil && r.deaths == nil {
			return r.ex.proto
		}
		if r.n > 1 && r.rec == nil {
			r.rec = &Msg{Exchange: r.ex.name, RoutingKey: pc.routingKey, Headers: pc.headers, Deaths: r.deaths, shared: true}
		}
		if r.rec != nil {
			return r.rec
		}
	}
	// Two literals, not one Msg variable copied into the durable case: that
	// variable would escape, an allocation more for every durable publish.
	if q.cfg.durable { // logMessage fills in its ext: one allocation for both
		dm := &struct {
			Msg
			x msgExt
		}{Msg: Msg{Exchange: r.ex.name, Queue: q.name, RoutingKey: pc.routingKey, Headers: pc.headers, Data: r.data, Deaths: r.deaths}}
		dm.Msg.x = &dm.x
		return &dm.Msg
	}
	return &Msg{Exchange: r.ex.name, Queue: q.name, RoutingKey: pc.routingKey, Headers: pc.headers, Data: r.data, Deaths: r.deaths}
}

// groupMsgFor is msgFor for a message with a group (WithMessageGroup): it
// is never shared, so that every queue's Msg carries the group in its ext.
func (r *records) groupMsgFor(q *queue) *Msg {
	pc := &r.pc
	m := &Msg{Exchange: r.ex.name, Queue: q.name, RoutingKey: pc.routingKey, Headers: pc.headers, Data: r.data, Deaths: r.deaths,
		x: &msgExt{group: pc.group}}
	return m
}

// runFilters keeps, at the front of dst and msgs, the queues whose filter (if
// any) keeps the message, and returns how many. A panic in a filter is
// returned as an error. With own, each filter runs on a goroutine of its own
// (see guard.Owned.Guard), and a runtime.Goexit in it is returned as an
// error too; without, on the caller's.
func runFilters(dst []*queue, msgs []*Msg, own *guard.Owned) (int, error) {
	n := 0
	for i, q := range dst {
		if q.cfg.filter != nil {
			var keep bool
			var err error
			if own == nil {
				keep, err = runFilter(q.cfg.filter, msgs[i])
			} else {
				keep, err = runFilterGuarded(own, q.cfg.filter, msgs[i])
			}
			if err != nil {
				return 0, err
			}
			if !keep {
				continue
			}
		}
		dst[n], msgs[n] = q, msgs[i]
		n++
	}
	return n, nil
}

// enqueue accepts the message into each of dst, as msgs[i] (or, when msgs
// is nil, as r's Msg for dst[i]): all or none for a publish, every queue that
// can take it for a dead letter. dst is read-only. The caller holds the read
// lock, and enqueue releases it.
func (m *MQ) enqueue(r *records, dst []*queue, msgs []*Msg, dl *deadLetter) (room <-chan struct{}, err error) {
	internal := dl.internal()
	pc := &r.pc
	timed := pc.delay > 0 || pc.ttl > 0
	bounded, durable := false, false
	for _, q := range dst {
		timed = timed || q.cfg.ttl > 0
		bounded = bounded || q.cfg.maxLen > 0
		durable = durable || q.cfg.durable
	}
	if !bounded && !durable && pc.delay == 0 && !internal {
		// The common case: no queue can refuse the message (they close only
		// after Stop took the write lock, or when aborted, and then a publish
		// is refused before it gets here), so one queue at a time will do.
		var now time.Time
		if timed {
			now = time.Now()
		}
		id := r.ex.seq.Add(1)
		r.id = id
		if m.dur != nil && m.dur.reserveDue(r.ex, id) {
			// The ID's reservation may commit: not under the lock.
			return m.enqueueAdmitted(r, dst, msgs, dl, id)
		}
		for i, q := range dst {
			var msg *Msg
			if msgs != nil {
				msg = msgs[i]
			} else {
				msg = r.msgFor(q)
			}
			var err error
			if timed {
				err = q.accept(newEntry(msg, id, r.data), now, pc.ttl)
			} else {
				err = q.acceptPlain(newEntry(msg, id, r.data)) // no deadline: without the queue's lock (see inbox)
			}
			if err != nil {
				m.mu.RUnlock()
				return nil, err
			}
		}
		m.mu.RUnlock()
		return nil, nil
	}
	return m.enqueueAdmitted(r, dst, msgs, dl, 0)
}

// enqueueAdmitted is enqueue where a queue may refuse the message, or where
// it must reach the log first. Each queue first admits it and holds room for
// it; a publish refused by one queue is refused by all (the others give their
// room back), while a dead letter skips the queues that refuse it. Then the
// ID is stamped; a message for durable queues is written to the log once,
// with the dead letter's source acknowledgement if any, and waits for the
// sync; and only then do the queues take it, so that nothing a consumer can
// see, or a Publish reports, is missing from the disk.
//
// The log's write and sync (and the codec, for a message not encoded before
// Publish took the lock) happen without the MQ's read lock, so that a
// RegisterQueue or a Stop never waits for an fdatasync, nor the publishers
// behind them; each queue that admitted the message counts it as inbound
// meanwhile, so that a stopping MQ waits for it. id is the message's ID when
// enqueue stamped it already, else 0. The caller holds the read lock, and
// enqueueAdmitted releases it.
func (m *MQ) enqueueAdmitted(r *records, dst []*queue, msgs []*Msg, dl *deadLetter, id uint64) (room <-chan struct{}, err error) {
	internal := dl.internal()
	pc, ex := &r.pc, r.ex
	var qbuf [8]*queue
	var mbuf [8]*Msg
	adm, amsgs := qbuf[:0], mbuf[:0] // the queues that admitted it, and their Msgs
	var refused error
	for i, q := range dst {
		room, err := q.reserve(dl != nil) // a replay does not wait for room either
		if err == nil && room == nil {
			adm = append(adm, q)
			if msgs != nil {
				amsgs = append(amsgs, msgs[i])
			} else {
				amsgs = append(amsgs, r.msgFor(q))
			}
			continue
		}
		if internal {
			refused = err
			continue
		}
		unreserve(adm, false, false)
		m.mu.RUnlock()
		return room, err
	}
	if len(adm) == 0 {
		m.mu.RUnlock()
		return nil, refused
	}
	if id == 0 {
		id = ex.seq.Add(1)
	}
	r.id = id
	now := time.Now()
	logged := m.dur != nil && (m.dur.reserveDue(ex, id) || slices.ContainsFunc(adm, func(q *queue) bool { return q.cfg.durable }))
	if logged {
		for _, q := range adm {
			q.holdInbound(internal)
		}
		m.mu.RUnlock()
		r.userCode() // the codec, a logger
		if err := m.logMessage(ex, id, now, adm, amsgs, r.data, pc, r.deaths, dl); err != nil {
			ex.refused.Add(1)
			unreserve(adm, true, internal)
			return nil, err
		}
	} else {
		defer m.mu.RUnlock()
	}
	taken := 0
	for i, q := range adm {
		ev, gen, err := q.acceptReserved(newEntry(amsgs[i], id, r.data), now, pc.delay, pc.ttl, logged, internal)
		if ev != nil {
			r.evicted = append(r.evicted, eviction{q, ev})
		}
		switch err {
		case errAbortedUndelivered: // past the point of no return: accepted, counted undelivered
			taken++
			continue
		case errRemovedOnArrival: // past it too: accepted, counted as the delete's
			taken++
			if q.cfg.durable {
				m.dur.ack(q.name, amsgs[i].dkey(), nil)
			}
			continue
		}
		if err != nil { // a Shutdown deadline aborted it since it admitted the message
			continue
		}
		taken++
		if pc.delay > 0 && !evictedSelf(r.evicted, amsgs[i]) {
			q.later(schedItem{due: now.Add(pc.delay), q: q, m: amsgs[i], gen: gen})
		}
	}
	if taken == 0 { // a dead letter, or a publish a Shutdown deadline aborted while it held the lock
		ex.refused.Add(1)
		return nil, ErrStopped
	}
	return nil, nil
}

// newEntry is the entry for message m, stamped with id: m is a record shared
// by the queues (its exchange's prototype, or one made for the publish: the
// entry carries id and data) or the queue's own Msg, which gets the id.
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

var errFilterGoexit = errors.New("tinymq: a queue's filter called runtime.Goexit")

// runFilterGuarded is runFilter on a goroutine of own's (see
// guard.Owned.Guard), with a runtime.Goexit turned into an error too. (A
// function of its own, so that what its closure shares escapes only here,
// not on a Publish's path.)
func runFilterGuarded(own *guard.Owned, keep func(*Msg) bool, msg *Msg) (ok bool, err error) {
	if _, returned := own.Guard(func() { ok, err = runFilter(keep, msg) }); !returned {
		return false, errFilterGoexit
	}
	return ok, err
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

// reserveIDsIfLogged is reserveIDs for a publish that reaches no durable
// queue: a failure of the log does not stop in-memory queues, so it is
// logged (once per MQ), not returned.
func (m *MQ) reserveIDsIfLogged(ex *exchange, id uint64) {
	if m.dur == nil {
		return
	}
	if _, err := m.reserveIDs(ex, id, nil); err != nil && m.dur.idsWarned.CompareAndSwap(false, true) {
		// Once: the log has failed for good, and a logger that publishes
		// must not be fed a line by every publish it makes.
		m.logAttrs(slog.LevelError, "tinymq: message IDs may repeat after a restart", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.String("exchange", ex.name), slog.String("err", err.Error()))
		})
	}
}

// unreserve gives back the room the queues held for a message they will not
// get.
func unreserve(qs []*queue, inbound, dead bool) {
	for _, q := range qs {
		q.unreserve(inbound, dead)
	}
}

// preEncode encodes data for the log before Publish takes any lock, when the
// exchange has a durable queue bound. The codec then runs on the caller's
// goroutine with nothing held: a panic or an error fails the publish, and
// even runtime.Goexit only ends the caller's goroutine. (Dead letters, and
// publishes that reach a durable queue through an alternate exchange, are
// encoded later, on a goroutine of their own: see encodeData.)
func (m *MQ) preEncode(exchange string, data any, pc *publishConfig) (err error) {
	// The exchange last published to, without the read lock: the answer
	// may be stale either way, as the one read under the lock is once it is
	// released (publish decides under the lock; a message not encoded here
	// is encoded by logMessage).
	ex := m.lastEx.Load()
	if ex == nil || ex.name != exchange {
		m.mu.RLock()
		ex = m.exchanges[exchange]
		m.mu.RUnlock()
	}
	if ex == nil || !ex.durable.Load() {
		return nil
	}
	if e, ok := data.(Encoded); ok {
		pc.encoded = e.Body
		return nil
	}
	if raw, ok := jsonBytes(m.codec, data); ok { // logMessage encodes it in place
		return m.checkEncoded(jsonBytesLen(len(raw)))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: the codec panicked: %s", ErrPayloadType, guard.ValueText(r))
		}
	}()
	b, err := m.codec.Marshal(data)
	if err != nil {
		return fmt.Errorf("%w: encoding: %w", ErrPayloadType, err)
	}
	if err := m.checkEncoded(len(b)); err != nil { // before any copy of it
		return err
	}
	pc.encoded = b
	return nil
}

type publishConfig struct {
	routingKey string
	headers    map[string]any
	ttl        time.Duration
	delay      time.Duration
	encoded    []byte // Data already encoded for the log, or nil

	dedupID     string // WithDeduplicationID, or ""
	dedupLogged bool   // logMessage wrote dedupID's i/ record with the message

	group string // WithMessageGroup, or ""
}

func (c *publishConfig) apply(opts []PublishOption) error {
	for _, o := range opts {
		switch o.kind {
		case optRoutingKey:
			c.routingKey = o.key
		case optHeaders:
			c.headers = o.headers
		case optExpiration, optDelay:
			if o.d <= 0 {
				return fmt.Errorf("%w: duration %v", ErrInvalidOption, o.d)
			}
			if o.kind == optExpiration {
				c.ttl = o.d
			} else {
				c.delay = o.d
			}
		case optDedupID:
			if o.key == "" || len(o.key) > maxDedupIDLen {
				return fmt.Errorf("%w: deduplication ID of %d bytes, want 1 to %d", ErrInvalidOption, len(o.key), maxDedupIDLen)
			}
			c.dedupID = o.key
		case optGroup:
			if o.key == "" || len(o.key) > maxGroupLen {
				return fmt.Errorf("%w: message group ID of %d bytes, want 1 to %d", ErrInvalidOption, len(o.key), maxGroupLen)
			}
			c.group = o.key
		default:
			return ErrInvalidOption
		}
	}
	if len(c.routingKey) > maxKeyLen {
		return ErrKeyTooLong
	}
	if c.headers != nil {
		if err := validateTable(c.headers, 0); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidHeaders, err)
		}
	}
	return nil
}
