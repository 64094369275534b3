package tinymq

import (
	"runtime"
	"sync/atomic"
	"time"
)

// inbox is the lock-free front of a plain queue's buffer (see
// queue.takesShared): a bounded ring that publishers append to without the
// queue's lock, and that whoever holds the lock moves into buf, in order,
// before it looks at buf (see queue.lock and queue.pullLocked); a worker
// whose buf is empty takes its batch from it directly (see
// queue.refillInboxLocked), and one whose buf holds entries leaves it alone.
// A publisher that finds a worker parked takes the lock instead, and one
// that finds it full takes the lock to move it into buf (see
// queue.acceptPlain). Without it, the publisher and a worker that keeps up
// took the queue's lock in turn for every message, and spun on it.
//
// It is a bounded ring with one consumer at a time (the holder of the
// queue's lock): a publisher takes position p with a CAS on enq, once the
// consumer has freed p-inboxSize, writes slot p%inboxSize, and marks it
// written by setting its seq to p+1. The consumer frees the slots it moved
// with one store of freed per move, not one per slot.
type inbox struct {
	enq   atomic.Uint64 // the next position to hand a publisher
	_     [56]byte      // publishers write enq; the consumer writes freed and deq
	freed atomic.Uint64 // positions below it are moved out: their slots are free
	deq   uint64        // the next position to move; under the queue's lock
	_     [48]byte
	slots [inboxSize]inboxSlot
}

// inboxSize is how many entries an inbox holds: enough that a publisher
// running ahead of the workers takes the queue's lock once per inboxSize
// messages, small enough for every plain queue that gets publishes to have
// one (1.7 KiB; see newInbox).
const inboxSize = 32

type inboxSlot struct {
	seq atomic.Uint64 // p+1 once it holds the entry of position p
	at  int64         // e's stamp (see chunk)
	e   entry
}

// push appends e, stamped at, and reports whether there was room. It never
// blocks; publishers may call it concurrently.
func (b *inbox) push(e entry, at int64) bool {
	for {
		pos := b.enq.Load()
		if pos-b.freed.Load() >= inboxSize {
			return false // the slot still holds the entry of pos-inboxSize
		}
		if b.enq.CompareAndSwap(pos, pos+1) {
			s := &b.slots[pos%inboxSize]
			s.e, s.at = e, at
			s.seq.Store(pos + 1) // publishes e to the lock's holder
			return true
		}
		// Another publisher took pos: try the next.
	}
}

// ready reports whether the next entry to move is written. The caller holds
// the queue's lock.
func (b *inbox) ready() bool {
	return b.slots[b.deq%inboxSize].seq.Load() == b.deq+1
}

// pullLocked moves the inbox's written entries into buf, in order, up to the
// first that a publisher is still writing, counting each as an enqueue would
// have (see enqueueLocked). It is a worker's view of the inbox: an entry
// still being written is moved by its publisher's wake or by the next
// caller. q.mu is held.
func (q *queue) pullLocked() {
	b := q.inbox.Load()
	if b == nil {
		return
	}
	if !b.ready() {
		return
	}
	for b.ready() {
		q.moveLocked(b)
	}
	b.freed.Store(b.deq)
}

// drainLocked moves every entry of the inbox whose publisher has a position,
// waiting for those still being written (their publishers write a slot and
// nothing else, so the wait is short), so that the caller sees every publish
// that returned before it took the lock. q.mu is held.
func (q *queue) drainLocked() {
	b := q.inbox.Load()
	if b == nil {
		return
	}
	end := b.enq.Load()
	if b.deq == end {
		return
	}
	for b.deq != end {
		for !b.ready() {
			runtime.Gosched()
		}
		q.moveLocked(b)
	}
	b.freed.Store(b.deq)
}

// moveLocked moves the next entry of b, which is written, to the tail of
// buf; the caller frees its slot (see inbox.freed). q.mu is held.
func (q *queue) moveLocked(b *inbox) {
	s := &b.slots[b.deq%inboxSize]
	q.accepted++
	q.entered++
	q.buf.push(s.e, s.at)
	s.e = entry{}
	b.deq++
}

// testHookPark, when set (by tests only), is called by a worker about to
// park, between finding nothing to take and counting itself idle (see take).
var testHookPark atomic.Pointer[func()]

// lock takes q.mu and moves what publishers left in the inbox into buf, so
// that the caller sees every publish that returned before: every holder of
// q.mu but a worker that takes (see take) locks with it.
func (q *queue) lock() {
	q.mu.Lock()
	q.drainLocked()
}

// acceptPlain is accept for a publish with no deadline (no TTL, no delay)
// from a publisher's own goroutine, which holds the MQ's read lock (so the
// queue cannot close meanwhile, see MQ.enqueue): to a queue that takes
// shared entries, it appends e to the inbox without q.mu, and takes the
// lock only to wake a parked worker, or when the inbox is full. It returns
// ErrStopped when the queue is closed.
//
// A worker parks only after it counted itself in idle and then saw the
// inbox's next entry unwritten (see take); a publisher reads idle after it
// wrote its entry. Both are sequentially consistent atomics, so at least one
// sees the other: either the worker takes the entry, or the publisher wakes
// it.
func (q *queue) acceptPlain(e entry) error {
	if !q.plain || q.idle.Load() > 0 {
		return q.accept(e, time.Time{}, 0)
	}
	if q.shut.Load() {
		return ErrStopped
	}
	b := q.inbox.Load()
	if b == nil {
		b = q.newInbox()
	}
	if !b.push(e, q.mq.sched.stamp()) {
		return q.accept(e, time.Time{}, 0) // full: it moves the inbox first
	}
	if q.idle.Load() > 0 {
		q.lock()
		wake := q.wakeOneLocked()
		q.mu.Unlock()
		q.wakeAfter(wake, 0)
	}
	return nil
}

// newInbox gives q its inbox, at the first publish that would use it, so
// that a queue that never gets one keeps none (1.7 KiB). Publishers may race
// to make it: the first one's is kept. A worker or a holder of mu that
// loaded none found nothing to move: a publisher that installs the inbox
// writes its entry after that, and then looks at idle (see acceptPlain).
func (q *queue) newInbox() *inbox {
	b := new(inbox)
	if q.inbox.CompareAndSwap(nil, b) {
		return b
	}
	return q.inbox.Load()
}
