package tinymq

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

const (
	// minRing is the smallest backing array a queue keeps.
	minRing = 16
	// maxBatch is the most messages a worker takes under one lock.
	maxBatch = 64
	// abortBit marks queue.started once Shutdown's deadline has passed.
	abortBit = 1 << 63
)

// ring is an unbounded FIFO of messages. Its backing array doubles when full and
// halves when no more than a quarter full, so a queue that drains gives its
// memory back; popped slots are cleared so that delivered messages can be
// collected at once.
type ring struct {
	buf  []*Msg // len(buf) is 0 or a power of two
	head int
	n    int
}

func (r *ring) push(m *Msg) {
	if r.n == len(r.buf) {
		r.resize(max(minRing, 2*len(r.buf)))
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = m
	r.n++
}

// pop appends the k oldest messages to dst; k <= r.n.
func (r *ring) pop(dst []*Msg, k int) []*Msg {
	mask := len(r.buf) - 1
	for range k {
		dst = append(dst, r.buf[r.head])
		r.buf[r.head] = nil
		r.head = (r.head + 1) & mask
	}
	r.n -= k
	size := len(r.buf)
	for size > minRing && r.n <= size/4 {
		size /= 2
	}
	if size != len(r.buf) {
		r.resize(size)
	}
	return dst
}

// clear drops every message and the backing array, and returns how many it dropped.
func (r *ring) clear() int {
	n := r.n
	*r = ring{}
	return n
}

func (r *ring) resize(size int) {
	buf := make([]*Msg, size)
	if r.n > 0 {
		tail := copy(buf, r.buf[r.head:min(r.head+r.n, len(r.buf))])
		copy(buf[tail:], r.buf[:r.n-tail])
	}
	r.buf, r.head = buf, 0
}

// queue is a named buffer drained by a fixed pool of workers.
type queue struct {
	id          int
	name        string
	consumer    ConsumerFunc
	concurrency int
	filter      func(*Msg) bool
	log         *slog.Logger

	mu       sync.Mutex
	cond     sync.Cond // L is &mu; signalled once per parked worker to wake
	ring     ring
	idle     int  // workers parked in cond.Wait and not yet signalled
	closed   bool // no more pushes; workers exit once the ring is empty
	accepted uint64

	started   atomic.Uint64 // messages handed to the consumer; abortBit once aborted
	succeeded atomic.Uint64
	failed    atomic.Uint64
}

func newQueue(id int, name string, consumer ConsumerFunc, concurrency int, filter func(*Msg) bool, log *slog.Logger) *queue {
	q := &queue{id: id, name: name, consumer: consumer, concurrency: concurrency, filter: filter, log: log}
	q.cond.L = &q.mu
	return q
}

// push appends m and wakes a parked worker. It never blocks on consumers. It
// reports false when the queue is closed.
func (q *queue) push(m *Msg) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	q.ring.push(m)
	q.accepted++
	wake := q.idle > 0
	if wake {
		q.idle--
	}
	q.mu.Unlock()
	if wake {
		q.cond.Signal()
	}
	return true
}

// take waits for messages and appends up to a fair share of them (at most
// maxBatch) to dst. It returns dst unchanged once the queue is closed and empty.
func (q *queue) take(dst []*Msg) []*Msg {
	q.mu.Lock()
	for q.ring.n == 0 {
		if q.closed {
			q.mu.Unlock()
			return dst
		}
		q.idle++
		q.cond.Wait()
	}
	k := min(max(q.ring.n/q.concurrency, 1), maxBatch)
	dst = q.ring.pop(dst, k)
	wake := q.ring.n > 0 && q.idle > 0
	if wake {
		q.idle--
	}
	q.mu.Unlock()
	if wake {
		q.cond.Signal()
	}
	return dst
}

// close stops pushes; the workers deliver what is buffered, then exit.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.idle = 0
	q.mu.Unlock()
	q.cond.Broadcast()
}

// abort closes the queue and drops what no worker has begun to deliver. It
// returns how many accepted messages will never reach the consumer, and how
// many are in the consumer now.
func (q *queue) abort() (undelivered, running uint64) {
	started := q.started.Or(abortBit) &^ abortBit
	q.mu.Lock()
	q.ring.clear()
	q.closed = true
	q.idle = 0
	accepted := q.accepted
	q.mu.Unlock()
	q.cond.Broadcast()
	return accepted - started, started - q.succeeded.Load() - q.failed.Load()
}

// begin counts a message as handed to the consumer; false once aborted.
func (q *queue) begin() bool {
	for {
		v := q.started.Load()
		if v&abortBit != 0 {
			return false
		}
		if q.started.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// work is one worker: it delivers messages until the queue is closed and empty,
// or aborted. wg.Done is its join.
func (q *queue) work(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	batch := make([]*Msg, 0, maxBatch)
	for {
		batch = q.take(batch[:0])
		if len(batch) == 0 {
			return
		}
		for i, m := range batch {
			batch[i] = nil
			if !q.begin() {
				break // aborted: abort counted the rest as undelivered
			}
			q.process(ctx, m)
		}
	}
}

// process runs the consumer on one message, turning a panic into a failed
// delivery so that the worker goes on.
func (q *queue) process(ctx context.Context, m *Msg) {
	defer func() {
		if r := recover(); r != nil {
			q.fail(ctx, m, &PanicError{Value: r, Stack: debug.Stack()})
		}
	}()
	if err := q.consumer(ctx, m); err != nil {
		q.fail(ctx, m, err)
		return
	}
	q.succeeded.Add(1)
}

func (q *queue) fail(ctx context.Context, m *Msg, err error) {
	q.failed.Add(1)
	logFailure(ctx, q.log, m, err)
}
