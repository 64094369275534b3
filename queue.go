package tinymq

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

const (
	// maxBatch is the most messages a worker takes under one lock.
	maxBatch = 64
	// abortBit marks queue.started once Shutdown's deadline has passed.
	abortBit = 1 << 63
)

// chunkSize is how many messages one chunk of a fifo holds.
const chunkSize = 128

type chunk struct {
	msgs [chunkSize]*Msg
	next *chunk
}

// fifo is an unbounded FIFO of messages: a list of fixed-size chunks, so that
// neither push nor pop ever copies the buffer. Popped slots are cleared at once
// and drained chunks are dropped, except one kept for reuse, so a queue that
// drains gives its memory back.
type fifo struct {
	head, tail *chunk
	hi, ti     int // next pop in head, next push in tail
	n          int
	spare      *chunk
}

func (f *fifo) push(m *Msg) {
	if f.tail == nil {
		f.head = f.newChunk()
		f.tail, f.hi, f.ti = f.head, 0, 0
	} else if f.ti == chunkSize {
		c := f.newChunk()
		f.tail.next = c
		f.tail, f.ti = c, 0
	}
	f.tail.msgs[f.ti] = m
	f.ti++
	f.n++
}

func (f *fifo) newChunk() *chunk {
	if c := f.spare; c != nil {
		f.spare = nil
		return c
	}
	return new(chunk)
}

// pop appends the k oldest messages to dst; k <= f.n.
func (f *fifo) pop(dst []*Msg, k int) []*Msg {
	for range k {
		dst = append(dst, f.head.msgs[f.hi])
		f.head.msgs[f.hi] = nil
		f.hi++
		f.n--
		if f.hi == chunkSize && f.head != f.tail {
			old := f.head
			f.head, f.hi = old.next, 0
			old.next = nil
			f.spare = old
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
	filter      func(*Msg) bool
	log         *slog.Logger

	mu       sync.Mutex
	cond     sync.Cond // L is &mu; signalled once per parked worker to wake
	buf      fifo
	idle     int  // workers parked in cond.Wait and not yet signalled
	closed   bool // no more pushes; workers exit once the buffer is empty
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
	q.buf.push(m)
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
	for q.buf.n == 0 {
		if q.closed {
			q.mu.Unlock()
			return dst
		}
		q.idle++
		q.cond.Wait()
	}
	k := min(max(q.buf.n/q.concurrency, 1), maxBatch)
	dst = q.buf.pop(dst, k)
	wake := q.buf.n > 0 && q.idle > 0
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
	q.buf.clear()
	q.closed = true
	q.idle = 0
	accepted := q.accepted
	q.mu.Unlock()
	q.cond.Broadcast()
	return accepted - started, started - q.succeeded.Load() - q.failed.Load()
}

// begin counts a message as handed to the consumer; false once aborted. After
// abort the count goes on rising, unread, below abortBit.
func (q *queue) begin() bool {
	return q.started.Add(1)&abortBit == 0
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
