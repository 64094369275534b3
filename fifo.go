package tinymq

import (
	"slices"
	"sync"
)

// chunkSize is how many entries one chunk of a fifo holds.
const chunkSize = 128

// entry is one message waiting in a queue. Most are shared: published with no
// TTL or delay to a queue with no filter, limit or log (see takesShared).
// Those point to a record of the message that every queue it reached shares
// (m.shared): its exchange's prototype Msg for a plain message (no routing
// key, headers or deaths), else one Msg made by the publish. The worker makes
// the consumer's Msg from m, id and data (a direct consumer needs none), so
// that Publish allocates at most one record, whatever the number of queues.
// A fifo does not keep entries whole (see chunk): a plain message costs a
// queue 18 bytes, any other 34 at most, stamps aside. A
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

// chunk holds chunkSize entries of a fifo and their stamps, in 2.25 KiB
// (18 bytes an entry, where whole entries made 36). Of an entry it keeps the
// data in data, and its m and id as sources while they fit (srcs[:ns], their
// starts rising: source k gave the entries from srcs[k].start to the next
// source's start), then one per entry (refs). The entries of a source share
// its m and have ids rising by one from its id: the plain messages of a
// fanout exchange (no routing key, headers or deaths: they share their
// exchange's prototype, see entry) need one source a chunk. An owned entry
// (no id, no data: see entry) keeps its m in data, under a source of
// ownedMark, so that a run of them (a queue with a TTL, say) needs one
// source too. A chunk that
// runs out of sources (messages with a routing key or headers, which come
// with a record each) spills to refs: 16 bytes more an entry, as whole
// entries cost.
//
// The stamps come as runs while they fit (runs[:nr], their starts rising:
// run k stamps the entries from runs[k].start to the next run's start),
// then one per entry (ats). Entries with the same stamp share a run, and
// the coarse clock gives the same stamp to every entry of one tick (see
// scheduler.stamp), so that a busy queue's chunk needs a run or two. A chunk
// of a queue whose messages arrive further apart runs out of runs at its
// 7th, and then holds its stamps in ats (8 bytes more an entry). Runs hold
// stamps exactly: the only error in a stamp is the clock's.
type chunk struct {
	data [chunkSize]any
	next *chunk
	ats  *[chunkSize]int64
	refs *[chunkSize]ref
	runs [chunkRuns]run
	nr   int
	srcs [chunkSrcs]src
	ns   int
}

// chunkRuns is how many runs of stamps a chunk holds before it keeps a
// stamp per entry, and chunkSrcs how many sources before it keeps an m and
// an id per entry: as many as fit the chunk's size class (2304 bytes with
// the 8-byte header the runtime gives an object of pointers this large; see
// TestAPlainChunkKeepsOnlyEachEntrysData).
const (
	chunkRuns = 6
	chunkSrcs = 4
)

// run is the stamp at of a chunk's entries from index start on.
type run struct {
	start int
	at    int64
}

// src is the m of a chunk's entries from index start on, and the id of the
// one at start; the next ones' rise by one.
type src struct {
	start int
	m     *Msg
	id    uint64
}

// ref is an entry's m and id, in a chunk that keeps one per entry.
type ref struct {
	m  *Msg
	id uint64
}

// ownedMark is the m of a source whose entries are owned: each keeps its m
// in data, and has no id or data of its own (see chunk).
var ownedMark = &Msg{}

// isOwned reports whether e is an owned entry as chunk keeps them: its m its
// own, no id, no data.
func (e *entry) isOwned() bool {
	return e.m != nil && !e.m.shared && e.m != restoredMark && e.id == 0 && e.data == nil
}

// put writes e into slot i, which follows every live entry of c, and
// reports whether it could: a chunk out of sources needs spillSrcs first.
func (c *chunk) put(i int, e entry) bool {
	if c.refs != nil {
		c.refs[i] = ref{m: e.m, id: e.id}
		c.data[i] = e.data
		return true
	}
	if c.ns > 0 {
		// The next entry of the last source: the common case, a record's
		// rising ids. (An owned entry that matches a source of its m gets
		// back from it what it was: its m, id 0, no data.)
		if s := &c.srcs[c.ns-1]; s.m == e.m && s.id+uint64(i-s.start) == e.id {
			c.data[i] = e.data
			return true
		}
	}
	m, id, data := e.m, e.id, e.data
	if e.isOwned() {
		m, id, data = ownedMark, 0, e.m
	}
	if c.ns > 0 {
		if s := &c.srcs[c.ns-1]; s.m == ownedMark && m == ownedMark {
			c.data[i] = data
			return true
		}
	}
	if c.ns == chunkSrcs {
		return false
	}
	c.srcs[c.ns] = src{start: i, m: m, id: id}
	c.ns++
	c.data[i] = data
	return true
}

// putFront writes e into slot i, which comes before every live entry of c
// (those of [i+1, hi)).
func (c *chunk) putFront(i int, e entry, hi int) {
	if c.refs == nil {
		c.dropSrcsBefore(i + 1)
		m, id, data := e.m, e.id, e.data
		if e.isOwned() {
			m, id, data = ownedMark, 0, e.m
		}
		if c.ns > 0 {
			s := &c.srcs[0]
			if i+1 > s.start { // the entries before i+1 left: the source starts at the head
				s.id += uint64(i + 1 - s.start)
				s.start = i + 1
			}
			if s.m == m && (m == ownedMark || s.id == id+1) {
				s.start, s.id = i, id
				c.data[i] = data
				return
			}
		}
		if c.ns < chunkSrcs {
			copy(c.srcs[1:c.ns+1], c.srcs[:c.ns])
			c.srcs[0] = src{start: i, m: m, id: id}
			c.ns++
			c.data[i] = data
			return
		}
		c.spillSrcs(i+1, hi)
	}
	c.refs[i] = ref{m: e.m, id: e.id}
	c.data[i] = e.data
}

// dropSrcsBefore forgets the sources whose entries all come before i (they
// left), keeping the one that gave entry i, so that a chunk that is both
// filled and drained does not run out of sources, and holds no m of an
// entry that left but for the head's source.
func (c *chunk) dropSrcsBefore(i int) {
	h := 0
	for h+1 < c.ns && c.srcs[h+1].start <= i {
		h++
	}
	if h > 0 {
		copy(c.srcs[:], c.srcs[h:c.ns])
		clear(c.srcs[c.ns-h : c.ns])
		c.ns -= h
	}
}

// spillSrcs moves the m and id of c's live entries, those of [lo, hi), from
// sources to refs.
func (c *chunk) spillSrcs(lo, hi int) {
	c.refs = refsPool.Get().(*[chunkSize]ref)
	k := 0
	for i := lo; i < hi; i++ {
		for k+1 < c.ns && c.srcs[k+1].start <= i {
			k++
		}
		s := &c.srcs[k]
		if s.m == ownedMark {
			c.refs[i] = ref{m: c.data[i].(*Msg)}
			c.data[i] = nil
		} else {
			c.refs[i] = ref{m: s.m, id: s.id + uint64(i-s.start)}
		}
	}
	clear(c.srcs[:c.ns])
	c.ns = 0
}

// entry returns entry i, which is live.
func (c *chunk) entry(i int) entry {
	if c.refs != nil {
		r := &c.refs[i]
		return entry{m: r.m, id: r.id, data: c.data[i]}
	}
	k := c.ns - 1
	for k > 0 && c.srcs[k].start > i {
		k--
	}
	return c.srcs[k].entry(i, c.data[i])
}

// entry returns the entry of index i, with data d, that s gave.
func (s *src) entry(i int, d any) entry {
	if s.m == ownedMark {
		return entry{m: d.(*Msg)}
	}
	return entry{m: s.m, id: s.id + uint64(i-s.start), data: d}
}

// entries writes entries i, i+1, ... into dst, which are live, up to the
// first with a deadline (see entry.expiresAt) unless that one is dst's
// first and first is set, and returns how many it wrote. Entries of a
// shared record never have one, so a source of one is copied without a
// look at each.
func (c *chunk) entries(i int, dst []entry, first bool) int {
	if c.refs != nil {
		for j := range dst {
			r := &c.refs[i+j]
			dst[j] = entry{m: r.m, id: r.id, data: c.data[i+j]}
			if (j > 0 || !first) && dst[j].expiresAt() != 0 {
				dst[j] = entry{}
				return j
			}
		}
		return len(dst)
	}
	k := c.ns - 1
	for k > 0 && c.srcs[k].start > i {
		k--
	}
	for j := 0; j < len(dst); k++ {
		s := &c.srcs[k]
		end := len(dst)
		if k+1 < c.ns {
			end = min(end, c.srcs[k+1].start-i)
		}
		if s.m.shared {
			id := s.id + uint64(i+j-s.start)
			for ; j < end; j++ {
				dst[j] = entry{m: s.m, id: id, data: c.data[i+j]}
				id++
			}
			continue
		}
		for ; j < end; j++ {
			dst[j] = s.entry(i+j, c.data[i+j])
			if (j > 0 || !first) && dst[j].expiresAt() != 0 {
				dst[j] = entry{}
				return j
			}
		}
	}
	return len(dst)
}

// free clears slots [i, j), whose entries left.
func (c *chunk) free(i, j int) {
	clear(c.data[i:j])
	if c.refs != nil {
		clear(c.refs[i:j])
	} else if c.ns > 1 && c.srcs[1].start <= j {
		c.dropSrcsBefore(j)
	}
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
	if c.refs != nil {
		refsPool.Put(c.refs) // clear: every entry left
		c.refs = nil
	}
	c.nr, c.ats = 0, nil
	clear(c.srcs[:c.ns])
	c.ns = 0
}

// fifo is an unbounded FIFO of entries: a list of fixed-size chunks, so that
// neither push nor pop ever copies the buffer. Popped slots are cleared at once
// and drained chunks go back to chunkPool, so a queue that drains keeps one
// chunk (2.25 KiB) and the rest is collected unless another queue reuses it.
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
// chunk per chunkSize messages.
var chunkPool = sync.Pool{New: func() any { return new(chunk) }}

// refsPool holds the refs of chunks that started over, every slot clear,
// for a chunk that runs out of sources: messages that come with a Msg each
// do not allocate refs for every chunkSize of them.
var refsPool = sync.Pool{New: func() any { return new([chunkSize]ref) }}

// putChunk gives c, drained, back to chunkPool.
func putChunk(c *chunk) {
	c.next = nil
	c.restart()
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
	if c := f.tail; !c.put(f.ti, e) {
		lo := 0 // c's live entries: [lo, f.ti)
		if c == f.head {
			lo = f.hi
		}
		c.spillSrcs(lo, f.ti)
		c.put(f.ti, e)
	}
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
	hi := chunkSize
	if f.head == f.tail {
		hi = f.ti
	}
	f.head.putFront(f.hi, e, hi)
	f.head.stampFront(f.hi, at)
	f.n++
	f.pos--
}

// headAt is the stamp of the head; f is not empty.
func (f *fifo) headAt() int64 { return f.head.stamp(f.hi) }

// popOne takes the head, and its stamp; f is not empty.
func (f *fifo) popOne() (entry, int64) {
	e, at := f.head.entry(f.hi), f.headAt()
	f.head.free(f.hi, f.hi+1)
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
		c := f.head
		n := min(len(dst)-got, f.n, chunkSize-f.hi)
		k := c.entries(f.hi, dst[got:got+n], got == 0)
		c.stamps(f.hi, ats[got:got+k])
		c.free(f.hi, f.hi+k)
		got += k
		f.popped(k)
		if k < n {
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

// each calls fn with every entry, oldest first, until fn returns false; the
// entry fn gets is a copy, valid until it returns.
func (f *fifo) each(fn func(*entry) bool) {
	c, i := f.head, f.hi
	for k := 0; k < f.n; k++ {
		if i == chunkSize {
			c, i = c.next, 0
		}
		e := c.entry(i)
		if !fn(&e) {
			return
		}
		i++
	}
}

// peek returns the oldest entry, and false when f is empty.
func (f *fifo) peek() (entry, bool) {
	if f.n == 0 {
		return entry{}, false
	}
	return f.head.entry(f.hi), true
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
