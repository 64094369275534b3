package tinymq

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxBatch is the most messages a worker takes under one lock.
	maxBatch = 64
	// abortBit marks queue.begun once Shutdown's deadline has passed.
	abortBit = 1 << 63
	// sampleEvery: a worker times one consumer call in sampleEvery, its first
	// included, since reading the clock twice costs as much as the rest of a
	// delivery on some machines.
	sampleEvery = 16
)

// chunkSize is how many entries one chunk of a fifo holds.
const chunkSize = 64

// entry is one message waiting in a queue. Most are plain: published with no
// routing key, headers, TTL or delay to a queue with no filter or limit. Those
// share their exchange's prototype Msg (m.shared), and the worker allocates
// the consumer's Msg from m, id and data, so that Publish allocates nothing
// per queue and a queued plain message costs 32 bytes. Any other entry owns m,
// complete with its ID and Data, and the worker delivers m itself.
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
	return q.filter == nil && q.ttl == 0 && q.maxLen == 0
}

// msg returns the Msg to deliver for e, allocating it for a plain entry.
func (e entry) msg(queue string) *Msg {
	if !e.m.shared {
		return e.m
	}
	return &Msg{ID: e.id, Exchange: e.m.Exchange, Queue: queue, Data: e.data}
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

// clear drops every message and chunk.
func (f *fifo) clear() {
	*f = fifo{}
}

// queue is a named buffer drained by a fixed pool of workers.
type queue struct {
	id          int
	name        string
	consumer    ConsumerFunc
	concurrency int
	mq          *MQ
	log         *slog.Logger
	queueConfig

	mu        sync.Mutex
	cond      sync.Cond // L is &mu; signalled once per parked worker to wake
	buf       fifo
	idle      int           // workers parked in cond.Wait and not yet signalled
	busy      int           // workers holding a batch
	scheduled int           // messages waiting in the scheduler for a delay or a retry
	stopping  bool          // the MQ is stopping: report when quiescent
	closed    bool          // workers exit once buf is empty
	aborted   bool          // Shutdown's deadline passed: nothing more is delivered
	room      chan struct{} // closed when there may be room (Block publishers wait on it)
	accepted  uint64        // messages published into the queue
	entered   uint64        // entries into buf or the scheduler: accepted messages and retries

	// The workers' counters below get a cache line of their own, away from
	// the fields publishers write under mu.
	_     [64]byte
	begun atomic.Uint64 // entries that workers took out of buf; abortBit once aborted
	c     queueCounters
	hist  histogram
}

type queueCounters struct {
	delivered, succeeded, failed, retried atomic.Uint64
	deadLettered, expired, overflowed     atomic.Uint64
	rejected, dropped, undelivered        atomic.Uint64
}

func newQueue(id int, name string, consumer ConsumerFunc, concurrency int, cfg queueConfig, mq *MQ) *queue {
	q := &queue{id: id, name: name, consumer: consumer, concurrency: concurrency, mq: mq, log: mq.log, queueConfig: cfg}
	if q.retry.MaxAttempts == 0 {
		q.retry.MaxAttempts = 1
	}
	q.cond.L = &q.mu
	return q
}

// fullLocked reports whether the queue is at its length limit. q.mu is held.
func (q *queue) fullLocked() bool {
	return q.maxLen > 0 && q.buf.n+q.scheduled >= q.maxLen
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
			var one [1]entry
			evicted = q.buf.pop(one[:0], 1)[0].msg(q.name)
			q.begun.Add(1) // it left buf without a worker
		} else {
			// Every message waits in the scheduler: the newcomer is the one to go.
			q.accepted++
			return e.msg(q.name), false
		}
	}
	q.accepted++
	q.entered++
	if q.ttl > 0 && (ttl == 0 || q.ttl < ttl) {
		ttl = q.ttl
	}
	if ttl > 0 {
		e.m.expires = now.Add(delay + ttl).UnixNano()
	}
	if delay > 0 {
		q.scheduled++
		return evicted, false
	}
	q.buf.push(e)
	wake = q.idle > 0
	if wake {
		q.idle--
	}
	return evicted, wake
}

// take waits for messages and appends up to a fair share of them (at most
// maxBatch) to dst. held says the worker is done with its previous batch. It
// reports false once the queue is closed and empty.
func (q *queue) take(dst []entry, held bool) ([]entry, bool) {
	q.mu.Lock()
	if held {
		q.busy--
		q.reportIfQuiescentLocked()
	}
	for q.buf.n == 0 {
		if q.closed {
			q.mu.Unlock()
			return dst, false
		}
		q.idle++
		q.cond.Wait()
	}
	k := min(max(q.buf.n/q.concurrency, 1), maxBatch)
	dst = q.buf.pop(dst, k)
	q.busy++
	q.freeRoomLocked()
	wake := q.buf.n > 0 && q.idle > 0
	if wake {
		q.idle--
	}
	q.mu.Unlock()
	if wake {
		q.cond.Signal()
	}
	return dst, true
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
	return q.buf.n == 0 && q.scheduled == 0 && q.busy == 0
}

// release moves a message that the scheduler found due into buf.
func (q *queue) release(m *Msg) {
	q.mu.Lock()
	q.scheduled--
	if q.aborted { // abort counted it as undelivered
		q.mu.Unlock()
		return
	}
	q.buf.push(entry{m: m})
	wake := q.idle > 0
	if wake {
		q.idle--
	}
	q.mu.Unlock()
	if wake {
		q.cond.Signal()
	}
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
	q.idle = 0
	q.mu.Unlock()
	q.cond.Broadcast()
}

// abort closes the queue and drops what no worker has begun to deliver, in buf
// and in the scheduler. It returns how many entries will never reach the
// consumer, and how many messages are in the consumer now.
func (q *queue) abort() (undelivered, running uint64) {
	begun := q.begun.Or(abortBit) &^ abortBit
	q.mu.Lock()
	if q.aborted {
		q.mu.Unlock()
		return 0, 0
	}
	q.aborted, q.closed = true, true
	q.buf.clear()
	q.idle = 0
	q.freeRoomLocked()
	undelivered = q.entered - begun
	q.mu.Unlock()
	q.cond.Broadcast()
	q.c.undelivered.Add(undelivered)
	return undelivered, q.inFlight()
}

// inFlight is how many messages are in the consumer now.
func (q *queue) inFlight() uint64 {
	done := q.c.succeeded.Load() + q.c.failed.Load()
	if d := q.c.delivered.Load(); d > done {
		return d - done
	}
	return 0
}

// begin counts an entry as taken out of buf by a worker; false once aborted.
// After abort the count goes on rising, unread, below abortBit.
func (q *queue) begin() bool {
	return q.begun.Add(1)&abortBit == 0
}
