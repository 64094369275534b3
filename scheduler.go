package tinymq

import (
	"container/heap"
	"sync"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
)

// scheduler holds the messages that wait for a delay or a retry backoff, and
// moves each into its queue when due; it also wakes queues whose head message
// expires (an item with no message). One goroutine, run, owns the timer; it
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
	m   *Msg // nil: check q's head for expiry
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

// add schedules m to move into q at due, or, with a nil m, q's head to be
// checked for expiry at due. The caller has counted m in q.scheduled.
func (s *scheduler) add(due time.Time, q *queue, m *Msg) {
	s.mu.Lock()
	first := len(s.items) == 0 || due.Before(s.items[0].due)
	heap.Push(&s.items, schedItem{due: due, q: q, m: m})
	s.mu.Unlock()
	if first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// dropQueue forgets every item of q, which Shutdown's deadline aborted.
func (s *scheduler) dropQueue(q *queue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.items[:0]
	for _, it := range s.items {
		if it.q != q {
			kept = append(kept, it)
		}
	}
	clear(s.items[len(kept):])
	s.items = kept
	heap.Init(&s.items)
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
			if it.m == nil {
				it.q.expireHead()
			} else {
				it.q.release(it.m)
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
