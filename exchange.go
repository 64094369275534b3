package tinymq

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"
)

// ExchangeType is the routing rule of an exchange, as in RabbitMQ.
type ExchangeType uint8

const (
	// Fanout delivers every message to every bound queue; keys and headers are
	// ignored.
	Fanout ExchangeType = iota + 1
	// Direct delivers a message to the queues bound with a binding key equal to
	// its routing key (byte-wise, case-sensitive).
	Direct
	// Topic delivers a message to the queues bound with a pattern matching its
	// routing key: words separated by '.', "*" matching exactly one word and "#"
	// zero or more.
	Topic
	// Headers delivers a message to the queues whose binding arguments match its
	// headers, with x-match "all" (the default), "any", "all-with-x" or
	// "any-with-x".
	Headers
)

// String returns the RabbitMQ name of the kind: "fanout", "direct", "topic" or
// "headers".
func (k ExchangeType) String() string {
	switch k {
	case Fanout:
		return "fanout"
	case Direct:
		return "direct"
	case Topic:
		return "topic"
	case Headers:
		return "headers"
	}
	return fmt.Sprintf("ExchangeType(%d)", uint8(k))
}

func (k ExchangeType) valid() bool { return k >= Fanout && k <= Headers }

// ExchangeOption configures an exchange in [MQ.DeclareExchange].
type ExchangeOption interface {
	applyExchange(*exchangeConfig)
}

type exchangeConfig struct {
	alternate string
}

type exchangeOptionFunc func(*exchangeConfig)

func (f exchangeOptionFunc) applyExchange(c *exchangeConfig) { f(c) }

// WithAlternateExchange names the exchange that receives, with the same routing
// key and headers, every message this exchange cannot route to any queue, as
// RabbitMQ's alternate-exchange argument does. Publish returns [ErrNoRoute] only
// when the alternate exchange cannot route it either (or does not exist).
func WithAlternateExchange(name string) ExchangeOption {
	return exchangeOptionFunc(func(c *exchangeConfig) { c.alternate = name })
}

// exchange stamps messages with a sequence number and routes copies of them to
// its bound queues. Its bindings are guarded by the MQ's lock: read under the
// read lock by Publish, changed under the write lock.
type exchange struct {
	name       string
	kind       ExchangeType
	cfg        exchangeConfig
	seq        atomic.Uint64 // messages accepted
	unroutable atomic.Uint64 // publishes refused with ErrNoRoute

	all     []*queue            // fanout: every bound queue; headers: every queue with bindings
	direct  map[string][]*queue // direct: binding key -> queues
	topic   topicTrie           // topic
	headers map[*queue][]headersBinding

	bindings []BindingInfo // as declared, for Topology

	proto *Msg // what plain entries share (see entry)
}

func newExchange(name string, kind ExchangeType, cfg exchangeConfig) *exchange {
	e := &exchange{name: name, kind: kind, cfg: cfg, proto: &Msg{Exchange: name, shared: true}}
	switch kind {
	case Direct:
		e.direct = make(map[string][]*queue)
	case Headers:
		e.headers = make(map[*queue][]headersBinding)
	}
	return e
}

// binding is what one queue asks of one exchange.
type binding struct {
	keys    []string
	args    []map[string]any
	hasArgs bool
}

// checkBinding validates b for the exchange kind and parses headers arguments.
func checkBinding(kind ExchangeType, b binding) ([]headersBinding, error) {
	for _, k := range b.keys {
		if len(k) > maxKeyLen {
			return nil, fmt.Errorf("binding key %.20q...: %w", k, ErrKeyTooLong)
		}
	}
	switch kind {
	case Fanout:
		if len(b.keys) > 0 || b.hasArgs {
			return nil, fmt.Errorf("%w: a fanout exchange takes no binding key or arguments", ErrInvalidBinding)
		}
	case Direct, Topic:
		if b.hasArgs {
			return nil, fmt.Errorf("%w: a %s exchange takes no binding arguments", ErrInvalidBinding, kind)
		}
		if len(b.keys) == 0 {
			return nil, fmt.Errorf("%w: a %s exchange needs WithBindingKey", ErrInvalidBinding, kind)
		}
	case Headers:
		if len(b.keys) > 0 {
			return nil, fmt.Errorf("%w: a headers exchange routes by WithBindingArgs, not by binding key", ErrInvalidBinding)
		}
		args := b.args
		if len(args) == 0 {
			args = []map[string]any{nil} // no arguments: x-match all, matches everything
		}
		hbs := make([]headersBinding, 0, len(args))
		for _, a := range args {
			hb, err := parseHeadersBinding(a)
			if err != nil {
				return nil, err
			}
			hbs = append(hbs, hb)
		}
		return hbs, nil
	}
	return nil, nil
}

// bind adds q's bindings. The caller holds the MQ's write lock and has
// validated the binding with checkBinding.
func (e *exchange) bind(q *queue, b binding, hbs []headersBinding) {
	e.bindings = append(e.bindings, BindingInfo{Queue: q.name, Keys: slices.Clone(b.keys), Args: slices.Clone(b.args)})
	switch e.kind {
	case Fanout:
		if !slices.Contains(e.all, q) {
			e.all = append(e.all, q)
		}
	case Direct:
		for _, k := range b.keys {
			if !slices.Contains(e.direct[k], q) {
				e.direct[k] = append(e.direct[k], q)
			}
		}
	case Topic:
		for _, k := range b.keys {
			e.topic.add(k, q)
		}
	case Headers:
		if _, ok := e.headers[q]; !ok {
			e.all = append(e.all, q)
		}
		e.headers[q] = append(e.headers[q], hbs...)
	}
}

// route appends to dst each queue that the message matches, once. The caller
// holds the MQ's read lock.
func (e *exchange) route(key string, h map[string]any, dst []*queue) []*queue {
	switch e.kind {
	case Fanout:
		return append(dst, e.all...)
	case Direct:
		return append(dst, e.direct[key]...)
	case Topic:
		start := len(dst)
		dst = e.topic.match(key, dst)
		return dedupe(dst, start)
	case Headers:
		for _, q := range e.all {
			for i := range e.headers[q] {
				if e.headers[q][i].match(h) {
					dst = append(dst, q)
					break
				}
			}
		}
	}
	return dst
}

// dedupe removes repeated queues from dst[start:], keeping the first of each.
func dedupe(dst []*queue, start int) []*queue {
	s := dst[start:]
	if len(s) < 2 {
		return dst
	}
	if len(s) <= 16 {
		n := 1
		for i := 1; i < len(s); i++ {
			if !slices.Contains(s[:n], s[i]) {
				s[n] = s[i]
				n++
			}
		}
		return dst[:start+n]
	}
	slices.SortFunc(s, func(a, b *queue) int { return a.id - b.id })
	return dst[:start+len(slices.Compact(s))]
}

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
