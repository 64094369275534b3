package tinymq

import (
	"slices"
	"sync"
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
// and a queued message costs a queue 32 bytes (two to a cache line). A
// message that a durable queue restored from the log is a restored entry: m
// is restoredMark and data a *restored, its key in the log; entry.msg makes
// it a Msg without its value (lazyMsg), which the worker reads (queue.load).
// Any other entry owns m, complete with its ID and Data, and the worker
// delivers m itself.
//
// When an entry became ready in its queue (its stamp: UnixNano from the
// scheduler's coarse clock, see scheduler.stamp; published, or due after a
// delay or a retry backoff, or restored from the log), which
// QueueStats.OldestAge reads, is not in the entry: the fifo's chunks keep
// the stamps of their entries, mostly as runs (see chunk), and an entry out
// of its fifo carries its stamp beside it (a worker's batch in worker.ats,
// otherwise a stamped).
type entry struct {
	m    *Msg
	id   uint64
	data any
}

// stamped is an entry out of its fifo, with its stamp, on its way back to one.
type stamped struct {
	e  entry
	at int64
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

// chunk holds chunkSize entries of a fifo and their stamps: as runs while
// they fit (runs[:nr], their starts rising: run k stamps the entries from
// runs[k].start to the next run's start), then one per entry (ats).
// Entries with the same stamp share a run, and the coarse clock gives the
// same stamp to every entry of one tick (see scheduler.stamp), so that a
// busy queue's chunk needs a run or two, and a chunk holds 64 entries and
// 8 runs in 2.2 KiB (36 bytes an entry, where a stamp in each entry made
// 42). A chunk of a queue whose messages arrive further apart than a tick
// runs out of runs at its 9th, and then holds its stamps in ats (8 bytes
// more an entry, as a stamp in the entry cost). Runs hold stamps exactly:
// the only error in a stamp is the clock's.
type chunk struct {
	entries [chunkSize]entry
	next    *chunk
	runs    [chunkRuns]run
	nr      int
	ats     *[chunkSize]int64
}

// chunkRuns is how many runs of stamps a chunk holds before it keeps a
// stamp per entry.
const chunkRuns = 8

// run is the stamp at of a chunk's entries from index start on.
type run struct {
	start int
	at    int64
}

// stampBack stamps entry i, which follows every live entry of c.
func (c *chunk) stampBack(i int, at int64) {
	switch {
	case c.ats != nil:
		c.ats[i] = at
	case c.nr > 0 && c.runs[c.nr-1].at == at:
	case c.nr < chunkRuns:
		c.runs[c.nr] = run{start: i, at: at}
		c.nr++
	default:
		c.spill()
		c.ats[i] = at
	}
}

// stampFront stamps entry i, which comes before every live entry of c (the
// one at i+1, if any).
func (c *chunk) stampFront(i int, at int64) {
	if c.ats == nil && c.nr > 1 {
		// The runs before the head's (the last that starts at i+1 or
		// before) stamp entries that left: forget them, so that the run
		// of i comes right before the head's.
		h := 0
		for h+1 < c.nr && c.runs[h+1].start <= i+1 {
			h++
		}
		c.nr = copy(c.runs[:], c.runs[h:c.nr])
	}
	switch {
	case c.ats != nil:
		c.ats[i] = at
	case c.nr > 0 && c.runs[0].at == at:
		c.runs[0].start = i
	case c.nr < chunkRuns:
		if c.nr > 0 {
			c.runs[0].start = i + 1 // the entries before it left
		}
		copy(c.runs[1:c.nr+1], c.runs[:c.nr])
		c.runs[0] = run{start: i, at: at}
		c.nr++
	default:
		c.spill()
		c.ats[i] = at
	}
}

// spill moves c's stamps from runs to ats.
func (c *chunk) spill() {
	c.ats = new([chunkSize]int64)
	for k := range c.nr {
		end := chunkSize
		if k+1 < c.nr {
			end = c.runs[k+1].start
		}
		for i := max(c.runs[k].start, 0); i < end; i++ {
			c.ats[i] = c.runs[k].at
		}
	}
	c.nr = 0
}

// stamp returns the stamp of entry i.
func (c *chunk) stamp(i int) int64 {
	if c.ats != nil {
		return c.ats[i]
	}
	k := c.nr - 1
	for k > 0 && c.runs[k].start > i {
		k--
	}
	return c.runs[k].at
}

// stamps writes the stamps of entries i, i+1, ... into ats.
func (c *chunk) stamps(i int, ats []int64) {
	if c.ats != nil {
		copy(ats, c.ats[i:])
		return
	}
	k := 0
	for j := range ats {
		for k+1 < c.nr && c.runs[k+1].start <= i+j {
			k++
		}
		ats[j] = c.runs[k].at
	}
}

// restart forgets c's stamps: none of its entries is live.
func (c *chunk) restart() {
	c.nr, c.ats = 0, nil
}

// fifo is an unbounded FIFO of entries: a list of fixed-size chunks, so that
// neither push nor pop ever copies the buffer. Popped slots are cleared at once
// and drained chunks go back to chunkPool, so a queue that drains keeps one
// chunk (2.2 KiB) and the rest is collected unless another queue reuses it.
//
// The stamps of a fifo's entries (see chunk) rise from head to tail, except
// where an entry joins behind newer ones (a group's next message, which got
// its stamp in the group's backlog; restored messages, in publish order,
// whose delay or retry backoff ended late), or a newer one is put before
// the head (a message that ReplayDeadLetters took and puts back, while an
// older one joined): floors keep the entries older than every entry ahead
// of them, so that oldest needs no scan. pop forgets the floors that left,
// so they stay bounded.
type fifo struct {
	head, tail *chunk
	hi, ti     int // next pop in head, next push in tail
	n          int
	pos        int64   // the head's position in the order of pushes: pop adds one, pushFront takes one
	tailAt     int64   // the tail's stamp, when f is not empty
	floors     []floor // entries older than every entry ahead of them, by position; stamps rising
}

// floor is an entry of a fifo, at position pos, whose stamp at is older than
// those of the entries ahead of it: until it leaves, the fifo's oldest stamp
// is at most at.
type floor struct {
	pos int64
	at  int64
}

// chunkPool holds drained chunks, every slot clear and no stamp kept, for
// any queue to reuse: a backlog that comes and goes does not allocate a
// chunk per 64 messages.
var chunkPool = sync.Pool{New: func() any { return new(chunk) }}

// putChunk gives c, drained, back to chunkPool.
func putChunk(c *chunk) {
	c.next, c.nr, c.ats = nil, 0, nil
	chunkPool.Put(c)
}

// push adds e, stamped at, at the tail.
func (f *fifo) push(e entry, at int64) {
	if f.n > 0 && at < f.tailAt {
		// It joins behind newer entries: a floor, which makes those newer
		// than it above it redundant.
		for len(f.floors) > 0 && f.floors[len(f.floors)-1].at >= at {
			f.floors = f.floors[:len(f.floors)-1]
		}
		f.floors = append(f.floors, floor{pos: f.pos + int64(f.n), at: at})
	}
	f.tailAt = at
	if f.tail == nil {
		f.head = chunkPool.Get().(*chunk)
		f.tail, f.hi, f.ti = f.head, 0, 0
	} else if f.ti == chunkSize {
		c := chunkPool.Get().(*chunk)
		f.tail.next = c
		f.tail, f.ti = c, 0
	}
	f.tail.entries[f.ti] = e
	f.tail.stampBack(f.ti, at)
	f.ti++
	f.n++
}

// pushFront puts e, stamped at, before every entry, so that it is popped
// next.
func (f *fifo) pushFront(e entry, at int64) {
	if f.n == 0 {
		f.push(e, at)
		return
	}
	if old := f.headAt(); at > old && (len(f.floors) == 0 || old < f.floors[0].at) {
		// It goes before an older entry, the head until now, which
		// becomes a floor: older than every entry ahead of it.
		f.floors = slices.Insert(f.floors, 0, floor{pos: f.pos, at: old})
	}
	if f.hi == 0 {
		c := chunkPool.Get().(*chunk)
		c.next = f.head
		f.head, f.hi = c, chunkSize
	}
	f.hi--
	f.head.entries[f.hi] = e
	f.head.stampFront(f.hi, at)
	f.n++
	f.pos--
}

// headAt is the stamp of the head; f is not empty.
func (f *fifo) headAt() int64 { return f.head.stamp(f.hi) }

// popOne takes the head, and its stamp; f is not empty.
func (f *fifo) popOne() (entry, int64) {
	e, at := f.head.entries[f.hi], f.headAt()
	f.head.entries[f.hi] = entry{}
	f.popped(1)
	f.settle()
	return e, at
}

// popRun moves the oldest entries into dst, and their stamps into ats (as
// long as dst), as many as fit, a chunk's run at a time, and returns how
// many: it stops before an entry with a deadline (see entry.expiresAt),
// unless that one comes first, so that a worker's batch never holds a
// message that could expire in it.
func (f *fifo) popRun(dst []entry, ats []int64) int {
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
		f.head.stamps(f.hi, ats[got:got+k])
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
		putChunk(old)
	}
}

// settle ends a pop: a drained fifo starts its chunk over, and the floors
// that left are forgotten.
func (f *fifo) settle() {
	if f.n == 0 { // head == tail: start the chunk over
		f.hi, f.ti = 0, 0
		f.head.restart()
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
	at := f.headAt()
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
