package tinymq

import "sync"

// chunkSize is how many entries one chunk of a fifo holds.
const chunkSize = 64

// entry is one message waiting in a queue. Most are shared: published with no
// TTL or delay to a queue with no filter, limit or log (see takesShared).
// Those point to a record of the message that every queue it reached shares
// (m.shared): its exchange's prototype Msg for a plain message (no routing
// key, headers or deaths), else one Msg made by the publish. The worker makes
// the consumer's Msg from m, id and data (a direct consumer needs none), so
// that Publish allocates at most one record, whatever the number of queues,
// and a queued message costs a queue 40 bytes. A message that a durable
// queue restored from the log is a restored entry: m is restoredMark and
// data a *restored, its key in the log; entry.msg makes it a Msg without its
// value (lazyMsg), which the worker reads (queue.load). Any other entry owns
// m, complete with its ID and Data, and the worker delivers m itself.
//
// at is when the entry became ready in the queue (UnixNano from the
// scheduler's coarse clock, see scheduler.stamp): published, or due after a
// delay or a retry backoff, or restored from the log; QueueStats.OldestAge
// reads it.
type entry struct {
	m    *Msg
	id   uint64
	data any
	at   int64
}

// msg returns the Msg to deliver for e, allocating it for a shared entry.
func (e *entry) msg(queue string) *Msg {
	if !e.m.shared {
		if e.m == restoredMark {
			r := e.data.(*restored)
			return lazyMsg(r.key, e.id, queue, r.expires, nil, r.group)
		}
		return e.m
	}
	p := e.m
	return &Msg{ID: e.id, Exchange: p.Exchange, Queue: queue, RoutingKey: p.RoutingKey, Headers: p.Headers, Data: e.data, Deaths: p.Deaths}
}

type chunk struct {
	entries [chunkSize]entry
	next    *chunk
}

// fifo is an unbounded FIFO of entries: a list of fixed-size chunks, so that
// neither push nor pop ever copies the buffer. Popped slots are cleared at once
// and drained chunks go back to chunkPool, so a queue that drains keeps one
// chunk (2.5 KiB) and the rest is collected unless another queue reuses it.
//
// The stamps (entry.at) of a fifo's entries rise from head to tail, except
// where an entry joins behind newer ones (a group's next message, which got
// its stamp in the group's backlog; restored messages, in publish order,
// whose delay or retry backoff ended late): floors keep those, so that oldest
// needs no scan. pop forgets the floors that left, so they stay bounded.
type fifo struct {
	head, tail *chunk
	hi, ti     int // next pop in head, next push in tail
	n          int
	pos        int64   // the head's position in the order of pushes: pop adds one, pushFront takes one
	floors     []floor // entries pushed with a stamp older than the tail's, by position; stamps rising
}

// floor is an entry of a fifo, at position pos, whose stamp at is older than
// those of the entries ahead of it: until it leaves, the fifo's oldest stamp
// is at most at.
type floor struct {
	pos int64
	at  int64
}

// chunkPool holds drained chunks, every slot clear, for any queue to reuse:
// a backlog that comes and goes does not allocate a chunk per 64 messages.
var chunkPool = sync.Pool{New: func() any { return new(chunk) }}

func (f *fifo) push(e entry) {
	if f.n > 0 && e.at < f.tail.entries[f.ti-1].at {
		// It joins behind newer entries: a floor, which makes those
		// newer than it above it redundant.
		for len(f.floors) > 0 && f.floors[len(f.floors)-1].at >= e.at {
			f.floors = f.floors[:len(f.floors)-1]
		}
		f.floors = append(f.floors, floor{pos: f.pos + int64(f.n), at: e.at})
	}
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

// pushFront puts e before every entry, so that it is popped next.
func (f *fifo) pushFront(e entry) {
	if f.n == 0 {
		f.push(e)
		return
	}
	if f.hi == 0 {
		c := chunkPool.Get().(*chunk)
		c.next = f.head
		f.head, f.hi = c, chunkSize
	}
	f.hi--
	f.head.entries[f.hi] = e
	f.n++
	f.pos--
}

// pop appends the k oldest entries to dst; k <= f.n.
func (f *fifo) pop(dst []entry, k int) []entry {
	for range k {
		dst = append(dst, f.head.entries[f.hi])
		f.head.entries[f.hi] = entry{}
		f.popped(1)
	}
	f.settle()
	return dst
}

// popRun moves the oldest entries into dst, as many as fit, a chunk's run
// at a time, and returns how many: it stops before an entry with a deadline
// (see entry.expiresAt), unless that one comes first, so that a worker's
// batch never holds a message that could expire in it.
func (f *fifo) popRun(dst []entry) int {
	got := 0
	for got < len(dst) && f.n > 0 {
		run := f.head.entries[f.hi : f.hi+min(len(dst)-got, f.n, chunkSize-f.hi)]
		k := len(run)
		for i := range run {
			if got+i > 0 && run[i].expiresAt() != 0 {
				k = i
				break
			}
		}
		copy(dst[got:], run[:k])
		clear(run[:k])
		got += k
		f.popped(k)
		if k < len(run) {
			break // before a deadline
		}
	}
	f.settle()
	return got
}

// popped moves the head past k popped (and cleared) entries of its chunk,
// to the next chunk at the end of one.
func (f *fifo) popped(k int) {
	f.hi += k
	f.n -= k
	f.pos += int64(k)
	if f.hi == chunkSize && f.head != f.tail {
		old := f.head
		f.head, f.hi = old.next, 0
		old.next = nil
		chunkPool.Put(old)
	}
}

// settle ends a pop: a drained fifo starts its chunk over, and the floors
// that left are forgotten.
func (f *fifo) settle() {
	if f.n == 0 { // head == tail: start the chunk over
		f.hi, f.ti = 0, 0
		f.floors = f.floors[:0]
	} else if len(f.floors) > 0 && f.floors[0].pos < f.pos {
		f.dropLeftFloors() // so that floors stay bounded when nothing reads oldest
	}
}

// dropLeftFloors forgets the floors whose entries have left.
func (f *fifo) dropLeftFloors() {
	i := 0
	for i < len(f.floors) && f.floors[i].pos < f.pos {
		i++
	}
	if i > 0 {
		f.floors = append(f.floors[:0], f.floors[i:]...)
	}
}

// oldest returns the oldest stamp of f's entries, or 0 when f is empty: the
// head's, or that of the first floor that has not left.
func (f *fifo) oldest() int64 {
	if f.n == 0 {
		return 0
	}
	at := f.head.entries[f.hi].at
	f.dropLeftFloors()
	if len(f.floors) > 0 {
		at = min(at, f.floors[0].at)
	}
	return at
}

// each calls fn with every entry, oldest first, until fn returns false.
func (f *fifo) each(fn func(*entry) bool) {
	c, i := f.head, f.hi
	for k := 0; k < f.n; k++ {
		if i == chunkSize {
			c, i = c.next, 0
		}
		if !fn(&c.entries[i]) {
			return
		}
		i++
	}
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

// dkey is the log key of e's message, or "" for a message of an in-memory
// queue.
func (e *entry) dkey() string {
	if e.m.shared {
		return ""
	}
	if e.m == restoredMark {
		return e.data.(*restored).key
	}
	return e.m.dkey()
}
