package tinymqprom

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinymq/tinymq"
)

// Instrument returns an option for [tinymq.New] that instruments the MQ it
// makes, in one line:
//
//	mq := tinymq.New(tinymqprom.Instrument(prometheus.DefaultRegisterer))
//
// It wraps every consumer call of the MQ, of every queue (those registered
// after New and after Start included) and every form (RegisterQueue,
// RegisterHandler, RegisterDeliveryHandler, Consume, ConsumeHandler,
// ConsumeDeliveries), in a [tinymq.Middleware] that observes how long the
// call took into tinymq_queue_consumer_duration_seconds and keeps its start
// time while it runs, for tinymq_queue_calls_stuck; and, once New has made
// the MQ, registers with reg a [Collector] over it. Every queue then has a
// histogram and a stuck gauge, at 0 before its first call. The middleware
// changes nothing else: it returns the consumer's error as it is, lets a
// panic go on to TinyMQ, and costs two clock readings and a few atomic
// operations a call, with no allocation and no lock (BenchmarkMiddleware).
//
// Instrument panics at once for a nil reg or an option NewCollector would
// refuse, and New panics, as [prometheus.MustRegister] does, with an error
// wrapping reg's if reg refuses the Collector: a second MQ in one registry
// needs [WithConstLabels] to tell the two apart. Each option serves one
// MQ: giving it to a second New panics too. For an error rather than a
// panic, make the MQ, then call [NewCollector] and register it yourself.
// For an MQ of thousands of queues, whose scrape through a registry costs
// about 50ms and 8 MB a thousand queues, use [InstrumentHandler].
func Instrument(reg prometheus.Registerer, opts ...Option) tinymq.Option {
	if reg == nil {
		panic(fmt.Errorf("%w: nil Registerer", errInvalid))
	}
	o, _ := instrument(reg, opts)
	return o
}

// instrument is Instrument, with the Collector it registers with reg, or
// with no registry for a nil reg (InstrumentHandler).
func instrument(reg prometheus.Registerer, opts []Option) (tinymq.Option, *Collector) {
	c, err := newCollector(opts)
	if err != nil {
		panic(err)
	}
	c.instrumented = true
	var bound atomic.Bool
	opt := tinymq.Options(
		tinymq.WithMiddleware(c.middleware),
		tinymq.WithSetup(func(mq *tinymq.MQ) {
			if !bound.CompareAndSwap(false, true) {
				panic(fmt.Errorf("%w: an Instrument option given to a second New", errInvalid))
			}
			c.mu.Lock()
			c.mq = mq
			c.mu.Unlock()
			if reg == nil {
				return
			}
			if err := reg.Register(c); err != nil {
				panic(fmt.Errorf("tinymqprom: Instrument: %w", err))
			}
		}),
	)
	return opt, c
}

// middleware is the Middleware of Instrument. Each consumer gets its own
// chain, of one queue: the observers are looked up on its first call only.
func (c *Collector) middleware(next tinymq.DeliveryFunc) tinymq.DeliveryFunc {
	if next == nil {
		return nil
	}
	var cache atomic.Pointer[queueObs]
	return func(ctx context.Context, d tinymq.Delivery[any]) error {
		o, slot, start := c.enter(&cache, d.Queue)
		defer o.leave(slot, start, c)
		return next(ctx, d)
	}
}

// Instrument returns a consumer that calls next and observes each call, as
// the middleware of the package-level [Instrument] does, for an MQ made
// without it (see [NewCollector]): into tinymq_queue_consumer_duration_seconds
// and tinymq_queue_calls_stuck, labelled with the message's queue
// ([tinymq.Msg.Queue], read before next runs). Only the queues whose
// consumers are wrapped so have these two series, and only a [tinymq.ConsumerFunc]
// can be wrapped; prefer the option, which covers every consumer form.
//
// It changes nothing else: next's error is returned as it is, and a panic in
// next is observed and then goes on unchanged (it is not recovered) to
// TinyMQ, which turns it into a failed delivery. It costs what the
// middleware costs. One wrapped consumer may serve several queues.
// Instrument(nil) returns nil, which RegisterQueue refuses. After the MQ
// stops the consumer is no longer called.
func (c *Collector) Instrument(next tinymq.ConsumerFunc) tinymq.ConsumerFunc {
	if next == nil {
		return nil
	}
	var cache atomic.Pointer[queueObs] // the last queue's observers
	return func(ctx context.Context, msg *tinymq.Msg) error {
		queue := ""
		if msg != nil {
			queue = msg.Queue
		}
		o, slot, start := c.enter(&cache, queue)
		defer o.leave(slot, start, c)
		return next(ctx, msg)
	}
}

// now is the observers' clock: nanoseconds since the Collector was made, on
// the monotonic clock, plus one, so that it is never 0 (a free slot).
func (c *Collector) now() int64 {
	return int64(time.Since(c.epoch)) + 1
}

// queueObs observes the consumer calls of one queue: a histogram of their
// durations and the start times of those running. The call side is atomic
// operations only. The scrape side (lastSeen, lastCount, lastCountGen) is
// guarded by the Collector's mu, and written by the creator only before the
// observers are published under obsMu.
type queueObs struct {
	name   string
	bounds []int64         // the Collector's, ns
	counts []atomic.Uint64 // per bucket, not cumulative; the last is +Inf
	sumNS  atomic.Uint64
	calls  slotChunk
	// dead is set while the scrape removes the observers of a queue gone
	// (see sweepObs); a call that finds it set looks its queue up again.
	dead atomic.Bool

	lastSeen     uint64 // the last scrape whose Stats had the queue, or the scrape when made
	lastCount    uint64 // the count when the scrape lastCountGen found the queue gone
	lastCountGen uint64
}

// slotsPerChunk is how many running calls a slotChunk holds: one cache
// line of start times.
const slotsPerChunk = 8

// slotChunk holds the start times of running calls, 0 for a free slot.
// Chunks are added as calls run at once and never removed, so a queue holds
// as many as its most calls ever running at once needed.
type slotChunk struct {
	start [slotsPerChunk]atomic.Int64
	next  atomic.Pointer[slotChunk]
}

// acquire stores t in a free slot and returns it.
func (s *slotChunk) acquire(t int64) *atomic.Int64 {
	for {
		for i := range s.start {
			if p := &s.start[i]; p.Load() == 0 && p.CompareAndSwap(0, t) {
				return p
			}
		}
		n := s.next.Load()
		if n == nil {
			n = new(slotChunk)
			if !s.next.CompareAndSwap(nil, n) {
				n = s.next.Load()
			}
		}
		s = n
	}
}

// enter starts observing a call of queue: it finds the queue's observers
// (through cache, which holds the chain's last) and takes a slot for the
// call's start time.
func (c *Collector) enter(cache *atomic.Pointer[queueObs], queue string) (*queueObs, *atomic.Int64, int64) {
	start := c.now()
	o := cache.Load()
	for {
		if o == nil || o.name != queue {
			o = c.obsFor(queue)
			cache.Store(o)
		}
		slot := o.calls.acquire(start)
		// The slot is taken before dead is read, and sweepObs sets dead
		// before it looks at the slots: either this call sees dead, or the
		// sweep sees the call.
		if !o.dead.Load() {
			return o, slot, start
		}
		slot.Store(0)
		o = nil
	}
}

// leave observes the call that took slot at start, then frees the slot
// (in this order, so that a sweep that finds the slot free finds the count
// changed).
func (o *queueObs) leave(slot *atomic.Int64, start int64, c *Collector) {
	d := c.now() - start
	i, j := 0, len(o.bounds) // the first bound >= d, by bisection
	for i < j {
		if h := int(uint(i+j) >> 1); d > o.bounds[h] {
			i = h + 1
		} else {
			j = h
		}
	}
	o.counts[i].Add(1)
	o.sumNS.Add(uint64(max(d, 0)))
	slot.Store(0)
}

// stuck counts the calls that started more than after before now.
func (o *queueObs) stuck(now, after int64) int {
	n := 0
	for s := &o.calls; s != nil; s = s.next.Load() {
		for i := range s.start {
			if t := s.start[i].Load(); t != 0 && now-t > after {
				n++
			}
		}
	}
	return n
}

// busy says whether a call of o is running.
func (o *queueObs) busy() bool {
	for s := &o.calls; s != nil; s = s.next.Load() {
		for i := range s.start {
			if s.start[i].Load() != 0 {
				return true
			}
		}
	}
	return false
}

// count is how many calls o observed.
func (o *queueObs) count() uint64 {
	var n uint64
	for i := range o.counts {
		n += o.counts[i].Load()
	}
	return n
}

// obsFor returns the observers of queue, made on its first call.
func (c *Collector) obsFor(queue string) *queueObs {
	c.obsMu.Lock()
	defer c.obsMu.Unlock()
	if o := c.obs[queue]; o != nil {
		return o
	}
	gen := c.gen.Load()
	o := &queueObs{name: queue, bounds: c.bounds, counts: make([]atomic.Uint64, len(c.bounds)+1),
		lastSeen: gen, lastCountGen: gen}
	c.obs[queue] = o
	return o
}

// lookupObs returns the observers of queue, or nil if no call of it was
// observed.
func (c *Collector) lookupObs(queue string) *queueObs {
	c.obsMu.Lock()
	defer c.obsMu.Unlock()
	return c.obs[queue]
}

// sweepObs forgets the observers of the queues gone, so that a process
// whose queues come and go (WithQueueExpiry) does not keep them all: those of
// a queue that the last two scrapes did not find, with no call running and
// none observed since the last scrape. present is how many of the
// observers this scrape found. A queue of that name made again later gets
// new observers, and its histogram starts again from 0, as its counters do.
// The caller holds mu.
func (c *Collector) sweepObs(gen uint64, present int) {
	c.obsMu.Lock()
	defer c.obsMu.Unlock()
	if present == len(c.obs) {
		return
	}
	for name, o := range c.obs {
		if o.lastSeen == gen {
			continue
		}
		n := o.count()
		if gen-o.lastSeen >= 2 && o.lastCountGen == gen-1 && n == o.lastCount {
			o.dead.Store(true)
			// A call that took a slot before dead was set is seen here;
			// one that ended since the last scrape changed the count.
			if !o.busy() && o.count() == n {
				delete(c.obs, name)
				continue
			}
			o.dead.Store(false)
			n = o.count()
		}
		o.lastCount, o.lastCountGen = n, gen
	}
}
