package tinymq

import (
	"fmt"
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
	// included, since reading the clock twice costs as much as the rest of a
	// delivery on some machines.
	sampleEvery = 16
)

// chunkSize is how many entries one chunk of a fifo holds.
const chunkSize = 64

// entry is one message waiting in a queue. Most are shared: published with no
// TTL or delay to a queue with no filter, limit or log (see takesShared).
// Those point to a record of the message that every queue it reached shares
// (m.shared): its exchange's prototype Msg for a plain message (no routing
// key, headers or deaths), else one Msg made by the publish. The worker makes
// the consumer's Msg from m, id and data (a direct consumer needs none), so
// that Publish allocates at most one record, whatever the number of queues,
// and a queued message costs a queue 32 bytes. A message that a durable
// queue restored from the log is a restored entry: m is restoredMark and
// data a *restored, its key in the log; entry.msg makes it a Msg without its
// value (lazyMsg), which the worker reads (queue.load). Any other entry owns
// m, complete with its ID and Data, and the worker delivers m itself.
type entry struct {
	m    *Msg
	id   uint64
	data any
}

// takesShared reports whether q may hold plain entries. A shared prototype is
// never written, so the queue must not need one of its own: no filter (it sees
// the Msg before enqueue), no TTL (enqueueLocked stamps expires on the Msg)
// and no length limit (eviction dead-letters the Msg).
func (q *queue) takesShared() bool {
	return q.cfg.filter == nil && q.cfg.ttl == 0 && q.cfg.maxLen == 0 && !q.cfg.durable
}

// msg returns the Msg to deliver for e, allocating it for a shared entry.
func (e *entry) msg(queue string) *Msg {
	if !e.m.shared {
		if e.m == restoredMark {
			r := e.data.(*restored)
			return lazyMsg(r.key, e.id, queue, r.expires, nil)
		}
		return e.m
	}
	p := e.m
	return &Msg{ID: e.id, Exchange: p.Exchange, Queue: queue, RoutingKey: p.RoutingKey, Headers: p.Headers, Data: e.data, Deaths: p.Deaths}
}

// delivery is a shared entry as a direct consumer receives it.
func (e *entry) delivery(queue string) Delivery[any] {
	p := e.m
	return Delivery[any]{ID: e.id, Exchange: p.Exchange, Queue: queue, RoutingKey: p.RoutingKey, Headers: p.Headers,
		Data: e.data, Attempt: 1, Deaths: p.Deaths}
}

type chunk struct {
	entries [chunkSize]entry
	next    *chunk
}

// fifo is an unbounded FIFO of entries: a list of fixed-size chunks, so that
// neither push nor pop ever copies the buffer. Popped slots are cleared at once
// and drained chunks go back to chunkPool, so a queue that drains keeps one
// chunk (2 KiB) and the rest is collected unless another queue reuses it.
type fifo struct {
	head, tail *chunk
	hi, ti     int // next pop in head, next push in tail
	n          int
}

// chunkPool holds drained chunks, every slot clear, for any queue to reuse:
// a backlog that comes and goes does not allocate a chunk per 64 messages.
var chunkPool = sync.Pool{New: func() any { return new(chunk) }}

func (f *fifo) push(e entry) {
	if f.tail == nil {
		f.head = chunkPool.Get().(*chunk)
		f.tail, f.hi, f.ti = f.head, 0, 0
	} else if f.ti == chunkSize {
		c := chunkPool.Get().(*chunk)
		f.tail.next = c
		f.tail, f.ti = c, 0
	}
	f.tail.entries[f.ti] = e
	f.ti++
	f.n++
}

// pop appends the k oldest entries to dst; k <= f.n.
func (f *fifo) pop(dst []entry, k int) []entry {
	for range k {
		dst = append(dst, f.head.entries[f.hi])
		f.head.entries[f.hi] = entry{}
		f.hi++
		f.n--
		if f.hi == chunkSize && f.head != f.tail {
			old := f.head
			f.head, f.hi = old.next, 0
			old.next = nil
			chunkPool.Put(old)
		}
	}
	if f.n == 0 { // head == tail: start the chunk over
		f.hi, f.ti = 0, 0
	}
	return dst
}

// peek returns the oldest entry, or nil when f is empty.
func (f *fifo) peek() *entry {
	if f.n == 0 {
		return nil
	}
	return &f.head.entries[f.hi]
}

// clear drops every message and chunk.
func (f *fifo) clear() {
	*f = fifo{}
}

// queue is a named buffer drained by a fixed pool of workers.
//
// A worker takes a batch of entries under mu and then claims them one at a
// time with an atomic add, without the lock. Until claimed, an entry still
// waits: it counts in Depth, and a worker that finds buf empty steals it
// (under mu) rather than sleep, so a slow message never holds back the
// messages taken with it while another worker is idle.
type queue struct {
	id          int
	name        string
	consumer    consumer
	concurrency int
	cfg         queueConfig
	mq          *MQ

	mu        sync.Mutex
	cond      sync.Cond // L is &mu; signalled once per parked worker to wake
	buf       fifo
	workers   []*worker     // one per worker slot, for stealing and counting
	idle      atomic.Int32  // workers parked in cond.Wait and not yet signalled; written under mu (see wakeThief)
	waking    int           // workers signalled that have not taken the lock since (see wakeOneLocked)
	busy      int           // workers holding a batch
	scheduled int           // messages waiting in the scheduler for a delay or a retry
	stopping  bool          // the MQ is stopping: report when quiescent
	closed    bool          // workers exit once buf is empty
	shut      atomic.Bool   // closed, readable without mu (see reserve)
	aborted   bool          // Shutdown's deadline passed: nothing more is delivered
	room      chan struct{} // closed when there may be room (Block publishers wait on it)
	accepted  uint64        // messages published into the queue
	entered   uint64        // entries into buf or the scheduler: accepted messages and retries
	expiryAt  int64         // when the scheduler checks the head for expiry; 0: no check pending
	reserved  int           // room held for publishes between reserve and acceptReserved
	inbound   int           // admitted publishes writing to the log without the MQ's lock: not quiescent
	abortLost uint64        // what abort counted as undelivered, for drain to log

	// The workers' counters below get a cache line of their own, away from
	// the fields publishers write under mu.
	_     [64]byte
	begun atomic.Uint64 // entries that left buf or a batch to be handled; abortBit once aborted
	c     queueCounters
	hist  histogram
}

type queueCounters struct {
	failed, retried                   atomic.Uint64
	deadLettered, expired, overflowed atomic.Uint64
	rejected, dropped, undelivered    atomic.Uint64
}

// worker is one worker slot of a queue: its batch and its claim cursor. A
// goroutine runs it (see run); if a consumer ends that goroutine with
// runtime.Goexit, another takes over the same slot.
type worker struct {
	q     *queue
	batch [maxBatch]entry
	n     int          // entries in batch; written by the owner under q.mu
	next  atomic.Int32 // next unclaimed index: owner claims without q.mu, thieves under it
	held  bool         // the owner counts in q.busy
	calls int          // consumer calls, for sampling their duration

	// What this worker handed to the consumer, and what succeeded: counted
	// here rather than in q.c so that the workers of one queue do not fight
	// over one cache line for every message (Stats adds them up).
	delivered, succeeded atomic.Uint64
	_                    [64]byte // nor share a line with the next worker
}

func newQueue(id int, name string, c consumer, concurrency int, cfg queueConfig, mq *MQ) *queue {
	q := &queue{id: id, name: name, consumer: c, concurrency: concurrency, mq: mq, cfg: cfg}
	if q.cfg.retry.MaxAttempts == 0 {
		q.cfg.retry.MaxAttempts = 1
	}
	q.cond.L = &q.mu
	q.workers = make([]*worker, concurrency)
	for i := range q.workers {
		q.workers[i] = &worker{q: q}
	}
	return q
}

// fullLocked reports whether the queue is at its length limit, counting the
// room held for publishes under way. Bounded queues take one message at a
// time, so no batch holds waiting messages. q.mu is held.
func (q *queue) fullLocked() bool {
	return q.cfg.maxLen > 0 && q.buf.n+q.scheduled+q.reserved >= q.cfg.maxLen
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
	q.mu.Lock()
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
	q.mu.Lock()
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
func (q *queue) unreserve(inbound bool) {
	if q.cfg.maxLen == 0 && !inbound {
		return // reserve held nothing
	}
	q.mu.Lock()
	if q.cfg.maxLen > 0 {
		q.reserved--
		q.freeRoomLocked()
	}
	if inbound {
		q.inbound--
		q.reportIfQuiescentLocked()
	}
	q.mu.Unlock()
}

// acceptReserved enqueues e into the room reserve held (see enqueueLocked
// for now, delay, ttl and the evicted message), ending the hold of
// holdInbound when inbound. It fails only when the queue was aborted since.
func (q *queue) acceptReserved(e entry, now time.Time, delay, ttl time.Duration, inbound bool) (evicted *Msg, err error) {
	q.mu.Lock()
	if q.cfg.maxLen > 0 {
		q.reserved--
	}
	if inbound {
		q.inbound--
	}
	if q.closed {
		q.mu.Unlock()
		return nil, ErrStopped
	}
	evicted, wake := q.enqueueLocked(e, now, delay, ttl)
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(wake, expiry)
	return evicted, nil
}

// wakeAfter does what an enqueue asked for once q.mu is released: wake a
// parked worker, and have the scheduler check the head for expiry.
func (q *queue) wakeAfter(wake bool, expiry int64) {
	if wake {
		q.cond.Signal()
	}
	if expiry != 0 {
		q.mq.sched.add(time.Unix(0, expiry), q, nil)
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
	if q.fullLocked() { // DropHead
		if q.buf.n > 0 {
			h := q.popLocked()
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
		q.scheduled++
		return evicted, false
	}
	q.buf.push(e)
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
func (q *queue) wakeForLocked(n int) bool {
	if q.idle.Load() == 0 || q.waking > 0 || n == 0 {
		return false
	}
	q.idle.Add(-1)
	q.waking++
	return true
}

// wakeThief makes sure a worker is awake to steal the entries left in w's
// batch, which waits to begin the next: should that message block, they
// would wait for it while another worker sleeps. It costs an atomic load when
// no worker is parked.
func (q *queue) wakeThief(w *worker) {
	if w.n-int(w.next.Load()) <= 0 || q.idle.Load() == 0 {
		return
	}
	q.mu.Lock()
	wake := q.wakeForLocked(w.n - int(w.next.Load()))
	q.mu.Unlock()
	q.wakeAfter(wake, 0)
}

// wakeIfWaitingLocked is wakeForLocked for every entry that waits: in buf,
// and unclaimed in any worker's batch (which a woken worker steals). Counting
// them all, not only the caller's, means that a wake that wakeThief or
// enqueue left to a worker already waking is passed on by that worker,
// whatever it finds first. q.mu is held.
func (q *queue) wakeIfWaitingLocked() bool {
	if q.idle.Load() == 0 || q.waking > 0 {
		return false
	}
	return q.wakeForLocked(q.buf.n + q.batchedLocked())
}

// popLocked takes the head of buf for something other than a worker (an
// eviction, an expiry), counting it as begun. q.mu is held; buf is not empty.
func (q *queue) popLocked() entry {
	var one [1]entry
	e := q.buf.pop(one[:0], 1)[0]
	q.begun.Add(1)
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

// expiresAt is when e expires, or 0.
func (e *entry) expiresAt() int64 {
	if e.m.shared {
		return 0
	}
	if e.m == restoredMark {
		return e.data.(*restored).expires
	}
	return e.m.expires()
}

// armExpiryLocked returns when the scheduler should check the head of buf
// for expiry, if it must be told: the head has a deadline earlier than any
// check already pending. q.mu is held.
func (q *queue) armExpiryLocked() int64 {
	h := q.buf.peek()
	if h == nil {
		return 0
	}
	at := h.expiresAt()
	if at == 0 || (q.expiryAt != 0 && q.expiryAt <= at) {
		return 0
	}
	q.expiryAt = at
	return at
}

// expireHead dead-letters the expired messages at the head of buf, as
// RabbitMQ does when a message's TTL passes at the head of its queue, even
// while every consumer is busy. The scheduler calls it.
func (q *queue) expireHead() {
	now := time.Now().UnixNano()
	var dead []*Msg
	q.mu.Lock()
	q.expiryAt = 0
	for !q.aborted {
		h := q.buf.peek()
		if h == nil || h.expiresAt() == 0 || h.expiresAt() > now {
			break
		}
		e := q.popLocked()
		dead = append(dead, e.msg(q.name)) // a restored one is read by deadLetter, without the lock
	}
	if len(dead) > 0 {
		q.freeRoomLocked()
	}
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(false, expiry)
	for _, m := range dead {
		q.c.expired.Add(1)
		q.deadLetter(m, ReasonExpired, m.lastErr())
	}
}

// take gives worker w its next entry: it refills w's batch from buf, or
// steals an entry another worker has not claimed yet, or waits. It reports
// false once the queue is closed and empty.
func (q *queue) take(w *worker) (entry, bool) {
	q.mu.Lock()
	if w.held {
		w.held = false
		q.busy--
		q.reportIfQuiescentLocked()
	}
	for {
		// A worker that leaves entries behind, in buf or in its batch, wakes
		// another to take them, or to steal them should this one's message
		// block: a parked worker never leaves a message waiting.
		if q.buf.n > 0 {
			e := q.refillLocked(w)
			q.freeRoomLocked()
			wake := q.wakeIfWaitingLocked()
			expiry := q.armExpiryLocked()
			q.mu.Unlock()
			q.wakeAfter(wake, expiry)
			return e, true
		}
		if e, ok := q.stealLocked(w); ok {
			w.held = true
			q.busy++
			wake := q.wakeIfWaitingLocked()
			q.mu.Unlock()
			q.wakeAfter(wake, 0)
			return e, true
		}
		if q.closed {
			q.mu.Unlock()
			return entry{}, false
		}
		q.idle.Add(1)
		q.cond.Wait()
		if q.waking > 0 {
			q.waking--
		}
	}
}

// refillLocked fills w's batch with a fair share of buf and claims its first
// entry. A batch ends before a message with a deadline, unless that message
// comes first, so that no message can expire while it sits in a batch;
// queues with a TTL or a length limit take one message at a time, so that
// their counts are exact. q.mu is held and buf is not empty.
func (q *queue) refillLocked(w *worker) entry {
	k := 1
	if q.cfg.ttl == 0 && q.cfg.maxLen == 0 {
		k = min(max(q.buf.n/q.concurrency, 1), maxBatch)
	}
	n := 0
	for n < k && q.buf.n > 0 {
		if n > 0 && q.buf.peek().expiresAt() != 0 {
			break
		}
		var one [1]entry
		w.batch[n] = q.buf.pop(one[:0], 1)[0]
		n++
	}
	w.n = n
	w.next.Store(1)
	w.held = true
	q.busy++
	e := w.batch[0]
	w.batch[0] = entry{}
	return e
}

// claim takes the next entry of w's own batch, without the lock.
func (w *worker) claim() (entry, bool) {
	i := int(w.next.Add(1)) - 1
	if i >= w.n {
		return entry{}, false
	}
	e := w.batch[i]
	w.batch[i] = entry{}
	return e, true
}

// stealLocked takes into w's batch half of the entries (at least one) that
// the worker with the most of them took but has not begun, and claims the
// first. Taking half, not one, keeps a thief from coming back under the lock
// for every message. w's own batch is exhausted. q.mu is held.
func (q *queue) stealLocked(w *worker) (entry, bool) {
	var victim *worker
	most := 0
	for _, o := range q.workers {
		if left := o.n - int(o.next.Load()); left > most {
			victim, most = o, left
		}
	}
	if victim == nil {
		return entry{}, false
	}
	k := int32((most + 1) / 2)
	end := int(victim.next.Add(k)) // claims [end-k, end)
	start := end - int(k)
	end = min(end, victim.n) // the owner may have claimed some meanwhile
	if start >= end {
		return entry{}, false
	}
	n := copy(w.batch[:], victim.batch[start:end])
	clear(victim.batch[start:end])
	w.n = n
	w.next.Store(1)
	e := w.batch[0]
	w.batch[0] = entry{}
	return e, true
}

// batchedLocked counts the entries taken into batches and not claimed yet:
// they still wait. q.mu is held.
func (q *queue) batchedLocked() int {
	n := 0
	for _, w := range q.workers {
		n += max(w.n-int(w.next.Load()), 0)
	}
	return n
}

// drop forgets w's unclaimed entries: abort has counted them undelivered.
func (w *worker) drop() {
	for {
		if _, ok := w.claim(); !ok {
			return
		}
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

func (q *queue) quiescentLocked() bool {
	return q.buf.n == 0 && q.scheduled == 0 && q.busy == 0 && q.inbound == 0
}

// holdInbound counts a publish that q admitted and that now leaves the MQ's
// read lock to write the log: until acceptReserved or unreserve, a stopping
// MQ waits for it as for a message in the queue, so that Stop still sees
// each publish completely or not at all.
func (q *queue) holdInbound() {
	q.mu.Lock()
	q.inbound++
	q.mu.Unlock()
}

// release moves a message that the scheduler found due into buf.
func (q *queue) release(m *Msg) {
	q.mu.Lock()
	if q.aborted { // abort counted it as undelivered and zeroed scheduled
		q.mu.Unlock()
		return
	}
	q.scheduled--
	q.buf.push(entry{m: m})
	wake := q.wakeOneLocked()
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(wake, expiry)
}

// schedule counts a retry of m, due after backoff, in the queue and hands it
// to the scheduler. A queue at its length limit makes room as a publish
// would: DropHead evicts its oldest ready message; otherwise the retry itself
// cannot wait and is returned as overflow. After abort it is undelivered.
func (q *queue) schedule(m *Msg, backoff time.Duration) (evicted, overflow *Msg, aborted bool) {
	q.mu.Lock()
	if q.aborted {
		q.mu.Unlock()
		return nil, nil, true
	}
	if q.fullLocked() {
		if q.cfg.overflow != DropHead || q.buf.n == 0 {
			q.mu.Unlock()
			return nil, m, false
		}
		h := q.popLocked()
		evicted = h.msg(q.name)
	}
	q.scheduled++
	q.entered++
	q.mu.Unlock()
	q.mq.sched.add(time.Now().Add(backoff), q, m)
	return evicted, nil, false
}

// stop marks the queue as stopping and wakes the publishers waiting for room,
// which then see that the MQ is stopping.
func (q *queue) stop() {
	q.mu.Lock()
	q.stopping = true
	q.freeRoomLocked()
	q.mu.Unlock()
}

// close lets the workers exit once buf is empty.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.shut.Store(true)
	q.idle.Store(0)
	q.waking = 0
	q.mu.Unlock()
	q.cond.Broadcast()
}

// abort closes the queue and drops what no worker has begun to deliver: in
// buf, in batches, and in the scheduler. It returns how many entries will
// never reach the consumer, and how many messages are in the consumer now.
// The abort bit is set under q.mu, so that an eviction or expiry (which
// count as begun under q.mu) is counted either as begun or as undelivered,
// never both.
func (q *queue) abort() (undelivered, running uint64) {
	q.mu.Lock()
	if q.aborted {
		q.mu.Unlock()
		return 0, 0
	}
	begun := q.begun.Or(abortBit) &^ abortBit
	q.aborted, q.closed = true, true
	q.shut.Store(true)
	q.buf.clear()
	q.scheduled = 0
	q.idle.Store(0)
	q.waking = 0
	q.freeRoomLocked()
	undelivered = q.entered - begun
	q.abortLost = undelivered
	q.mu.Unlock()
	q.cond.Broadcast()
	q.mq.sched.dropQueue(q)
	q.c.undelivered.Add(undelivered)
	return undelivered, q.inFlight()
}

// inFlight is how many messages are in the consumer now.
//
// Deliveries are read first: a message counted as done was counted as
// delivered before, so what moves during the reads can make the result
// smaller than the truth, never larger than the workers.
func (q *queue) inFlight() uint64 {
	d := q.delivered()
	if done := q.succeeded() + q.c.failed.Load(); d > done {
		return d - done
	}
	return 0
}

// delivered is how many messages the workers handed to the consumer.
func (q *queue) delivered() uint64 {
	var n uint64
	for _, w := range q.workers {
		n += w.delivered.Load()
	}
	return n
}

// succeeded is how many deliveries succeeded.
func (q *queue) succeeded() uint64 {
	var n uint64
	for _, w := range q.workers {
		n += w.succeeded.Load()
	}
	return n
}

// begin counts an entry as taken to be handled; false once aborted. After
// abort the count goes on rising, unread, below abortBit.
func (q *queue) begin() bool {
	return q.begun.Add(1)&abortBit == 0
}
