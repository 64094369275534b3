package tinymq

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chunks counts the chunks f holds.
func (f *fifo) chunks() int {
	n := 0
	for c := f.head; c != nil; c = c.next {
		n++
	}
	return n
}

func TestFIFOOrderAcrossChunks(t *testing.T) {
	var f fifo
	var want []*Msg
	var next uint64
	var got []entry
	// Grow and drain through several chunk counts, popping odd batch sizes so
	// pops cross chunk boundaries.
	for round, n := range []int{5, 40, 3, 300, 17, 1000, 1, chunkSize, chunkSize + 1} {
		for range n {
			next++
			m := &Msg{ID: next}
			f.push(entry{m: m}, 0)
			want = append(want, m)
		}
		for f.n > round {
			got = f.pop(got, min(f.n, 7))
		}
	}
	got = f.pop(got, f.n)
	require.Equal(t, len(want), len(got))
	for i := range want {
		require.Same(t, want[i], got[i].m, "position %d", i)
	}
	assert.Zero(t, f.n)
}

func TestFIFOGivesMemoryBackWhenDrained(t *testing.T) {
	var f fifo
	const n = 100_000
	for i := range n {
		f.push(entry{m: &Msg{ID: uint64(i)}, data: i}, 0)
	}
	require.GreaterOrEqual(t, f.chunks(), n/chunkSize)
	var batch []entry
	for f.n > 0 {
		batch = f.pop(batch[:0], min(f.n, maxBatch))
	}
	assert.Equal(t, 1, f.chunks(), "a drained fifo keeps one chunk")
	assertChunkHoldsNothing(t, f.head)
}

func TestQueueGivesMemoryBackAfterDraining(t *testing.T) {
	release := make(chan struct{})
	drained := make(chan struct{})
	const n = 50_000
	var count int
	m := New()
	require.NoError(t, m.RegisterQueue("ev", Fanout, func(context.Context, *Msg) error {
		<-release
		count++
		if count == n {
			close(drained)
		}
		return nil
	}, 1, WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	for i := range n {
		require.NoError(t, m.Publish("ev", i))
	}
	q := m.queues["q"]
	q.lock()
	grown := q.buf.chunks()
	q.mu.Unlock()
	assert.GreaterOrEqual(t, grown, (n-maxBatch)/chunkSize, "a stalled consumer lets the buffer grow without bound")
	close(release)
	<-drained
	q.lock()
	defer q.mu.Unlock()
	assert.Equal(t, 1, q.buf.chunks(), "memory is given back once the queue drains, but for one chunk")
}

func TestBatchIsAFairShare(t *testing.T) {
	q := testQueue(4)
	for i := range 400 {
		q.buf.push(entry{m: &Msg{ID: uint64(i)}}, 0)
	}
	take := func() int {
		w := q.workers[0]
		_, ok := q.take(w)
		require.True(t, ok)
		n := w.n
		w.drop()
		return n
	}
	assert.Equal(t, maxBatch, take(), "never more than maxBatch under one lock")
	for q.buf.n > 8 {
		take()
	}
	assert.Equal(t, 2, take(), "a quarter of what is left with 4 workers")
	assert.Equal(t, 1, take(), "at least one")
}

func TestBatchStopsBeforeAMessageWithADeadline(t *testing.T) {
	q := testQueue(1)
	for i := range 10 {
		m := &Msg{ID: uint64(i)}
		if i == 3 || i == 4 {
			m.x = &msgExt{expires: 1}
		}
		q.buf.push(entry{m: m}, 0)
	}
	w := q.workers[0]
	_, ok := q.take(w)
	require.True(t, ok)
	assert.Equal(t, 3, w.n, "the batch ends before the first message with a deadline")
	w.drop()
	_, ok = q.take(w)
	require.True(t, ok)
	assert.Equal(t, 1, w.n, "a message with a deadline is taken alone when it comes first")
}

func TestIdleWorkerStealsFromABatch(t *testing.T) {
	q := testQueue(2)
	for i := range 8 {
		q.buf.push(entry{m: &Msg{ID: uint64(i)}}, 0)
	}
	a, b := q.workers[0], q.workers[1]
	e, ok := q.take(a) // a takes a fair share (4) and claims the first
	require.True(t, ok)
	assert.Equal(t, uint64(0), e.m.ID)
	q.buf.pop(nil, q.buf.n) // others took the rest
	q.lock()
	assert.Equal(t, 3, q.batchedLocked(), "a's unclaimed messages still wait")
	q.mu.Unlock()
	// a is stuck in a consumer; b finds buf empty and takes half of a's
	// unclaimed messages.
	e, ok = q.take(b)
	require.True(t, ok)
	assert.Equal(t, uint64(1), e.m.ID, "the idle worker runs the message the busy one held")
	e, ok = b.claim()
	require.True(t, ok)
	assert.Equal(t, uint64(2), e.m.ID)
	e, ok = a.claim()
	require.True(t, ok)
	assert.Equal(t, uint64(3), e.m.ID, "the owner goes on with what is left")
	_, ok = a.claim()
	assert.False(t, ok)
}

// A Msg is allocated per delivery: it stays in the 128-byte size class.
func TestMsgStays128Bytes(t *testing.T) {
	assert.Equal(t, uintptr(128), unsafe.Sizeof(Msg{}))
}

// A publish to several queues shares one record of the message: its
// allocations do not grow with the number of queues it reaches, for a plain
// message (the exchange's prototype) or one with a routing key and headers
// (one record per publish).
func TestPublishAllocationsDoNotGrowWithQueues(t *testing.T) {
	nop := func(context.Context, *Msg) error { return nil }
	payload := new(int) // a pointer: boxing it into Data allocates nothing
	headers := map[string]any{"k": "v"}
	allocs := func(queues int, opts ...PublishOption) float64 {
		m := New()
		for range queues {
			if len(opts) == 0 {
				require.NoError(t, m.RegisterQueue("ev", Fanout, nop, 1))
			} else {
				require.NoError(t, m.RegisterQueue("ev", Topic, nop, 1, WithBindingKey("user.#")))
			}
		}
		defer m.Stop() // never started: the messages wait, so their chunks count too
		return testing.AllocsPerRun(2000, func() {
			if err := m.Publish("ev", payload, opts...); err != nil {
				t.Fatal(err)
			}
		})
	}
	keyed := []PublishOption{WithRoutingKey("user.created"), WithHeaders(headers)}
	assert.Equal(t, 1.0, allocs(1, keyed...), "a keyed publish to one queue: its record")
	assert.Equal(t, 1.0, allocs(8, keyed...), "a keyed publish to 8 queues: its record")
	// Past 8 queues (the list kept on the stack), a topic publish allocates
	// its list of queues too, once.
	assert.Equal(t, 2.0, allocs(16, keyed...), "a keyed publish to 16 queues")
	// The queues' chunks hold the waiting messages, 64 a chunk: 8 or 16
	// queues need one per 8 or 4 publishes, which AllocsPerRun's
	// whole-number average counts as 0, and 64 queues one per publish.
	assert.LessOrEqual(t, allocs(64, keyed...), 3.0, "a keyed publish to 64 queues: and their chunks")
	// A plain publish allocates nothing itself.
	assert.Equal(t, 0.0, allocs(8), "a plain fanout publish to 8 queues")
	assert.LessOrEqual(t, allocs(64), 1.0, "a plain fanout publish to 64 queues: their chunks only")
}

// assertChunkHoldsNothing asserts that c keeps no message alive: popped
// slots are cleared so that messages can be collected.
func assertChunkHoldsNothing(t *testing.T, c *chunk) {
	t.Helper()
	for i, d := range c.data {
		assert.Nil(t, d, "slot %d", i)
	}
	assert.Nil(t, c.refs)
	assert.Zero(t, c.srcs)
}

// pop appends the k oldest entries of f to dst; k <= f.n.
func (f *fifo) pop(dst []entry, k int) []entry {
	for range k {
		e, _ := f.popOne()
		dst = append(dst, e)
	}
	return dst
}

// testQueue is a queue with one subscription of n workers, never started.
func testQueue(n int) *queue {
	m := New()
	q := newQueue(0, "q", queueConfig{}, m)
	m.subscribeLocked(q, consumer{}, n)
	return q
}

// Entries that join behind newer ones (floors) are forgotten as they leave,
// even when nothing reads the oldest stamp: a busy queue that never drains
// keeps a bounded record of them.
func TestFifoFloorsStayBoundedWithoutReaders(t *testing.T) {
	var f fifo
	m := &Msg{}
	f.push(entry{m: m}, 1)
	for i := range 10000 {
		f.push(entry{m: m}, int64(2*i+10))
		f.push(entry{m: m}, int64(2*i+9)) // behind a newer one: a floor
		var out [2]entry
		f.pop(out[:0], 2) // one entry always stays: the queue never drains
	}
	require.Equal(t, 1, f.n)
	assert.LessOrEqual(t, len(f.floors), 2, "floors of entries that left are forgotten")
	f.push(entry{m: m}, 100000)
	f.push(entry{m: m}, 50)
	assert.Equal(t, int64(50), f.oldest(), "a floor behind the head is the oldest")
}

// A worker's batch comes out of the fifo a chunk's run at a time, in order,
// and ends before a message with a deadline unless that message comes first:
// no message can expire while it sits in a batch.
func TestFifoPopRunEndsBeforeADeadline(t *testing.T) {
	var f fifo
	shared := &Msg{shared: true}
	for i := range 150 {
		f.push(entry{m: shared, id: uint64(i)}, 0)
	}
	dl := &Msg{ID: 150}
	dl.ext().expires = 1
	f.push(entry{m: dl, id: 150}, 0)
	f.push(entry{m: shared, id: 151}, 0)
	batch := make([]entry, maxBatch)
	var ids []uint64
	var sizes []int
	for f.n > 0 {
		n := f.popRun(batch, make([]int64, len(batch)))
		require.NotZero(t, n)
		sizes = append(sizes, n)
		for _, e := range batch[:n] {
			ids = append(ids, e.id)
		}
	}
	assert.Equal(t, []int{64, 64, 22, 2}, sizes, "runs cross chunks, and end before the deadline")
	for i, id := range ids {
		require.Equal(t, uint64(i), id, "position %d", i)
	}
	assert.Equal(t, 1, f.chunks(), "a drained fifo keeps one chunk")
	assertChunkHoldsNothing(t, f.head)
}

// A parked worker never leaves a message waiting, even after a wake that
// found it awake or was meant for another: a topology change's Broadcast
// reaches every parked worker (and a worker that parked while it was being
// sent), and a Signal may be sent after its worker already woke. Counted as
// still parked, such a worker would get the next wake while it is busy, and
// that wake would be lost, and counted as under way for good.
func TestParkedWorkerWakesAfterAStrayWake(t *testing.T) {
	m := New()
	require.NoError(t, m.DeclareQueue("q", "ev", Fanout))
	entered := make(chan string, 4)
	gate := make(chan struct{})
	_, err := m.Consume("q", func(_ context.Context, msg *Msg) error {
		entered <- msg.Data.(string)
		if msg.Data == "blocks" {
			<-gate
		}
		return nil
	}, 1)
	require.NoError(t, err)
	q := startQ(t, m)

	waitParked(t)
	q.cond.Broadcast() // the stray wake: readies the worker before it returns
	waitParked(t)      // it found nothing and parked again

	require.NoError(t, m.Publish("ev", "blocks"))
	require.Equal(t, "blocks", <-entered)
	require.NoError(t, m.Publish("ev", "while busy")) // a wake for no parked worker
	close(gate)
	require.Equal(t, "while busy", <-entered)
	waitParked(t)
	require.NoError(t, m.Publish("ev", "to a parked worker"))
	select {
	case got := <-entered:
		assert.Equal(t, "to a parked worker", got)
	case <-time.After(10 * time.Second):
		t.Fatalf("the message waits with its worker parked: %+v", m.Stats().Queues["q"])
	}
}

var parkedWorker = regexp.MustCompile(`(?m)^goroutine \d+ \[sync\.Cond\.Wait[^\]]*\]:\n(?:.*\n){0,6}?\S*\(\*queue\)\.take\(`)

// waitParked waits until a worker's goroutine is parked in take, waiting on
// its queue's cond (every test here has one worker).
func waitParked(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if parkedWorker.Match(buf[:runtime.Stack(buf, true)]) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no worker parked")
		}
		runtime.Gosched()
	}
}

// A purge that comes after a retry was counted as scheduled, but before its
// item reached the scheduler, cannot find the item; the item is then taken
// back as it arrives and settled as purged at once: its group goes on, and
// the scheduler keeps nothing of it, rather than holding the group (and the
// message's log record) until its backoff ends, an hour later here.
func TestRetryPurgedBeforeItReachedTheSchedulerReleasesItsGroupAtOnce(t *testing.T) {
	m := New()
	got := make(chan string, 4)
	require.NoError(t, m.DeclareQueue("q", "ev", Fanout, WithGroupOrdering(),
		WithRetry(RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})))
	_, err := m.Consume("q", func(_ context.Context, msg *Msg) error {
		if msg.Data == "fails" {
			return assert.AnError
		}
		got <- msg.Data.(string)
		return nil
	}, 2)
	require.NoError(t, err)
	q := startQ(t, m)

	require.NoError(t, m.Publish("ev", "fails", WithMessageGroup("g")))
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, 10*time.Second, time.Millisecond)
	// Put the retry back where schedule leaves it between its count and
	// its item: counted, its item not in the scheduler yet.
	var it schedItem
	m.sched.mu.Lock()
	for _, o := range m.sched.items {
		if o.q == q && o.m != nil {
			it = o
		}
	}
	m.sched.mu.Unlock()
	require.NotNil(t, it.m)
	require.True(t, m.sched.remove(q, it.m))

	n, err := m.PurgeQueue("q")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	q.later(it) // the item arrives after the purge

	m.sched.mu.Lock()
	for _, o := range m.sched.items {
		assert.False(t, o.q == q && o.m != nil, "the purged retry is still in the scheduler")
	}
	m.sched.mu.Unlock()
	require.NoError(t, m.Publish("ev", "next", WithMessageGroup("g")))
	select {
	case d := <-got:
		assert.Equal(t, "next", d)
	case <-time.After(10 * time.Second):
		t.Fatalf("the group is still held by its purged retry: %+v", m.Stats().Queues["q"])
	}
	s := m.Stats().Queues["q"]
	assert.Equal(t, uint64(1), s.Purged)
	assert.Zero(t, s.Scheduled)
}

// startQ starts m, with a bounded Shutdown at the end of the test (a message
// left waiting would hold a Stop), and returns its queue "q".
func startQ(t *testing.T, m *MQ) *queue {
	t.Helper()
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Shutdown(ctx)
	})
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.queues["q"]
}

// A message that a worker has begun but not yet handed to its consumer is in
// the worker's hands when the queue is aborted: the abort counts it as in a
// consumer, not as lost and not as nothing (a Shutdown that counted nothing
// waited, past its deadline, for a consumer call that had yet to begin).
func TestAbortCountsAMessageBegunButNotYetDeliveredAsInHand(t *testing.T) {
	m := New()
	require.NoError(t, m.RegisterQueue("ex", Fanout, func(context.Context, *Msg) error { return nil }, 1, WithQueueName("q")))
	require.NoError(t, m.Publish("ex", "x")) // before Start: it waits in buf
	q := m.queues["q"]
	w := q.workers[0]

	// What a worker does up to the moment before it counts the delivery.
	q.lock()
	e := q.refillLocked(w)
	q.mu.Unlock()
	require.True(t, w.begin())
	require.NotNil(t, e.msg(q.name))

	undelivered, running := q.abort()
	assert.Zero(t, undelivered, "the message was begun")
	assert.Equal(t, uint64(1), running, "the begun message is in the worker's hands")

	// A begin the abort refuses still raises the worker's count: it is
	// not a message in hand.
	assert.False(t, w.begin(), "no worker begins after the abort")
	q.lock()
	assert.Equal(t, uint64(1), q.inHandLocked(), "a refused begin is not in hand")
	q.mu.Unlock()

	// A skipped message (expired, or unreadable) ends its begin without a
	// delivery: it is no longer in hand.
	w.skipped.Add(1)
	q.lock()
	assert.Zero(t, q.inHandLocked())
	q.mu.Unlock()
}

// Every entry comes out of a fifo with the stamp it went in with, whatever
// mix of pushes, pushes to the front and pops it went through, and however
// many distinct stamps a chunk holds (entries of one tick of the coarse
// clock share a run; others spill to a stamp per entry); and the oldest
// stamp is the oldest entry's, however the entries joined.
func TestFifoKeepsEachEntrysStamp(t *testing.T) {
	tick := int64(clockTick)
	rng := rand.New(rand.NewPCG(1, 2))
	var f fifo
	var model []int64 // the stamps, head first
	clock := int64(1 << 40)
	check := func(got, want int64, what string, step int) {
		t.Helper()
		if got != want {
			t.Fatalf("step %d, %s: stamp %d for an entry stamped %d", step, what, got, want)
		}
	}
	ats := make([]int64, maxBatch)
	batch := make([]entry, maxBatch)
	spilled := 0 // chunks that ran out of runs
	for step := range 200_000 {
		r := rng.IntN(10)
		if step%20_000 < 10_000 && r >= 7 && rng.IntN(3) > 0 {
			r = 0 // a backlog builds up, across chunks, then drains
		}
		switch {
		case r < 5: // publish: the clock's reading, which a tick moves on; at times the time itself
			at := clock
			switch rng.IntN(8) {
			case 0:
				clock += tick
			case 1:
				at = clock + rng.Int64N(tick)
			}
			f.push(entry{m: &Msg{}}, at)
			model = append(model, at)
		case r < 6: // a late joiner behind newer entries (a floor)
			at := clock - rng.Int64N(5*tick)
			f.push(entry{m: &Msg{}}, at)
			model = append(model, at)
		case r < 7 && len(model) > 0:
			switch rng.IntN(3) {
			case 0: // taken and given back, as a worker gives back its batch, with the stamp it carried
				e, at := f.popOne()
				check(at, model[0], "popOne", step)
				f.pushFront(e, at)
			case 1: // one older before them all, as a retry
				at := model[0] - rng.Int64N(3*tick)
				f.pushFront(entry{m: &Msg{}}, at)
				model = append([]int64{at}, model...)
			default: // a newer one before them all, as ReplayDeadLetters puts back what it took
				f.pushFront(entry{m: &Msg{}}, clock)
				model = append([]int64{clock}, model...)
			}
		case len(model) > 0:
			n := f.popRun(batch[:1+rng.IntN(maxBatch)], ats)
			for i := range n {
				check(ats[i], model[i], fmt.Sprintf("popRun entry %d", i), step)
			}
			model = model[n:]
		}
		require.Equal(t, len(model), f.n)
		if len(model) > 0 {
			check(f.headAt(), model[0], "the head", step)
			check(f.oldest(), slices.Min(model), "oldest", step)
		}
		if f.tail != nil && f.ti == chunkSize && f.tail.ats != nil {
			spilled++
		}
	}
	require.NotZero(t, spilled, "some chunks kept a stamp per entry")
}

// TestQueueKeepsItsLockAndFifoEndsOnOneCacheLine guards the layout that
// queue's comment explains: what both sides of the hand-off write for every
// message sits on two cache lines from the start of the struct (1-queue
// throughput was about 10% lower with them spread over three).
func TestQueueKeepsItsLockAndFifoEndsOnOneCacheLine(t *testing.T) {
	var q queue
	const line = 64
	assert.Zero(t, unsafe.Offsetof(q.mu), "mu starts the struct, which starts a line")
	assert.LessOrEqual(t, unsafe.Offsetof(q.buf)+unsafe.Offsetof(q.buf.tailAt)+unsafe.Sizeof(q.buf.tailAt), uintptr(line),
		"mu and buf's ends share the first line")
	for name, end := range map[string]uintptr{
		"accepted": unsafe.Offsetof(q.accepted) + unsafe.Sizeof(q.accepted),
		"entered":  unsafe.Offsetof(q.entered) + unsafe.Sizeof(q.entered),
		"busy":     unsafe.Offsetof(q.busy) + unsafe.Sizeof(q.busy),
		"takes":    unsafe.Offsetof(q.takes) + unsafe.Sizeof(q.takes),
	} {
		assert.LessOrEqual(t, end, uintptr(2*line), "%s is on the second line", name)
	}
	// Every size class a queue can fall in is a multiple of 64 bytes, so
	// offset 0 is the start of a line.
	assert.Greater(t, unsafe.Sizeof(q), uintptr(1024), "size classes above 1 KiB are multiples of 128 bytes")
}

// Every entry comes out of a fifo as it went in (its m, id and data),
// whatever mix of entries a chunk holds (runs of an exchange's record with
// rising ids, owned entries, restored ones, a record per message) and of
// pushes, pushes to the front, pops and walks they went through; chunks
// that run out of sources keep an m and an id per entry, and a plain run
// needs one source a chunk.
func TestFifoGivesBackEachEntryAsItWentIn(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	protos := []*Msg{{shared: true}, {shared: true}}
	ids := []uint64{0, 1 << 40}
	mix := 0 // a phase's mix: plain messages only, owned ones only, or any
	gen := func() entry {
		r := rng.IntN(20)
		switch mix {
		case 0:
			r = 0
		case 1:
			r = 12
		}
		switch {
		case r < 12: // an exchange's record, its ids rising; at times a gap (a key this queue missed)
			p := rng.IntN(len(protos))
			if mix == 0 {
				p = 0
			}
			ids[p] += 1 + uint64(rng.IntN(20)/19)
			var data any = ids[p]
			if rng.IntN(10) == 0 {
				data = nil // a publish of nil
			}
			return entry{m: protos[p], id: ids[p], data: data}
		case r < 16: // owned: a TTL, a retry
			m := &Msg{ID: rng.Uint64()}
			if rng.IntN(4) == 0 {
				m.ext().expires = 1
			}
			return entry{m: m}
		case r < 18: // a record of its own, shared with other queues
			return entry{m: &Msg{shared: true}, id: rng.Uint64(), data: rng.Int()}
		default: // restored from the log
			return entry{m: restoredMark, id: rng.Uint64(), data: &restored{key: "k"}}
		}
	}
	same := func(step int, what string, got, want entry) {
		t.Helper()
		if got.m != want.m || got.id != want.id || got.data != want.data {
			t.Fatalf("step %d, %s: got entry {%p %d %v}, want {%p %d %v}", step, what, got.m, got.id, got.data, want.m, want.id, want.data)
		}
	}
	var f fifo
	var model []entry
	batch := make([]entry, maxBatch)
	ats := make([]int64, maxBatch)
	spilled, plain := 0, 0
	for step := range 200_000 {
		mix = step / 5000 % 3
		r := rng.IntN(10)
		if step%20_000 < 10_000 && r >= 6 && rng.IntN(3) > 0 {
			r = 0 // a backlog builds up, across chunks, then drains
		}
		switch {
		case r < 5:
			e := gen()
			f.push(e, 0)
			model = append(model, e)
		case r < 6 && len(model) > 0:
			if rng.IntN(2) == 0 { // taken and given back, as a worker gives back its batch
				e, _ := f.popOne()
				same(step, "popOne", e, model[0])
				f.pushFront(e, 0)
			} else { // one before them all, as a retry or a replay
				e := gen()
				f.pushFront(e, 0)
				model = append([]entry{e}, model...)
			}
		case r < 7 && len(model) > 0:
			i := 0
			f.each(func(e *entry) bool {
				same(step, fmt.Sprintf("each, entry %d", i), *e, model[i])
				i++
				return i < 300
			})
			h, ok := f.peek()
			require.True(t, ok)
			same(step, "peek", h, model[0])
		case len(model) > 0:
			clear(batch)
			dst := batch[:1+rng.IntN(maxBatch)]
			n := f.popRun(dst, ats)
			require.NotZero(t, n)
			for i := range n {
				same(step, fmt.Sprintf("popRun entry %d", i), dst[i], model[i])
			}
			for _, e := range dst[n:] {
				require.Zero(t, e, "a batch holds only what it took")
			}
			for i := 1; i < n; i++ {
				require.Zero(t, dst[i].expiresAt(), "step %d: a deadline in a batch but first", step)
			}
			model = model[n:]
			if n < len(dst) && len(model) > 0 {
				require.NotZero(t, model[0].expiresAt(), "step %d: a batch ends early only before a deadline", step)
			}
		}
		require.Equal(t, len(model), f.n)
		if f.tail != nil && f.ti == chunkSize {
			if f.tail.refs != nil {
				spilled++
			} else {
				plain++
			}
		}
	}
	require.NotZero(t, spilled, "some chunks kept an m and an id per entry")
	require.NotZero(t, plain, "some chunks kept their entries' m and id in sources")
	for f.n > 0 {
		f.popRun(batch, ats)
	}
	assertChunkHoldsNothing(t, f.head)
}

// A queue that every message of its exchange reaches keeps, per message,
// its data and a share of its chunk: 18 bytes, where a whole entry and its
// stamp cost 36 (the README's memory figures).
func TestAPlainChunkKeepsOnlyEachEntrysData(t *testing.T) {
	// The bytes a chunk takes, allocated 4096 times: what other goroutines
	// allocate meanwhile (the runtime, tests of other packages' leftovers)
	// is below a byte per chunk unless it passes 4 KiB, and the least of
	// three tries is taken.
	keep := make([]*chunk, 4096)
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range keep {
			keep[i] = new(chunk)
		}
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	runtime.KeepAlive(keep)
	assert.Equal(t, uint64(2304), least/uint64(len(keep)), "a chunk takes 2304 bytes (its size class)")
	var f fifo
	p := &Msg{shared: true}
	for i := range 3 * chunkSize {
		f.push(entry{m: p, id: uint64(i) + 1, data: i}, 0)
	}
	for c := f.head; c != nil; c = c.next {
		assert.Nil(t, c.refs)
		assert.Equal(t, 1, c.ns, "one source a chunk")
	}
	var owned fifo
	for range 2 * chunkSize {
		owned.push(entry{m: &Msg{}}, 0)
	}
	for c := owned.head; c != nil; c = c.next {
		assert.Nil(t, c.refs, "owned entries keep their m in data")
	}
}

// A queue gets its inbox (1.7 KiB) at its first publish that would use it:
// a queue that never gets one, or cannot take one (a TTL), keeps none.
func TestAQueueGetsAnInboxAtItsFirstPlainPublish(t *testing.T) {
	m := New()
	require.NoError(t, m.DeclareQueue("plain", "ev", Fanout))
	require.NoError(t, m.DeclareQueue("ttl", "timed", Fanout, WithMessageTTL(time.Hour)))
	require.NoError(t, m.DeclareQueue("idle", "other", Fanout))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	for _, name := range []string{"plain", "ttl", "idle"} {
		assert.Nil(t, m.queues[name].inbox.Load(), "%s: no inbox before a publish", name)
	}
	require.NoError(t, m.Publish("ev", 1))
	require.NoError(t, m.Publish("timed", 1))
	assert.NotNil(t, m.queues["plain"].inbox.Load(), "a plain publish made it")
	assert.Nil(t, m.queues["ttl"].inbox.Load(), "a queue with a TTL takes no plain publish")
	assert.Nil(t, m.queues["idle"].inbox.Load(), "a queue that got nothing keeps none")
	st := m.Stats().Queues
	assert.Equal(t, 1, st["plain"].Depth)
	assert.Equal(t, 1, st["ttl"].Depth)

	// Publishers racing to make a queue's inbox: one is kept, and every
	// publish lands in the queue.
	require.NoError(t, m.DeclareQueue("raced", "race", Fanout))
	const pubs, each = 8, 100
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				assert.NoError(t, m.Publish("race", i))
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, pubs*each, m.Stats().Queues["raced"].Depth)
}
