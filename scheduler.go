package tinymq

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
)

// scheduler holds the messages that wait for a delay or a retry backoff, and
// moves each into its queue when due; it also wakes queues whose head message
// expires (an item with no message), and rate-limited queues whose next token
// is due (rate). One goroutine, run, owns the timer; it
// is started by Start and joined by Stop. Its lock is never held with a
// queue's: run releases it before it calls into a queue, and queues call add
// after releasing theirs. run also keeps the coarse clock that stamps what
// enters a queue (see stamp).
type scheduler struct {
	mu    sync.Mutex
	items schedHeap
	wake  chan struct{} // a new earliest item: re-arm the timer; or the clock restarted

	// clock is a coarse wall clock, in UnixNano: clockOff while run is not
	// running (before Start, after Stop), 0 while it does not tick, else
	// the time of its last tick. Enqueues read it (an atomic load of a
	// line that changes every clockTick), where time.Now would cost more
	// than the rest of the hand-off. It has a cache line of its own.
	_     [64]byte
	clock atomic.Int64
	_     [56]byte
}

const (
	// clockOff marks the clock of a scheduler that does not run: stamp reads
	// the time itself.
	clockOff = -1
	// clockTick is how often run refreshes the clock while it ticks: a
	// stamp is at most about this much (and the scheduling delay of run)
	// earlier than the truth, never later.
	clockTick = 10 * time.Millisecond
	// clockRun is how long the clock ticks once a stamp started it; the
	// first stamp after that starts it again, so that an idle MQ does not
	// wake every clockTick.
	clockRun = time.Second
)

type schedItem struct {
	due time.Time
	q   *queue
	m   *Msg // nil: check q's head for expiry, or (expire) q itself
	// gen is q.gen when m was counted in q.scheduled: a purge or a delete
	// since took it (see queue.release).
	gen    uint32
	expire bool // check whether q has been unused for its WithQueueExpiry
	rate   bool // q's next WithRateLimit token is due: wake a worker
}

type schedHeap []schedItem

func (h schedHeap) Len() int           { return len(h) }
func (h schedHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h schedHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *schedHeap) Push(x any)        { *h = append(*h, x.(schedItem)) }
func (h *schedHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = schedItem{}
	*h = old[:len(old)-1]
	return it
}

func newScheduler() *scheduler {
	s := &scheduler{wake: make(chan struct{}, 1)}
	s.clock.Store(clockOff)
	return s
}

// stamp returns the time, in UnixNano, at which an entry enters a queue (see
// QueueStats.OldestAge): the coarse clock while it ticks, else the time
// itself, and then the clock starts ticking again (when run runs). While
// run does not run (the clock is off) it is the time rounded down to a
// clockTick, an error no greater than the ticking clock's, so that the
// entries stamped within one tick share a run of stamps (see chunk) there
// too.
func (s *scheduler) stamp() int64 {
	t := s.clock.Load()
	if t > 0 {
		return t
	}
	now := time.Now().UnixNano()
	if t == clockOff {
		return now - now%int64(clockTick)
	}
	if s.clock.CompareAndSwap(0, now) {
		s.poke()
	}
	return now
}

// poke wakes run without blocking.
func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// add schedules it: its message to move into its queue at its due time
// (the caller has counted it in q.scheduled), or, with no message, the
// queue's head to be checked for expiry, or the queue itself (expire).
func (s *scheduler) add(it schedItem) {
	s.mu.Lock()
	first := len(s.items) == 0 || it.due.Before(s.items[0].due)
	heap.Push(&s.items, it)
	s.mu.Unlock()
	if first {
		s.poke()
	}
}

// remove forgets the item of message m in q, and reports whether it was
// there: neither due and taken by run nor dropped by dropQueue or
// dropPurged.
func (s *scheduler) remove(q *queue, m *Msg) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, it := range s.items {
		if it.q == q && it.m == m {
			heap.Remove(&s.items, i)
			return true
		}
	}
	return false
}

// dropQueue forgets every item of q, which Shutdown's deadline aborted or
// a delete removed. It returns the items it dropped.
func (s *scheduler) dropQueue(q *queue) []schedItem {
	return s.drop(func(it *schedItem) bool { return it.q == q })
}

// dropPurged forgets the messages of q that a purge counted: those
// scheduled before it moved q.gen to gen. A message scheduled since (a
// consumer's retry, a delayed publish) was not counted by it and stays,
// or it would be counted in q.scheduled with nothing left to release it.
// It returns the items it dropped.
func (s *scheduler) dropPurged(q *queue, gen uint32) []schedItem {
	return s.drop(func(it *schedItem) bool {
		return it.q == q && it.m != nil && int32(it.gen-gen) < 0
	})
}

// drop forgets the items for which match is true, and returns them.
func (s *scheduler) drop(match func(*schedItem) bool) (dropped []schedItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.items[:0]
	for i := range s.items {
		if match(&s.items[i]) {
			dropped = append(dropped, s.items[i])
		} else {
			kept = append(kept, s.items[i])
		}
	}
	clear(s.items[len(kept):])
	s.items = kept
	heap.Init(&s.items)
	return dropped
}

// run releases due messages until quit is closed.
func (s *scheduler) run(quit <-chan struct{}, wg *sync.WaitGroup, own *guard.Owned) {
	id := own.Enter()
	defer func() {
		s.clock.Store(clockOff)
		own.Leave(id)
		wg.Done()
	}()
	s.clock.Store(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []schedItem
	var ticking time.Time // when the clock started ticking; zero: it does not
	for {
		s.mu.Lock()
		now := time.Now()
		for len(s.items) > 0 && !s.items[0].due.After(now) {
			due = append(due, heap.Pop(&s.items).(schedItem))
		}
		wait := time.Duration(-1)
		if len(s.items) > 0 {
			wait = s.items[0].due.Sub(now)
		}
		s.mu.Unlock()
		if s.clock.Load() > 0 { // ticking, or a stamp started it
			if ticking.IsZero() {
				ticking = now
			}
			if now.Sub(ticking) >= clockRun {
				// Stop; a stamp that read the last tick is at most a
				// tick old, and the next stamp starts the clock again.
				s.clock.Store(0)
				ticking = time.Time{}
			} else {
				s.clock.Store(now.UnixNano())
				if wait < 0 || wait > clockTick {
					wait = clockTick
				}
			}
		}
		for i, it := range due {
			switch {
			case it.expire:
				it.q.mq.expireQueue(it.q)
			case it.rate:
				it.q.rateWake()
			case it.m == nil:
				it.q.expireHead()
			default:
				it.q.release(it.m, it.gen)
			}
			due[i] = schedItem{}
		}
		due = due[:0]
		if wait >= 0 {
			timer.Reset(wait)
		} else {
			timer.Stop()
		}
		select {
		case <-timer.C:
		case <-s.wake:
		case <-quit:
			return
		}
	}
}
