package tinymq

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
)

// run is the goroutine of worker slot w: it delivers messages until the
// queue is closed and empty, or aborted. wg.Done is its join. A consumer that
// ends the goroutine with runtime.Goexit (as t.FailNow does) fails its
// message, and a new goroutine takes over the slot, so the queue keeps its
// workers.
//
// With [WithDeliveryTimeout], a goroutine whose consumer call outlived its
// deadline may be abandoned (see timedOut): another goroutine took the slot,
// and this one ends, without touching w again, once the consumer returns.
func (w *worker) run(ctx context.Context, wg *sync.WaitGroup) {
	q := w.q
	id := q.mq.own.Enter()
	returned := false
	abandoned := false // set by deliver: this goroutine no longer runs slot w
	defer func() {
		q.mq.own.Leave(id)
		switch {
		case abandoned:
			q.abandonedReturned(w.sub)
		case !returned:
			wg.Add(1) // this goroutine has not called Done: the count is above 0
			go w.run(ctx, wg)
		}
		wg.Done()
	}()
	for {
		e, ok := w.claim()
		if !ok {
			if e, ok = q.take(w); !ok {
				returned = true
				return
			}
		}
		if !w.begin() {
			w.drop() // aborted: abort counted the rest as undelivered
			continue
		}
		q.wakeThief(w)
		q.deliver(ctx, w, &e, &abandoned)
		if abandoned {
			returned = true
			return
		}
	}
}

// deliver hands e's message to the consumer, unless it expired, and settles
// the outcome. A direct consumer ([RegisterHandler]) of a shared entry gets
// the message by value, and a Msg is made only if it fails. With a delivery
// timeout, deliver sets *abandoned when the call outlived it and another
// goroutine took w's slot: the caller's goroutine must then end.
func (q *queue) deliver(ctx context.Context, w *worker, e *entry, abandoned *bool) {
	var m *Msg
	if w.c.direct == nil || !e.m.shared {
		m = e.msg(q.name)
		if x := m.expires(); x != 0 && time.Now().UnixNano() >= x {
			q.expireBegun(w, m)
			return
		}
		if !q.load(m) {
			q.groupEnd(m)
			w.skipped.Add(1)
			return
		}
		m.Attempt++
	}
	w.delivered.Add(1)
	// The call of a message that was alone in the queue is timed, so that a
	// queue that is not busy has every call timed; others, one in
	// sampleEvery.
	timed := w.fresh || w.calls%sampleEvery == 0
	w.fresh = false
	w.calls++
	var start time.Duration
	if timed {
		start = monoNow()
	}
	var err error
	if q.cfg.deliveryTimeout > 0 {
		var fate int32
		if fate, err = q.processTimed(ctx, w, e, m, abandoned); fate != callReturned {
			// The deadline passed first: timedOut settled the message, and
			// what the consumer did is ignored.
			*abandoned = fate == callReplaced
			return
		}
	} else {
		err = q.process(ctx, w.c, e, m, nil, nil)
	}
	if timed {
		q.hist.observe(monoNow() - start)
	}
	if err == nil {
		if m != nil {
			if k := m.dkey(); k != "" {
				q.mq.dur.ack(q.name, k, nil) // before the count, which tests wait for
			}
			if q.cfg.groups {
				q.groupEnd(m) // before the count too
			}
		}
		w.succeeded.Add(1)
		return
	}
	if m == nil {
		m = e.firstMsg(q.name)
	}
	q.settle(m, err)
}

// monoStart is the origin of monoNow.
var monoStart = time.Now()

// monoNow reads the monotonic clock only, as time since monoStart: about
// half the cost of time.Now, which reads the wall clock too. Only the
// difference of two readings means anything. deliver times consumer calls
// with it, and a call of an idle queue's message is timed before it starts:
// the read is on the path from publish to the consumer.
func monoNow() time.Duration { return time.Since(monoStart) }

// firstMsg is the Msg of a shared entry's first delivery, made once a direct
// consumer failed it.
func (e *entry) firstMsg(queue string) *Msg {
	m := e.msg(queue)
	m.Attempt = 1
	return m
}

// process runs the consumer on one message, m or (for a direct consumer, when
// m is nil) the shared entry e, turning a panic into a [*PanicError] and a
// typed nil error into [ErrTypedNil]. If the consumer calls runtime.Goexit,
// process settles the message itself with [ErrGoexit], as the goroutine will
// not return to do it. A timed call (tc, see processTimed) that Goexits after
// its deadline passed leaves the message to timedOut, and sets *abandoned
// when another goroutine took the slot.
func (q *queue) process(ctx context.Context, c consumer, e *entry, m *Msg, tc *timedCall, abandoned *bool) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			err = freezer.FreezeAside(&q.mq.own, &PanicError{Value: r, Stack: debug.Stack()})
			return
		}
		if tc != nil {
			if fate := tc.finish(); fate != callReturned {
				*abandoned = fate == callReplaced
				return
			}
		}
		if m == nil {
			m = e.firstMsg(q.name)
		}
		q.settle(m, fmt.Errorf("%w (queue %q)", ErrGoexit, q.name))
	}()
	switch {
	case m == nil && c.data != nil:
		err = c.data(ctx, e.data)
	case m == nil:
		err = c.direct(ctx, e.delivery(q.name))
	case c.direct != nil:
		err = c.direct(ctx, m.delivery())
	default:
		err = c.fn(ctx, m)
	}
	if err != nil {
		err = freezer.Freeze(err) // still guarded: its methods may call Goexit too
	}
	returned = true
	return err
}

// freezer freezes a consumer's error (see process): the typed nil check, and
// its text, its ErrPermanent and its *PanicError asked once, so that
// settling, logging and dead-lettering never run the consumer's code again.
var freezer = guard.Freezer[*PanicError]{TypedNil: ErrTypedNil, Permanent: ErrPermanent, Panicked: ErrPanicked,
	Unpack: func(pe *PanicError) (any, []byte) { return pe.Value, pe.Stack },
	Pack:   func(text string, stack []byte) *PanicError { return &PanicError{Value: text, Stack: stack} }}

// settle counts a failed delivery of m (err is not nil; deliver counts the
// successes) and decides what follows: a retry, or a dead letter. Unless m
// waits for a retry, its group (WithGroupOrdering) goes on. It counts itself
// in the MQ's settling before the failure, which is m's end for a Shutdown
// deadline: the logger, filters and codecs it calls after that may block.
func (q *queue) settle(m *Msg, err error) {
	q.mq.settleBegin()
	defer q.mq.settling.Add(-1)
	if !q.fail(m, err) {
		q.groupEnd(m)
	}
}

// expireBegun ends m, which w began and found expired: it is dead-lettered
// (which may run a logger, filter or codec), and counted as skipped before
// that, as settle counts a failure, with this goroutine in the MQ's
// settling meanwhile, so that a Shutdown deadline counts it as ended, not
// in a consumer, and does not wait for that user code.
func (q *queue) expireBegun(w *worker, m *Msg) {
	q.mq.settleBegin()
	defer q.mq.settling.Add(-1)
	q.c.expired.Add(1)
	w.skipped.Add(1)
	q.deadLetter(m, ReasonExpired, m.lastErr())
	q.groupEnd(m)
}

// fail is settle, but for the group: it reports whether m waits for a retry.
func (q *queue) fail(m *Msg, err error) (retrying bool) {
	// The failure is counted under q.mu, and m stays in hand for a Shutdown
	// deadline's abort (q.failing, see inHandLocked) until its end is
	// decided under q.mu too: left on disk or removed (the abort, or the
	// delete, came), or its retry scheduled or refused (see schedule). A
	// dead letter's end is decided in its target queues: m leaves failing
	// just before, and should the abort come in between and the dead
	// letter be dropped because of it, m is counted in lostLate.
	q.lock()
	q.c.failed.Add(1)
	held := !q.aborted
	if held {
		q.failing++
	}
	q.mu.Unlock()
	m.ext().lastErr = err
	if q.leftOnDisk(m, err) {
		q.endFailing(held)
		return false
	}
	if q.removedInFlight(m, err) {
		q.endFailing(held)
		return false
	}
	if m.Attempt < q.cfg.retry.MaxAttempts && !guard.Is(err, ErrPermanent) {
		return q.retryLater(m, err, held)
	}
	counted := q.endFailing(held)
	lost := q.deadLetter(m, ReasonRejected, err)
	q.lostLate(held && !counted && lost)
	return false
}

// endFailing takes m out of failing, if held there (see fail), and reports
// whether an abort came meanwhile, and so counted m in hand.
func (q *queue) endFailing(held bool) (counted bool) {
	if !held {
		return false
	}
	q.lock()
	q.failing--
	counted = q.aborted
	q.mu.Unlock()
	return counted
}

// lostLate counts, if lost, a message that failed before a Shutdown
// deadline, left failing before the abort, and whose dead letter the abort
// then kept from its end: Shutdown reads it after the settling workers (see
// abortAll).
func (q *queue) lostLate(lost bool) {
	if lost {
		q.mq.lostLate.Add(1)
	}
}

// retryLater schedules m for its next attempt after its backoff, and reports
// whether it did (a deleted, aborted or full queue ends m instead). held
// says that m is in failing (see fail), which schedule ends. The retry
// delivers a copy of m, as the consumer left it, so that a consumer that
// kept m does not see it change.
func (q *queue) retryLater(m *Msg, err error, held bool) bool {
	backoff := q.cfg.retry.backoff(m.Attempt)
	next := m.clone()
	if k := m.dkey(); k != "" {
		q.mq.dur.saveState(q.name, k, queueState{attempt: m.Attempt,
			dueAt: deadline(time.Now(), backoff), lastErr: guard.ErrorText(err)})
	}
	evicted, overflow, aborted, gone := q.schedule(next, backoff, held)
	switch {
	case gone:
		q.removeInFlight(m, err)
		return false
	case aborted:
		// The abort counted m in hand (in failing, or not yet failed).
		q.c.undelivered.Add(1)
		q.logFailure(m, err, slog.LevelError, "tinymq: delivery failed, no retry after the shutdown deadline")
		return false
	case overflow != nil:
		q.c.overflowed.Add(1)
		q.deadLetter(m, ReasonMaxLen, err)
		return false
	}
	q.c.retried.Add(1)
	q.logFailure(m, err, slog.LevelInfo, "tinymq: delivery failed, will retry", slog.Duration("backoff", backoff))
	if evicted != nil {
		q.c.overflowed.Add(1)
		q.deadLetter(evicted, ReasonMaxLen, nil)
	}
	return true
}

// logFailure logs what became of m, with err, the consumer's error (if any).
func (q *queue) logFailure(m *Msg, err error, level slog.Level, msg string, extra ...slog.Attr) {
	q.mq.logAttrs(level, msg, func(attrs []slog.Attr) []slog.Attr {
		attrs = append(attrs,
			slog.String("exchange", m.Exchange),
			slog.String("queue", q.name),
			slog.Uint64("msg_id", m.ID),
			slog.Int("attempt", m.Attempt))
		if err != nil {
			attrs = append(attrs, slog.String("err", guard.ErrorText(err)))
			if pe, _ := guard.As[*PanicError](err); pe != nil {
				attrs = append(attrs, slog.String("stack", string(pe.Stack)))
			}
		}
		return append(attrs, extra...)
	})
}

// worker is one worker slot of a queue: its batch and its claim cursor. A
// goroutine runs it (see run); if a consumer ends that goroutine with
// runtime.Goexit, another takes over the same slot.
type worker struct {
	q     *queue
	sub   *Subscription
	c     consumer // sub's
	batch [maxBatch]entry
	n     int          // entries in batch; written by the owner under q.mu
	next  atomic.Int32 // next unclaimed index: owner claims without q.mu, thieves under it
	held  bool         // the owner counts in q.busy
	calls int          // consumer calls, for sampling their duration
	fresh bool         // the entry being begun was alone in the queue (see refillLocked, deliver)
	// seq and off place the batch in the order of buf: it is the take of
	// number seq, from its entry off on (a thief's part of another's batch),
	// so that entries given back (see queue.giveBackLocked) return in order.
	seq uint64
	off int
	// ats are the stamps of the batch's entries (see entry), written with
	// the batch under q.mu and never by the owner's claims, so that
	// QueueStats.OldestAge reads, under q.mu, that of the first unclaimed.
	ats [maxBatch]int64

	// The entries this worker began to handle (see begin), what it handed
	// to the consumer, and what succeeded: counted here rather than in the
	// queue so that the workers of one queue do not fight over one cache
	// line for every message (abort and Stats add them up).
	begun                atomic.Uint64
	delivered, succeeded atomic.Uint64
	skipped              atomic.Uint64 // begun, then not delivered: expired, or its log read failed
	_                    [64]byte      // nor share a line with the next worker
}

// wakeThief makes sure a worker is awake to steal the entries left in w's
// batch, which waits to begin the next: should that message block, they
// would wait for it while another worker sleeps. It costs atomic loads when
// no worker is parked, or when a wake is already on its way: the woken
// worker takes q.mu after the load saw its wake counted, so after w's batch
// was filled, and it steals from that batch or passes the wake on (see
// wakeIfWaitingLocked). Without that check a worker took q.mu for nearly
// every message while the woken one waited for a CPU.
func (q *queue) wakeThief(w *worker) {
	if w.n-int(w.next.Load()) <= 0 || q.idle.Load() == 0 || q.waking.Load() > 0 {
		return
	}
	q.lock()
	wake := q.wakeForLocked(w.n - int(w.next.Load()))
	q.mu.Unlock()
	q.wakeAfter(wake, 0)
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
		// A rate limit counts each delivery's token (see tokenLocked), so
		// such a queue takes only through buf.
		taking := !q.paused && q.cfg.rate == 0 && !w.sub.cancelled
		if taking && q.buf.n == 0 {
			if e, ok := q.refillInboxLocked(w); ok {
				wake := q.wakeIfWaitingLocked()
				q.mu.Unlock()
				q.wakeAfter(wake, 0)
				return e, true
			}
		}
		if !taking {
			// A queue that is not taking moves the inbox into buf, where
			// Depth, a purge and the next worker see it. One that takes
			// leaves it while buf holds entries, which are older (every
			// holder of mu but a worker moves the inbox before it pushes,
			// see queue.lock): it takes from buf first and from the inbox
			// once buf is empty (see refillInboxLocked), so that an entry
			// is copied into buf only by a publisher that found the inbox
			// full, 32 at a time under one lock.
			q.pullLocked()
		}
		if w.sub.cancelled {
			q.leaveLocked(w)
			// The wake this worker may have taken off waking was counted
			// for a worker that looks at buf and the batches: it goes to
			// another, or messages would wait while a worker sleeps (the
			// enqueues and thieves meanwhile saw a wake on its way).
			wake := !q.paused && q.wakeIfWaitingLocked()
			q.mu.Unlock()
			q.wakeAfter(wake, 0)
			return entry{}, false
		}
		// A worker that leaves entries behind, in buf or in its batch, wakes
		// another to take them, or to steal them should this one's message
		// block: a parked worker never leaves a message waiting.
		if !q.paused {
			if q.buf.n > 0 {
				if q.cfg.rate > 0 {
					if wait := q.tokenLocked(); wait > 0 {
						// WithRateLimit: no token. The scheduler wakes the
						// queue when the next is due; until then, park.
						if !q.rateArmed {
							q.rateArmed = true
							q.mu.Unlock() // the scheduler's lock is never taken with a queue's
							q.mq.sched.add(schedItem{due: time.Unix(0, deadline(time.Now(), wait)), q: q, rate: true})
							q.lock()
							continue
						}
						goto park
					}
				}
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
		}
		if q.closed {
			q.leaveLocked(w)
			q.mu.Unlock()
			return entry{}, false
		}
	park:
		// The worker counts itself in idle until it holds q.mu again, so
		// that idle counts exactly the workers that a Signal or a
		// Broadcast could still reach or has reached: a wake that found
		// this one awake (a topology change's Broadcast, a Signal sent
		// before it parked) then leaves no count behind.
		if h := testHookPark.Load(); h != nil {
			(*h)()
		}
		q.idle.Add(1)
		if b := q.inbox.Load(); b != nil && b.ready() {
			// A publisher wrote it before it could see this worker
			// idle (see acceptPlain): take it rather than park.
			q.idle.Add(-1)
			continue
		}
		q.cond.Wait()
		q.idle.Add(-1)
		if q.waking.Load() > 0 {
			q.waking.Add(-1)
		}
	}
}

// leaveLocked retires worker w, whose goroutine ends: its counts join the
// queue's, and the last worker of a subscription to leave ends it. q.mu is
// held.
func (q *queue) leaveLocked(w *worker) {
	i := slices.Index(q.workers, w)
	if i < 0 {
		return
	}
	q.left.begun += w.begun.Load() &^ abortBit
	q.left.skipped += w.skipped.Load()
	q.left.delivered += w.delivered.Load()
	q.left.succeeded += w.succeeded.Load()
	q.workers = slices.Delete(slices.Clone(q.workers), i, i+1)
	s := w.sub
	if s.alive--; s.alive == 0 {
		close(s.done)
	}
}

// refillLocked fills w's batch with a fair share of buf and claims its first
// entry. A batch ends before a message with a deadline, unless that message
// comes first, so that no message can expire while it sits in a batch;
// queues with a TTL or a length limit take one message at a time, so that
// their counts are exact. q.mu is held and buf is not empty.
func (q *queue) refillLocked(w *worker) entry {
	k := 1
	if q.cfg.ttl == 0 && q.cfg.maxLen == 0 && q.cfg.rate == 0 && !q.cfg.groups { // a rate limit counts each delivery's token here
		k = min(max(q.buf.n/max(q.active, 1), 1), maxBatch)
	}
	n := q.buf.popRun(w.batch[:k], w.ats[:k])
	return q.handLocked(w, n)
}

// handLocked gives worker w the batch of n entries just written into it,
// and claims its first. q.mu is held.
func (q *queue) handLocked(w *worker, n int) entry {
	w.fresh = n == 1 && q.buf.n == 0 // the queue is not busy: time the call
	w.n = n
	w.next.Store(1)
	q.takes++
	w.seq, w.off = q.takes, 0
	w.held = true
	q.busy++
	e := w.batch[0]
	w.batch[0] = entry{}
	return e
}

// refillInboxLocked is refillLocked for an empty buf: it takes w's fair
// share of the inbox's written entries straight into w's batch, without
// their passing through buf, and moves the rest into buf. It reports false
// if the inbox has none. q.mu is held; buf is empty.
func (q *queue) refillInboxLocked(w *worker) (entry, bool) {
	b := q.inbox.Load()
	if b == nil || !b.ready() {
		return entry{}, false
	}
	r := uint64(1) // written entries, in order from deq
	for r < inboxSize && b.slots[(b.deq+r)%inboxSize].seq.Load() == b.deq+r+1 {
		r++
	}
	k := min(max(int(r)/max(q.active, 1), 1), maxBatch)
	for i := range k {
		s := &b.slots[b.deq%inboxSize]
		w.batch[i], w.ats[i] = s.e, s.at
		s.e = entry{}
		b.deq++
	}
	q.accepted += uint64(k)
	q.entered += uint64(k)
	b.freed.Store(b.deq)
	q.pullLocked()
	return q.handLocked(w, k), true
}

// claim takes the next entry of w's own batch, without the lock. A batch
// found exhausted by a load costs no read-modify-write: thieves only move
// next forward. The claimed slot is cleared at once, so that a long call
// does not keep the messages consumed before it alive.
func (w *worker) claim() (entry, bool) {
	if int(w.next.Load()) >= w.n {
		return entry{}, false
	}
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
	copy(w.ats[:], victim.ats[start:end])
	clear(victim.batch[start:end])
	w.n = n
	w.next.Store(1)
	w.seq, w.off = victim.seq, victim.off+start
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

// givenBack is an entry taken back from a worker's batch, with its place in
// the order of buf.
type givenBack struct {
	seq uint64
	pos int
	stamped
}

// giveBackLocked takes back the entries that the workers ws took in batches
// and have not begun, as a thief would (their owners then find nothing more
// to claim), and puts them back at the head of buf in their order: a
// cancelled subscription's, or a paused queue's. It returns how many. q.mu is
// held.
func (q *queue) giveBackLocked(ws []*worker) int {
	var back []givenBack
	for _, w := range ws {
		left := w.n - int(w.next.Load())
		if left <= 0 {
			continue
		}
		end := int(w.next.Add(int32(left)))
		start := end - left
		end = min(end, w.n)
		for i := start; i < end; i++ {
			back = append(back, givenBack{seq: w.seq, pos: w.off + i, stamped: stamped{w.batch[i], w.ats[i]}})
		}
		clear(w.batch[start:max(start, end)])
	}
	slices.SortFunc(back, func(a, b givenBack) int {
		if a.seq != b.seq {
			if a.seq < b.seq {
				return -1
			}
			return 1
		}
		return a.pos - b.pos
	})
	for i := len(back) - 1; i >= 0; i-- {
		q.buf.pushFront(back[i].e, back[i].at)
	}
	return len(back)
}

// The fates of a timed consumer call ([WithDeliveryTimeout]), in
// timedCall.state: still running, returned before its deadline, or timed out
// with the slot kept (its worker waits for it) or given to a new goroutine
// (the call is abandoned).
const (
	callRunning int32 = iota
	callReturned
	callKept
	callReplaced
)

// timedCall is one consumer call under a delivery timeout. The worker's
// goroutine and the deadline's handler (timedOut, run by context.AfterFunc)
// race for it with one compare-and-swap on state: the worker settles the
// outcome if the call returned first, the handler fails the message with
// ErrDeliveryTimeout if the deadline came first. Only calls on a queue with
// a delivery timeout pay for it (a context with a timer, one AfterFunc and
// this struct); the others never reach processTimed.
type timedCall struct {
	state  atomic.Int32
	ran    chan struct{} // closed when the handler has finished with the call (settled it, or lost)
	stop   func() bool   // unregisters the handler
	cancel context.CancelFunc
	parent context.Context // the worker's context, for the goroutine that takes the slot
	w      *worker
	e      entry // a copy: the worker's own may be gone when the handler reads it
	m      *Msg
}

// processTimed is process with a deadline q.cfg.deliveryTimeout after the
// call begins, and returns the call's fate (see finish).
func (q *queue) processTimed(ctx context.Context, w *worker, e *entry, m *Msg, abandoned *bool) (int32, error) {
	// The consumer gets a Msg of its own: once its call is abandoned, the
	// handler settles m (a retry hands it to the scheduler, then to another
	// call) while the late call may still read and write its copy.
	cm := m
	if m != nil {
		cm = m.clone()
	}
	dctx, cancel := context.WithTimeout(ctx, q.cfg.deliveryTimeout)
	tc := &timedCall{ran: make(chan struct{}), cancel: cancel, parent: ctx, w: w, e: *e, m: m}
	tc.stop = context.AfterFunc(dctx, func() { q.timedOut(dctx, tc) })
	err := q.process(dctx, w.c, e, cm, tc, abandoned) // a Goexit calls finish in process
	late := dctx.Err() == context.DeadlineExceeded    // read before finish cancels dctx
	fate := tc.finish()
	if fate == callReturned && late {
		// It returned once its deadline had passed (an error such as
		// ctx.Err(), or nil), before the handler could claim the call: a
		// timeout too, whichever came first on the machine.
		q.c.timedOut.Add(1)
		if err == nil {
			err = fmt.Errorf("%w: the consumer returned after %v (queue %q)", ErrDeliveryTimeout, q.cfg.deliveryTimeout, q.name)
		} else {
			err = fmt.Errorf("%w: the consumer returned after %v (queue %q): %w", ErrDeliveryTimeout, q.cfg.deliveryTimeout, q.name, err)
		}
	}
	return fate, err
}

// finish ends the call on the worker's side and returns its fate:
// callReturned (the worker settles err), callKept (the handler settled the
// message; the worker goes on) or callReplaced (another goroutine runs the
// slot: this one must end). Past finish, the handler no longer touches the
// call, so the worker stays counted in its WaitGroup until then: that makes
// the handler's wg.Add safe.
func (tc *timedCall) finish() int32 {
	if tc.state.CompareAndSwap(callRunning, callReturned) {
		if !tc.stop() {
			<-tc.ran // the handler began (the deadline or the parent ended): it loses, and ends
		}
		tc.cancel()
		return callReturned
	}
	fate := tc.state.Load()
	if fate == callKept {
		// The handler's settle is still the worker's (its slot holds its
		// batch meanwhile, so a stopping MQ waits for the retry).
		<-tc.ran
	}
	tc.cancel()
	return fate
}

// timedOut is the deadline's handler of tc (context.AfterFunc runs it in a
// goroutine of its own when the call's context ends). When the deadline came
// before the call returned, it fails the message with an error wrapping
// [ErrDeliveryTimeout] (retry policy, then dead-lettering), and, while the
// subscription has fewer abandoned calls than workers, becomes the slot's
// new worker goroutine itself, so that the pool keeps its size; otherwise
// the slot waits for the late call. It is in the MQ's WaitGroup from its
// first line: the worker is still in it then (it waits in finish for ran).
func (q *queue) timedOut(dctx context.Context, tc *timedCall) {
	wg := &q.mq.wg
	wg.Add(1)
	if dctx.Err() != context.DeadlineExceeded { // the parent ended: Shutdown's abort, or the call returned
		close(tc.ran)
		wg.Done()
		return
	}
	s := tc.w.sub
	q.lock()
	fate := callKept
	if s.abandoned < s.n {
		fate = callReplaced
	}
	if !tc.state.CompareAndSwap(callRunning, fate) {
		q.mu.Unlock()
		close(tc.ran)
		wg.Done()
		return
	}
	if fate == callReplaced {
		// The late call's goroutine stays alive (in wg, and in s.alive) as
		// an abandoned one until its consumer returns: abandonedReturned.
		s.abandoned++
		s.alive++ // this goroutine, the slot's new one
		q.abandoned++
	}
	q.mu.Unlock()
	q.c.timedOut.Add(1)
	id := q.mq.own.Enter()
	m := tc.m
	if m == nil {
		m = tc.e.firstMsg(q.name)
	}
	q.settle(m, fmt.Errorf("%w: the consumer did not return within %v (queue %q)", ErrDeliveryTimeout, q.cfg.deliveryTimeout, q.name))
	q.mq.own.Leave(id)
	close(tc.ran)
	if fate == callReplaced {
		tc.w.run(tc.parent, wg) // its wg.Done is this goroutine's
		return
	}
	wg.Done()
}

// abandonedReturned ends the accounting of an abandoned call whose consumer
// finally returned (or called runtime.Goexit): its goroutine ends now.
func (q *queue) abandonedReturned(s *Subscription) {
	q.lock()
	s.abandoned--
	q.abandoned--
	if s.alive--; s.alive == 0 {
		close(s.done)
	}
	q.mu.Unlock()
}
