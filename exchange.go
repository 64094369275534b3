package tinymq

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
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

type exchangeConfig struct {
	alternate string
	dedup     time.Duration // WithDeduplication's window; 0: none
}

type exchangeOptionFunc func(*exchangeConfig) error

func (f exchangeOptionFunc) applyExchange(c *exchangeConfig) error { return f(c) }

// exchange stamps messages with a sequence number and routes copies of them to
// its bound queues. Its bindings are guarded by the MQ's lock: read under the
// read lock by Publish, changed under the write lock.
type exchange struct {
	name       string
	kind       ExchangeType
	cfg        exchangeConfig
	seq        atomic.Uint64 // the last ID stamped
	base       uint64        // seq when this run declared the exchange: Published is seq-base-refused
	refused    atomic.Uint64 // IDs stamped on dead letters that every queue then refused
	reserved   atomic.Uint64 // IDs up to this are recorded in the log (see reserveIDs)
	reserveMu  sync.Mutex
	unroutable atomic.Uint64 // publishes refused with ErrNoRoute
	duplicates atomic.Uint64 // publishes that WithDeduplication found accepted already

	dedup *dedupTable // WithDeduplication's IDs, or nil

	all     []*queue            // fanout: every bound queue; headers: every queue with bindings
	direct  map[string][]*queue // direct: binding key -> queues
	topic   topicTrie           // topic
	headers map[*queue][]headersBinding

	bindings []BindingSpec // as declared, for Topology
	durable  atomic.Bool   // a durable queue is bound: publishes encode Data first
	gone     bool          // deleted; written under the MQ's write lock

	proto *Msg // what plain entries share (see entry)
	// plain: a fanout exchange whose every queue takes shared entries, so
	// that a publish with no options is one plain entry for each (see
	// MQ.publish). Set by bind.
	plain bool
	// typed: some bound queue has a payload type (see typeQueueLocked), so
	// that a publish checks its data. oneType is that type when every typed
	// queue has the same: a plain publish then checks its data against it
	// alone, on the fast path (plain stays true); with several types plain
	// is false. Set by retype.
	typed   bool
	oneType reflect.Type
}

// plainNow is what plain should be now: see plain and oneType.
func (e *exchange) plainNow() bool {
	return e.kind == Fanout && len(e.all) > 0 && (!e.typed || e.oneType != nil) &&
		!slices.ContainsFunc(e.all, func(q *queue) bool { return !q.takesShared() })
}

// retype sets typed, and plain, from the queues bound to e. The caller
// holds the MQ's write lock.
func (e *exchange) retype(m *MQ) {
	e.typed, e.oneType = false, nil
	mixed := false
	if len(m.payloads) > 0 {
		for _, s := range e.bindings {
			q := m.queues[s.Queue]
			if q == nil || m.payloads[q] == nil {
				continue
			}
			t := m.payloads[q]
			if e.typed && e.oneType != t {
				mixed = true
			}
			e.typed, e.oneType = true, t
		}
	}
	if mixed {
		e.oneType = nil
	}
	e.plain = e.plainNow()
}

func newExchange(name string, kind ExchangeType, cfg exchangeConfig) *exchange {
	e := &exchange{name: name, kind: kind, cfg: cfg, proto: &Msg{Exchange: name, shared: true}}
	if cfg.dedup > 0 {
		e.dedup = newDedupTable(cfg.dedup)
	}
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
	if !kind.valid() {
		return nil, fmt.Errorf("%w: %d", ErrInvalidKind, uint8(kind))
	}
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
	e.bindings = append(e.bindings, BindingSpec{Queue: q.name, Exchange: e.name, Kind: e.kind, Keys: slices.Clone(b.keys), Args: slices.Clone(b.args)})
	e.attach(q, b, hbs)
	e.retype(q.mq)
}

// attach adds q's bindings to the routing tables. The caller holds the MQ's
// write lock. Lists that a route may have returned are replaced, never
// changed.
func (e *exchange) attach(q *queue, b binding, hbs []headersBinding) {
	if q.cfg.durable {
		e.durable.Store(true)
		q.mq.anyDurable.Store(true)
	}
	switch e.kind {
	case Fanout:
		if !slices.Contains(e.all, q) {
			e.all = append(slices.Clip(e.all), q)
		}
		e.plain = e.plainNow()
	case Direct:
		for _, k := range b.keys {
			if qs := e.direct[k]; !slices.Contains(qs, q) {
				e.direct[k] = append(slices.Clip(qs), q)
			}
		}
	case Topic:
		for _, k := range b.keys {
			e.topic.add(k, q)
		}
	case Headers:
		if _, ok := e.headers[q]; !ok {
			e.all = append(slices.Clip(e.all), q)
		}
		e.headers[q] = append(e.headers[q], hbs...)
	}
}

// hasBinding reports whether q is bound to e with every key and argument
// table of b (a fanout binding needs only some binding of q, a headers
// binding with no arguments one with none).
func (e *exchange) hasBinding(q *queue, b binding) bool {
	var keys []string
	var args []map[string]any
	found, bare := false, false
	for _, s := range e.bindings {
		if s.Queue == q.name {
			found = true
			bare = bare || len(s.Args) == 0
			keys = append(keys, s.Keys...)
			args = append(args, s.Args...)
		}
	}
	if !found {
		return false
	}
	if e.kind == Headers && len(b.args) == 0 && !bare {
		// A headers binding with no arguments matches every message: it is
		// new beside bindings that all have arguments.
		return false
	}
	for _, k := range b.keys {
		if !slices.Contains(keys, k) {
			return false
		}
	}
	for _, a := range b.args {
		if !slices.ContainsFunc(args, func(o map[string]any) bool { return reflect.DeepEqual(a, o) }) {
			return false
		}
	}
	return true
}

// unbindQueue removes q's bindings to e: those of b's keys and argument
// tables (a b with neither removes the bindings that have neither: a fanout
// binding, or a headers one with no arguments), or, with a nil b, every one. The caller holds the MQ's write
// lock. A binding that does not exist is not an error.
func (e *exchange) unbindQueue(q *queue, b *binding) {
	var kept, mine []BindingSpec
	for _, s := range e.bindings {
		if s.Queue == q.name {
			mine = append(mine, s)
		} else {
			kept = append(kept, s)
		}
	}
	if len(mine) == 0 {
		return
	}
	var left []BindingSpec // what stays of mine
	if b != nil {
		bare := len(b.keys) == 0 && len(b.args) == 0 // a fanout binding, or a headers one with no arguments
		for _, s := range mine {
			if len(s.Keys) == 0 && len(s.Args) == 0 {
				if !bare {
					left = append(left, s)
				}
				continue
			}
			s.Keys = slices.DeleteFunc(slices.Clone(s.Keys), func(k string) bool { return slices.Contains(b.keys, k) })
			s.Args = slices.DeleteFunc(slices.Clone(s.Args), func(a map[string]any) bool {
				return slices.ContainsFunc(b.args, func(o map[string]any) bool { return reflect.DeepEqual(a, o) })
			})
			if len(s.Keys) > 0 || len(s.Args) > 0 {
				left = append(left, s)
			}
		}
	}
	e.detach(q, mine)
	for _, s := range left {
		var hbs []headersBinding
		if e.kind == Headers {
			hbs, _ = checkBinding(e.kind, binding{args: s.Args, hasArgs: true}) // validated when bound
		}
		e.attach(q, binding{keys: s.Keys, args: s.Args, hasArgs: len(s.Args) > 0}, hbs)
	}
	e.bindings = append(kept, left...)
	e.retype(q.mq)
	dur := false
	for _, s := range e.bindings {
		if o := q.mq.queues[s.Queue]; o != nil && o.cfg.durable {
			dur = true
		}
	}
	e.durable.Store(dur)
}

// detach takes q out of the routing tables, for the bindings specs. The
// caller holds the MQ's write lock.
func (e *exchange) detach(q *queue, specs []BindingSpec) {
	without := func(qs []*queue) []*queue {
		return slices.DeleteFunc(slices.Clone(qs), func(o *queue) bool { return o == q })
	}
	switch e.kind {
	case Fanout:
		e.all = without(e.all)
		e.plain = e.plainNow()
	case Direct:
		for _, s := range specs {
			for _, k := range s.Keys {
				if qs := without(e.direct[k]); len(qs) > 0 {
					e.direct[k] = qs
				} else {
					delete(e.direct, k)
				}
			}
		}
	case Topic:
		for _, s := range specs {
			for _, k := range s.Keys {
				e.topic.remove(k, q)
			}
		}
	case Headers:
		e.all = without(e.all)
		delete(e.headers, q)
	}
}

// acceptPlain publishes data as a plain message (see plain): one ID, one
// entry, which each queue takes without its lock (see queue.acceptPlain). It
// returns the ID, and ErrStopped if a queue closed: Stop has begun. The
// caller holds the MQ's read lock.
func (e *exchange) acceptPlain(data any) (uint64, error) {
	en := entry{m: e.proto, id: e.seq.Add(1), data: data}
	for _, q := range e.all {
		if err := q.acceptPlain(en); err != nil {
			return en.id, err
		}
	}
	return en.id, nil
}

// route returns each queue that the message matches, once: for a fanout or
// direct exchange its own list, which the caller must not modify, else dst
// with the queues appended. The caller holds the MQ's read lock, and bind
// replaces rather than modifies a list that a route may have returned.
func (e *exchange) route(key string, h map[string]any, dst []*queue) []*queue {
	switch e.kind {
	case Fanout:
		return e.all
	case Direct:
		return e.direct[key]
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
