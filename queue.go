package tinymq

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxBatch is the most messages a worker takes under one lock.
	maxBatch = 64
	// MaxConcurrency is the most workers one queue may have.
	MaxConcurrency = 4096
	// abortBit marks queue.begun once Shutdown's deadline has passed.
	abortBit = 1 << 63
	// sampleEvery: a worker times one consumer call in sampleEvery, its first
	// included, and every call of a message that it found alone in the
	// queue (see deliver), since reading the clock twice costs as much as
	// the rest of a delivery on some machines: a queue that is not busy has
	// every call timed, a busy one about one in 64.
	sampleEvery = 64
)

// takesShared reports whether q may hold plain entries. A shared prototype is
// never written, so the queue must not need one of its own: no filter (it sees
// the Msg before enqueue), no TTL (enqueueLocked stamps expires on the Msg)
// and no length limit (eviction dead-letters the Msg).
func (q *queue) takesShared() bool {
	return q.cfg.filter == nil && q.cfg.ttl == 0 && q.cfg.maxLen == 0 && !q.cfg.durable && !q.cfg.groups
}

// queue is a named buffer drained by a fixed pool of workers.
//
// A worker takes a batch of entries under mu and then claims them one at a
// time with an atomic add, without the lock. Until claimed, an entry still
// waits: it counts in Depth, and a worker that finds buf empty steals it
// (under mu) rather than sleep, so a slow message never holds back the
// messages taken with it while another worker is idle.
type queue struct {
	// What the publisher and a worker that keeps up both write for every
	// message, first and together: mu and buf's ends on one cache line (a
	// queue is allocated in a size class of 64-byte multiples, so offset 0
	// starts a line), buf's floors and the counters on the next. Spread over
	// more lines, each message moved each of them between the two cores.
	mu       sync.Mutex
	buf      fifo
	accepted uint64 // messages published into the queue
	entered  uint64 // entries into buf or the scheduler: accepted messages and retries
	busy     int    // workers holding a batch
	takes    uint64 // batches taken: the order in which entries given back return to buf

	id   int
	name string
	cfg  queueConfig
	mq   *MQ
	// inbox takes plain publishes without mu (see acceptPlain); nil until
	// the first of them (see newInbox), and for good unless plain (the
	// queue takes shared entries, see takesShared). Moved into buf by every
	// holder of mu.
	inbox atomic.Pointer[inbox]
	plain bool
	// gone: deleted (DeleteQueue or expiry). Written under the MQ's write
	// lock and q.mu, so readable under either.
	gone bool

	cond        sync.Cond       // L is &mu; signalled once per parked worker to wake
	workers     []*worker       // one per worker slot of every subscription, for stealing and counting; replaced, never changed
	subs        []*Subscription // the subscriptions not cancelled, in the order they came
	active      int             // their workers: each one's fair share of a refill
	paused      bool            // PauseQueue: no worker takes a message
	usedAt      int64           // UnixNano: when the queue was last declared, consumed or left without consumers (WithQueueExpiry)
	expiryArmed bool            // the scheduler holds an expire item for the queue
	gen         uint32          // purges and deletes so far: a scheduler item of an older gen is gone
	purgeGen    uint32          // gen right after the last purge: an item older than it was the purge's (see release)
	idle        atomic.Int32    // workers in cond.Wait, or woken and not yet holding mu again, or about to park and looking at the inbox once more; written under mu (see take, wakeThief, acceptPlain)
	waking      atomic.Int32    // wakes sent, or about to be, that no woken worker has taken mu for since (see wakeOneLocked); written under mu
	scheduled   int             // messages waiting in the scheduler for a delay or a retry
	stopping    bool            // the MQ is stopping: report when quiescent
	closed      bool            // workers exit once buf is empty
	shut        atomic.Bool     // closed, readable without mu (see reserve)
	aborted     bool            // Shutdown's deadline passed: nothing more is delivered
	room        chan struct{}   // closed when there may be room (Block publishers wait on it)
	expiryAt    int64           // when the scheduler checks the head for expiry; 0: no check pending
	reserved    int             // room held for publishes between reserve and acceptReserved
	inbound     int             // admitted publishes writing to the log without the MQ's lock: not quiescent
	inboundDead int             // of those, dead letters (see abort)
	failing     int             // failures whose end is not decided yet: in hand (see queue.fail)
	abortLost   uint64          // what abort counted as undelivered, for drain to log
	abortBegun  uint64          // the workers' begins (q.left's included) that abort read, setting abortBit
	left        retiredCounts   // what the workers that left counted
	inboundGone chan struct{}   // closed when a deleted queue's last inbound publish arrived (see DeleteQueue)
	abandoned   int             // calls that outlived WithDeliveryTimeout and still run, their slots given to new goroutines
	tokens      float64         // WithRateLimit: the bucket's tokens at tokensAt
	tokensAt    int64           // UnixNano of the last refill of tokens
	rateArmed   bool            // the scheduler holds a rate item: it wakes the queue when the next token is due

	// WithGroupOrdering (see groups.go); nil and zeros otherwise.
	groups   map[string]*groupState // the groups with a message out
	grouped  int                    // messages waiting in the groups' backlogs: they count as ready
	groupSeq uint64                 // groups given a state so far

	// The counters below, which workers write as messages fail (c) and as
	// they sample call durations (hist), get a cache line of their own,
	// away from the fields publishers write under mu.
	_     [64]byte
	begun atomic.Uint64 // entries that left buf to be handled other than by a worker (which counts its own: worker.begun); abortBit once aborted
	c     queueCounters
	hist  histogram
}

// retiredCounts is what the workers that left a queue (their subscription
// was cancelled, or the MQ stopped) began, delivered and saw succeed.
type retiredCounts struct {
	begun, delivered, succeeded, skipped uint64
}

type queueCounters struct {
	failed, retried                   atomic.Uint64
	deadLettered, expired, overflowed atomic.Uint64
	rejected, dropped, undelivered    atomic.Uint64
	purged, removed, replayed         atomic.Uint64
	timedOut                          atomic.Uint64 // WithDeliveryTimeout's deadline passed first
}

func newQueue(id int, name string, cfg queueConfig, mq *MQ) *queue {
	q := &queue{id: id, name: name, mq: mq, cfg: cfg, usedAt: time.Now().UnixNano()}
	if q.cfg.retry.MaxAttempts == 0 {
		q.cfg.retry.MaxAttempts = 1
	}
	q.cond.L = &q.mu
	q.tokens = float64(cfg.burst)
	q.plain = q.takesShared()
	return q
}

// tokenLocked takes a token of WithRateLimit's bucket, after refilling it
// from the clock, and returns 0; or, when the bucket holds less than one,
// returns how long until it will, taking nothing. A queue without a rate
// limit never calls it. q.mu is held.
func (q *queue) tokenLocked() time.Duration {
	now := time.Now().UnixNano()
	if q.tokensAt == 0 {
		q.tokensAt = now // the bucket starts full
	}
	if elapsed := now - q.tokensAt; elapsed > 0 {
		q.tokens = min(q.tokens+float64(elapsed)/1e9*q.cfg.rate, float64(q.cfg.burst))
		q.tokensAt = now
	}
	const slack = 1e-9 // float rounding must not make a due token wait for another wake
	if q.tokens >= 1-slack {
		q.tokens--
		return 0
	}
	// A rate so small that the wait is past what a Duration holds waits
	// "forever" (292 years), saturating instead of overflowing into a
	// negative wait that would wake the queue every nanosecond.
	w := math.Ceil((1 - q.tokens) / q.cfg.rate * 1e9)
	if w >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(time.Duration(w), 1)
}

// rateWake is the scheduler's wake of a rate-limited queue whose next token
// is due: a parked worker takes it (see take).
func (q *queue) rateWake() {
	q.lock()
	q.rateArmed = false
	wake := q.wakeForLocked(q.buf.n)
	q.mu.Unlock()
	q.wakeAfter(wake, 0)
}

// fullLocked reports whether the queue is at its length limit, counting the
// room held for publishes under way. Bounded queues take one message at a
// time, so no batch holds waiting messages. q.mu is held.
func (q *queue) fullLocked() bool {
	return q.cfg.maxLen > 0 && q.buf.n+q.scheduled+q.reserved+q.grouped >= q.cfg.maxLen
}

// roomLocked returns a channel closed when the queue may have room. q.mu is held.
func (q *queue) roomLocked() <-chan struct{} {
	if q.room == nil {
		q.room = make(chan struct{})
	}
	return q.room
}

// freeRoomLocked wakes the publishers waiting for room. q.mu is held.
func (q *queue) freeRoomLocked() {
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
}

// accept is the publish path's way into an unbounded queue: it enqueues e,
// visible at now (zero when nothing has a TTL), with the message's own TTL
// ttl. It returns ErrStopped when the queue is closed.
func (q *queue) accept(e entry, now time.Time, ttl time.Duration) error {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return ErrStopped
	}
	_, wake := q.enqueueLocked(e, now, 0, ttl)
	var expiry int64
	if e.expiresAt() != 0 {
		// Only a message with a deadline may need a check: any other head
		// was armed when it became the head.
		expiry = q.armExpiryLocked()
	}
	q.mu.Unlock()
	q.wakeAfter(wake, expiry)
	return nil
}

// reserve admits one more message into q and holds room for it until
// acceptReserved or unreserve: nil, or room to wait on (Block; never for
// internal publishes), or an error. Room held counts towards the limit, so
// that a publish to several queues is all or nothing without holding their
// locks together.
func (q *queue) reserve(internal bool) (room <-chan struct{}, err error) {
	if q.cfg.maxLen == 0 {
		// No limit: no room to hold, only the closed check (acceptReserved
		// checks again under mu).
		if q.shut.Load() {
			return nil, ErrStopped
		}
		return nil, nil
	}
	q.lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrStopped
	}
	if q.fullLocked() && q.cfg.overflow != DropHead {
		if q.cfg.overflow == Block && !internal {
			return q.roomLocked(), nil
		}
		q.c.rejected.Add(1)
		return nil, fmt.Errorf("%w: %q", ErrQueueFull, q.name)
	}
	q.reserved++
	return nil, nil
}

// unreserve gives back room that reserve held, and the hold of holdInbound
// when inbound.
func (q *queue) unreserve(inbound, dead bool) {
	if q.cfg.maxLen == 0 && !inbound {
		return // reserve held nothing
	}
	q.lock()
	if q.cfg.maxLen > 0 {
		q.reserved--
		q.freeRoomLocked()
	}
	if inbound {
		q.endInboundLocked(dead)
		q.inboundArrivedLocked()
		q.reportIfQuiescentLocked()
	}
	q.mu.Unlock()
}

// acceptReserved enqueues e into the room reserve held (see enqueueLocked
// for now, delay, ttl and the evicted message), ending the hold of
// holdInbound when inbound, and returns q.gen for a delayed e's scheduler
// item. It fails only when the queue was aborted or deleted since. An
// inbound message is past the point of no return then (its record may be on
// disk, and other queues may have taken it), so an aborted queue counts it
// as accepted and undelivered, as the abort counted what it held, and
// returns errAbortedUndelivered (a durable one is delivered after a
// restart); a deleted queue counts it as accepted and removed, as the
// delete counted what it held, and returns errRemovedOnArrival.
func (q *queue) acceptReserved(e entry, now time.Time, delay, ttl time.Duration, inbound, dead bool) (evicted *Msg, gen uint32, err error) {
	q.lock()
	if q.cfg.maxLen > 0 {
		q.reserved--
	}
	if inbound {
		q.endInboundLocked(dead)
	}
	if q.closed {
		switch {
		case inbound && q.gone:
			q.accepted++
			q.c.removed.Add(1)
			q.inboundArrivedLocked()
			err = errRemovedOnArrival
		case inbound && q.aborted:
			q.accepted++
			q.abortLost++
			q.c.undelivered.Add(1)
			err = errAbortedUndelivered
		default:
			err = ErrStopped
		}
		q.mu.Unlock()
		return nil, 0, err
	}
	evicted, wake := q.enqueueLocked(e, now, delay, ttl)
	if evicted != nil {
		q.mq.evictedInTransit(1) // until settleEvicted dead-letters it
	}
	expiry := q.armExpiryLocked()
	gen = q.gen
	if inbound {
		// A stopping MQ waited for this publish; in a queue that no
		// consumer takes, its arrival leaves the queue quiescent, and no
		// worker will say so.
		q.reportIfQuiescentLocked()
	}
	q.mu.Unlock()
	q.wakeAfter(wake, expiry)
	return evicted, gen, nil
}

// inboundArrivedLocked tells a DeleteQueue waiting for the inbound
// publishes of its deleted queue that the last one arrived. q.mu is held.
func (q *queue) inboundArrivedLocked() {
	if q.inbound == 0 && q.inboundGone != nil {
		close(q.inboundGone)
		q.inboundGone = nil
	}
}

// wakeAfter does what an enqueue asked for once q.mu is released: wake a
// parked worker, and have the scheduler check the head for expiry.
func (q *queue) wakeAfter(wake bool, expiry int64) {
	if wake {
		q.cond.Signal()
	}
	if expiry != 0 {
		q.mq.sched.add(schedItem{due: time.Unix(0, expiry), q: q})
	}
}

// enqueueLocked accepts e, which the caller made visible at now (zero when the
// queue has no TTL and e no delay). q.mu is held, the queue is open, and a
// limit other than DropHead has room. A delayed e is only counted here: the
// caller hands it to the scheduler after unlocking. It returns the message that
// DropHead evicted (e's own when every message waits in the scheduler), if
// any, and whether a parked worker should be woken. An entry with a TTL or a
// delay owns its Msg (plain entries have neither).
func (q *queue) enqueueLocked(e entry, now time.Time, delay, ttl time.Duration) (evicted *Msg, wake bool) {
	if q.fullLocked() && !q.stillLocked() { // DropHead; a queue that holds still keeps what comes
		if q.buf.n > 0 {
			h := q.popLocked()
			evicted = h.msg(q.name)
		} else if h, ok := q.evictBacklogLocked(); ok {
			// Every ready message waits behind its group: the oldest of them goes.
			evicted = h.msg(q.name)
		} else {
			// Every message waits in the scheduler: the newcomer is the one to go.
			q.accepted++
			return e.msg(q.name), false
		}
	}
	q.accepted++
	q.entered++
	if q.cfg.ttl > 0 && (ttl == 0 || q.cfg.ttl < ttl) {
		ttl = q.cfg.ttl
	}
	if ttl > 0 {
		e.m.ext().expires = deadline(now, sat(delay, ttl))
	}
	if delay > 0 {
		q.scheduled++ // a grouped one finds its group's place when it is due (see release)
		return evicted, false
	}
	at := q.mq.sched.stamp()
	if q.cfg.groups && q.holdGroupLocked(e, at) {
		return evicted, false // its group has a message out: it waits behind it
	}
	q.buf.push(e, at)
	return evicted, q.wakeOneLocked()
}

// wakeOneLocked reports whether a parked worker should be woken for the
// entries in buf, and counts it as waking. One wake at a time: a woken
// worker that takes a batch and leaves entries behind wakes the next (see
// take), so a backlog still reaches every worker, while a trivial consumer's
// worker, back for more before another could wake, does not drag the others
// through a park and a wake for each message. q.mu is held.
func (q *queue) wakeOneLocked() bool {
	return q.wakeForLocked(q.buf.n)
}

// wakeForLocked is wakeOneLocked for n entries that a parked worker could
// take: in buf, or in a batch that it could steal from. q.mu is held.
//
// The counts need no reset when a Broadcast wakes every worker: each woken
// worker takes itself out of idle, and one wake off waking, once it holds
// q.mu again (see take). waking never exceeds idle, so while a wake is
// counted, a worker is on its way back to the lock, and it looks at buf then.
func (q *queue) wakeForLocked(n int) bool {
	if n == 0 || q.waking.Load() > 0 || q.idle.Load() == 0 {
		return false
	}
	q.waking.Add(1)
	return true
}

// wakeIfWaitingLocked is wakeForLocked for every entry that waits: in buf,
// and unclaimed in any worker's batch (which a woken worker steals). Counting
// them all, not only the caller's, means that a wake that wakeThief or
// enqueue left to a worker already waking is passed on by that worker,
// whatever it finds first. q.mu is held.
func (q *queue) wakeIfWaitingLocked() bool {
	if q.idle.Load() == 0 || q.waking.Load() > 0 {
		return false
	}
	return q.wakeForLocked(q.buf.n + q.batchedLocked())
}

// popLocked takes the head of buf for something other than a worker (an
// eviction, an expiry), counting it as begun. A grouped head was its group's
// message out: the next of the group joins buf. q.mu is held; buf is not
// empty.
func (q *queue) popLocked() entry {
	e, _ := q.buf.popOne()
	q.begun.Add(1)
	if q.cfg.groups {
		if g := e.group(); g != "" {
			q.groupDoneLocked(g)
		}
	}
	return e
}

// sat returns a+b for non-negative durations, saturating instead of
// overflowing.
func sat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// deadline returns now+d in Unix nanoseconds, saturating at MaxInt64 (the
// year 2262) instead of overflowing into the past.
func deadline(now time.Time, d time.Duration) int64 {
	n := now.UnixNano()
	if d > 0 && n > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return n + int64(d)
}

// armExpiryLocked returns when the scheduler should check the head of buf
// for expiry, if it must be told: the head has a deadline earlier than any
// check already pending. q.mu is held.
func (q *queue) armExpiryLocked() int64 {
	h, ok := q.buf.peek()
	if !ok {
		return 0
	}
	at := h.expiresAt()
	if at == 0 || (q.expiryAt != 0 && q.expiryAt <= at) || q.stillLocked() {
		return 0
	}
	q.expiryAt = at
	return at
}

// stillLocked reports whether the queue holds still: the MQ is stopping and
// no consumer takes its messages (it has none, or is paused; nothing can
// change that once the stop began). Its messages then no longer expire, nor
// does DropHead evict one for a dead letter that arrives (the queue keeps
// it, past its limit), and they wait for the stop to strand them: messages
// cycling through it (a retry loop through a queue with a TTL or a length
// limit and no consumer, dead-lettering back) would otherwise keep the MQ
// busy, and the stop waiting, for good. q.mu is held.
func (q *queue) stillLocked() bool {
	return q.stopping && q.parkedLocked()
}

// expireHead dead-letters the expired messages at the head of buf, as
// RabbitMQ does when a message's TTL passes at the head of its queue, even
// while every consumer is busy; not in a queue that holds still during a
// stop (see stillLocked). The scheduler calls it. The dead letters count in
// the MQ's transit until they have landed.
func (q *queue) expireHead() {
	now := time.Now().UnixNano()
	var dead []*Msg
	q.lock()
	q.expiryAt = 0
	for !q.aborted && !q.stillLocked() {
		h, ok := q.buf.peek()
		if !ok || h.expiresAt() == 0 || h.expiresAt() > now {
			break
		}
		e := q.popLocked()
		dead = append(dead, e.msg(q.name)) // a restored one is read by deadLetter, without the lock
	}
	if len(dead) > 0 {
		// Settling (see MQ.settling) before the lock is released: the
		// expired messages have reached their end for a Shutdown deadline,
		// and dead-lettering them runs user code.
		q.mq.settleBegin()
		defer q.mq.settling.Add(-1)
		q.mq.transit.Add(int64(len(dead)))
		defer q.mq.transitDone(len(dead))
		q.freeRoomLocked()
		// The expiry may have taken what a stopping MQ was waiting for,
		// from under a worker that was woken for it and will find nothing
		// (and so report nothing): the queue reports itself.
		q.reportIfQuiescentLocked()
	}
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(false, expiry)
	for _, m := range dead {
		q.c.expired.Add(1)
		q.deadLetter(m, ReasonExpired, m.lastErr())
	}
}

// reportIfQuiescentLocked tells a stopping MQ that this queue has nothing left
// to do. q.mu is held.
func (q *queue) reportIfQuiescentLocked() {
	if q.stopping && q.quiescentLocked() {
		select {
		case q.mq.idle <- struct{}{}:
		default:
		}
	}
}

// quiescentLocked reports whether the queue has nothing left to do: no
// worker holds a batch and no publish is inbound, and no message waits,
// unless no consumer can take it (the queue has none, or is paused): what
// waits then stays, as it would in a broker (see MQ.drain). q.mu is held.
func (q *queue) quiescentLocked() bool {
	if q.busy > 0 || q.inbound > 0 {
		return false
	}
	return q.parkedLocked() || (q.buf.n == 0 && q.scheduled == 0 && q.grouped == 0)
}

// parkedLocked reports whether no consumer takes the queue's messages: it
// has none, or it is paused. q.mu is held.
func (q *queue) parkedLocked() bool {
	return q.paused || len(q.subs) == 0
}

// strand counts what waits in the queue as undelivered, when no consumer
// takes it (see parkedLocked), and returns how many: the MQ is stopping and
// quiescent, and a durable queue keeps them in the log. It pops them, so
// that an abort does not count them again, and closes the queue: a message
// that would reach it later (a dead letter that expired out of another
// parked queue, whose head the scheduler still watches) is refused, and
// counted where it died, rather than left in a queue already counted.
// When it returns more than 0, it has counted the caller, which logs them, in
// the MQ's settling (see MQ.settling), under q.mu: the caller takes it off.
func (q *queue) strand() int {
	q.lock()
	defer q.mu.Unlock()
	return q.strandLocked()
}

// strandLocked is strand with q.mu held.
func (q *queue) strandLocked() int {
	if q.aborted || !q.parkedLocked() {
		return 0
	}
	q.closed = true
	q.shut.Store(true)
	n := q.buf.n + q.scheduled + q.grouped
	for q.buf.n > 0 {
		q.popLocked()
	}
	q.dropBacklogsLocked(nil)
	if q.scheduled > 0 {
		q.begun.Add(uint64(q.scheduled))
		q.scheduled = 0
		q.gen++ // the scheduler's items are gone: see release
	}
	q.c.undelivered.Add(uint64(n))
	if n > 0 {
		if !q.cfg.durable { // a durable queue's stay in its log
			q.mq.stranded.Add(int64(n))
		}
		q.mq.settleBegin() // the drain logs them: see MQ.settling
	}
	return n
}

// holdInbound counts a publish that q admitted and that now leaves the MQ's
// read lock to write the log: until acceptReserved or unreserve, a stopping
// MQ waits for it as for a message in the queue, so that Stop still sees
// each publish completely or not at all.
// dead marks a dead letter of the MQ's own (see abort).
func (q *queue) holdInbound(dead bool) {
	q.lock()
	q.inbound++
	if dead {
		q.inboundDead++
	}
	q.mu.Unlock()
}

// endInboundLocked ends the hold of holdInbound. q.mu is held.
func (q *queue) endInboundLocked(dead bool) {
	q.inbound--
	if dead {
		q.inboundDead--
	}
}

// release moves a message that the scheduler found due into buf, unless a
// purge or a delete since (gen) or an abort took it: they counted it and
// zeroed scheduled.
func (q *queue) release(m *Msg, gen uint32) {
	q.lock()
	if q.aborted || q.gone || gen != q.gen {
		// A purge or a delete counted m, which the scheduler had already
		// taken when they dropped its items: what they acknowledged in the
		// log did not include it. An abort, or a stop's strand, leaves it
		// in the log for the next start.
		removed := !q.aborted && (q.gone || int32(gen-q.purgeGen) < 0)
		if q.cfg.groups && !q.aborted && m.Attempt > 0 {
			// A retry the purge took held its group: the group goes on. (A
			// delayed message has not joined its group yet.)
			q.groupDoneLocked(m.Group())
		}
		q.mu.Unlock()
		if k := m.dkey(); removed && k != "" {
			q.mq.dur.ack(q.name, k, nil)
		}
		return
	}
	q.scheduled--
	e, at := entry{m: m}, q.mq.sched.stamp()
	if q.cfg.groups && m.Attempt == 0 && q.holdGroupLocked(e, at) {
		// A delayed message whose group has a message out: it waits behind it.
		q.mu.Unlock()
		return
	}
	q.buf.push(e, at)
	wake := q.wakeOneLocked()
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(wake, expiry)
}

// schedule counts a retry of m, due after backoff, in the queue and hands it
// to the scheduler. A queue at its length limit makes room as a publish
// would: DropHead evicts its oldest ready message; otherwise the retry itself
// cannot wait and is returned as overflow. After abort it is undelivered;
// after a delete (gone), removed.
func (q *queue) schedule(m *Msg, backoff time.Duration, held bool) (evicted, overflow *Msg, aborted, gone bool) {
	q.lock()
	if held {
		q.failing-- // decided here (see queue.fail)
	}
	if q.aborted || q.gone {
		q.mu.Unlock()
		return nil, nil, q.aborted, q.gone
	}
	if q.fullLocked() {
		if q.cfg.overflow != DropHead || q.buf.n == 0 {
			q.mu.Unlock()
			return nil, m, false, false
		}
		h := q.popLocked()
		evicted = h.msg(q.name)
	}
	q.scheduled++
	q.entered++
	gen := q.gen
	q.mu.Unlock()
	q.later(schedItem{due: time.Now().Add(backoff), q: q, m: m, gen: gen})
	return evicted, nil, false, false
}

// later hands the scheduler it, the item of a message that q counted in
// scheduled at generation it.gen, with q.mu released since. A purge, a
// delete or an abort in between counted the message but could not find its
// item: later then takes it back at once and settles it as release settles
// an item the scheduler had taken (the purge's: its log record is
// acknowledged and a retry's group goes on), not when its delay or backoff
// ends, perhaps hours later, with its group held that long and the record
// still in the log for a restart to bring back.
func (q *queue) later(it schedItem) {
	s := q.mq.sched
	s.add(it)
	q.lock()
	stale := it.gen != q.gen || q.aborted
	q.mu.Unlock()
	if stale && s.remove(q, it.m) {
		q.release(it.m, it.gen)
	}
}

// stop marks the queue as stopping and wakes the publishers waiting for room,
// which then see that the MQ is stopping.
func (q *queue) stop() {
	q.lock()
	q.stopping = true
	q.freeRoomLocked()
	q.mu.Unlock()
}

// close lets the workers exit once buf is empty.
func (q *queue) close() {
	q.lock()
	q.closed = true
	q.shut.Store(true)
	q.mu.Unlock()
	q.cond.Broadcast()
}

// abort closes the queue and drops what no worker has begun to deliver: in
// buf, in batches, and in the scheduler. It returns how many entries will
// never reach the consumer (inbound publishes included, which acceptReserved
// counts as undelivered when they come; one whose log write then fails is
// not accepted, and so counted here only), and how many messages workers
// began and have not finished with: in the consumer, or about to enter it
// (a worker that began a message just before the abort calls its consumer
// after it, with its context cancelled).
// The abort bit is set under q.mu, so that an eviction or expiry (which
// count as begun under q.mu) is counted either as begun or as undelivered,
// never both.
func (q *queue) abort() (undelivered, running uint64) {
	q.lock()
	if q.aborted {
		q.mu.Unlock()
		return 0, 0
	}
	workers := q.left.begun
	for _, w := range q.workers {
		workers += w.begun.Or(abortBit) &^ abortBit
	}
	begun := q.begun.Or(abortBit)&^abortBit + workers
	q.aborted, q.closed = true, true
	q.abortBegun = workers
	q.shut.Store(true)
	q.buf.clear()
	q.groups, q.grouped = nil, 0 // entered counted the backlogs: undelivered below
	q.scheduled = 0
	q.freeRoomLocked()
	undelivered = q.entered - begun
	q.abortLost = undelivered
	// acceptReserved counts them when they come. Not the dead letters: the
	// goroutine that dead-letters one is counted in the MQ's settling (or
	// evicting) until it is done, and its end is counted where it died
	// (dropped, should its log write fail after the abort closed the log).
	inbound := uint64(q.inbound - q.inboundDead)
	running = q.inHandLocked() // no worker can begin any more
	q.mu.Unlock()
	q.cond.Broadcast()
	q.mq.sched.dropQueue(q)
	q.c.undelivered.Add(undelivered)
	return undelivered + inbound, running
}

// inHandLocked is how many messages the workers began and have not
// finished with: in the consumer, or about to enter it. Stopping counts
// these, not inFlight's deliveries, so that a message begun and not yet
// counted as delivered is not missed. q.mu is held.
//
// The begins are read before the ends, and the failures (counted per
// queue) last; a failure whose end is not decided yet (failing: its retry
// not yet scheduled) is still in hand. Once the queue is aborted, the begins are those abort read
// as it set abortBit: a worker's count goes on rising after that, by
// begins that were refused, so it is not read again. The ends read are
// then those of messages whose begins were counted, and the result is
// exact; while workers still begin, a message begun and ended during the
// reads can be missed.
func (q *queue) inHandLocked() uint64 {
	begun := q.abortBegun
	if !q.aborted {
		begun = q.left.begun
		for _, w := range q.workers {
			begun += w.begun.Load() &^ abortBit
		}
	}
	ended := q.left.skipped + q.left.succeeded
	for _, w := range q.workers {
		ended += w.skipped.Load() + w.succeeded.Load()
	}
	// Signed: while workers still begin, an end read after its begin was
	// missed can make the difference negative.
	return uint64(max(int64(begun)-int64(ended)-int64(q.c.failed.Load())+int64(q.failing), 0))
}

// inHand is inHandLocked, taking q.mu.
func (q *queue) inHand() uint64 {
	q.lock()
	defer q.mu.Unlock()
	return q.inHandLocked()
}

// inFlightLocked is how many messages are in the consumer now (Stats'
// InFlight). q.mu is held.
//
// Deliveries are read first: a message counted as done was counted as
// delivered before, so what moves during the reads can make the result
// smaller than the truth, never larger than the workers.
func (q *queue) inFlightLocked() uint64 {
	d := q.deliveredLocked()
	if done := q.succeededLocked() + q.c.failed.Load(); d > done {
		return d - done
	}
	return 0
}

// deliveredLocked is how many messages the workers handed to the consumer.
// q.mu is held.
func (q *queue) deliveredLocked() uint64 {
	n := q.left.delivered
	for _, w := range q.workers {
		n += w.delivered.Load()
	}
	return n
}

// succeededLocked is how many deliveries succeeded. q.mu is held.
func (q *queue) succeededLocked() uint64 {
	n := q.left.succeeded
	for _, w := range q.workers {
		n += w.succeeded.Load()
	}
	return n
}

// begin counts an entry as taken by w to be handled; false once the queue
// is aborted (abort sets abortBit in every worker's count under q.mu, and
// adds them up). After abort the count goes on rising, unread, below
// abortBit.
func (w *worker) begin() bool {
	return w.begun.Add(1)&abortBit == 0
}

// errAbortedUndelivered and errRemovedOnArrival are acceptReserved's
// answers for an inbound message that an aborted queue counted as
// undelivered, or a deleted one as removed.
var (
	errAbortedUndelivered = errors.New("accepted by an aborted queue: undelivered")
	errRemovedOnArrival   = errors.New("accepted by a deleted queue: removed")
)

// restore takes the entries of messages recovered from the log, each with
// the time it is due (a delay or a retry backoff), in their order, into the
// new queue q. A DropHead length limit applies as to a publish (as RabbitMQ
// applies a max-length policy to a queue that holds more): the oldest ready
// message goes, or, when every one waits in the scheduler, the newcomer; the
// evicted are returned for the caller to dead-letter once the MQ's lock is
// released, and the entries due later for it to hand to the scheduler.
// entries runs under q.mu: it only builds entries.
//
// With WithGroupOrdering, entries come in publish order, and each group's
// message that was retrying (its group's message out when the log was last
// written) goes first, so that its group's later messages wait behind it.
func (q *queue) restore(entries iter.Seq2[entry, int64], now int64) (evicted []eviction, later []schedItem) {
	q.lock()
	if q.cfg.groups {
		entries = retriedFirst(entries)
	}
	for e, due := range entries {
		if q.cfg.overflow == DropHead && q.fullLocked() {
			if q.buf.n > 0 {
				h := q.popLocked()
				evicted = append(evicted, eviction{q, h.msg(q.name)})
			} else {
				q.accepted++
				evicted = append(evicted, eviction{q, e.msg(q.name)})
				continue
			}
		}
		q.accepted++
		q.entered++
		if due > now {
			// A retry backing off is its group's message out; a delayed
			// message finds its group's place when it is due (see release).
			if q.cfg.groups && e.m.Attempt > 0 && q.holdGroupLocked(e, 0) { // not ready: no stamp, as before the entry lost its own
				continue
			}
			q.scheduled++
			later = append(later, schedItem{due: time.Unix(0, due), q: q, m: e.m})
			continue
		}
		// Stamped when it became ready, before the restart.
		if q.cfg.groups && q.holdGroupLocked(e, due) {
			continue
		}
		q.buf.push(e, due)
	}
	q.mq.evictedInTransit(len(evicted)) // until unlock dead-letters them (settleEvicted)
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(false, expiry)
	return evicted, later
}

// retriedFirst yields the grouped entries of entries that were retrying
// (attempted before the restart) first, then the others, each in its order.
func retriedFirst(entries iter.Seq2[entry, int64]) iter.Seq2[entry, int64] {
	type pending struct {
		e   entry
		due int64
	}
	var all []pending
	for e, due := range entries {
		all = append(all, pending{e, due})
	}
	retried := func(p *pending) bool { return p.e.m.Attempt > 0 && p.e.group() != "" }
	return func(yield func(entry, int64) bool) {
		for _, first := range []bool{true, false} {
			for i := range all {
				if retried(&all[i]) == first && !yield(all[i].e, all[i].due) {
					return
				}
			}
		}
	}
}
