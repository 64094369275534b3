package tinymq

import (
	"container/heap"
	"sync"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
)

// scheduler holds the messages that wait for a delay or a retry backoff, and
// moves each into its queue when due; it also wakes queues whose head message
// expires (an item with no message), and rate-limited queues whose next token
// is due (rate). One goroutine, run, owns the timer; it
// is started by Start and joined by Stop. Its lock is never held with a
// queue's: run releases it before it calls into a queue, and queues call add
// after releasing theirs.
type scheduler struct {
	mu    sync.Mutex
	items schedHeap
	wake  chan struct{} // a new earliest item: re-arm the timer
}

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
	return &scheduler{wake: make(chan struct{}, 1)}
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
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// dropQueue forgets every item of q, which Shutdown's deadline aborted or
// a delete removed, or (msgs) only its messages, which a purge removed.
//
// It returns the items it dropped.
func (s *scheduler) dropQueue(q *queue, msgs bool) (dropped []schedItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.items[:0]
	for _, it := range s.items {
		if it.q != q || (msgs && it.m == nil) {
			kept = append(kept, it)
		} else {
			dropped = append(dropped, it)
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
		own.Leave(id)
		wg.Done()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []schedItem
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
