package tinymq_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// inboxStamp is a message of TestPlainPublishesReachParkedWorkers: which
// publisher sent it, and its place in that publisher's sequence.
type inboxStamp struct{ pub, seq int }

// TestPlainPublishesReachParkedWorkers is the stress test of the parking
// protocol of plain publishes, which reach a queue without its lock (see
// inbox.go): rounds of bursts from 1-3 publishers to 1-3 queues with 1-4
// workers, each burst sent once the last one was consumed, so that the
// workers park between bursts and race the next burst's first messages;
// bursts of up to 3 inboxes' worth, so that full inboxes fall back to the
// lock; a goroutine that polls Stats (which moves inboxes) and toggles a
// pause meanwhile. Every message must arrive, once, within 5 s (a lost wake
// leaves a burst undelivered while a worker sleeps), and with one worker in
// each publisher's order.
func TestPlainPublishesReachParkedWorkers(t *testing.T) {
	rounds := 300
	if raceEnabled {
		rounds = 60
	}
	// Parks wait a moment between finding nothing and counting the worker
	// idle: a publish in that window must still reach it.
	defer tinymq.SetParkHook(func() {
		for range 1 + rand.IntN(3) {
			runtime.Gosched()
		}
	})()
	for _, pubs := range []int{1, 3} {
		for _, queues := range []int{1, 3} {
			for _, workers := range []int{1, 2, 4} {
				for _, meddle := range []bool{false, true} {
					name := fmt.Sprintf("pubs=%d/queues=%d/workers=%d/meddle=%v", pubs, queues, workers, meddle)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						plainPublishRounds(t, pubs, queues, workers, meddle, rounds)
					})
				}
			}
		}
	}
}

func plainPublishRounds(t *testing.T, pubs, queues, workers int, meddle bool, rounds int) {
	m := tinymq.New()
	type seen struct {
		mu   sync.Mutex
		got  map[inboxStamp]bool
		last []int // per publisher, the last seq delivered (one worker)
		bad  []string
	}
	var delivered atomic.Int64
	all := make([]*seen, queues)
	for i := range queues {
		s := &seen{got: map[inboxStamp]bool{}, last: make([]int, pubs)}
		for p := range s.last {
			s.last[p] = -1
		}
		all[i] = s
		require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *inboxStamp) error {
			s.mu.Lock()
			if s.got[*v] {
				s.bad = append(s.bad, fmt.Sprintf("%v twice", *v))
			}
			s.got[*v] = true
			if workers == 1 {
				if v.seq != s.last[v.pub]+1 {
					s.bad = append(s.bad, fmt.Sprintf("publisher %d: %d after %d", v.pub, v.seq, s.last[v.pub]))
				}
				s.last[v.pub] = v.seq
			}
			s.mu.Unlock()
			delivered.Add(1)
			return nil
		}, workers, tinymq.WithQueueName(fmt.Sprintf("q%d", i))))
	}
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)

	stop := make(chan struct{})
	var meddler sync.WaitGroup
	if meddle {
		meddler.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = m.Stats()
				q := fmt.Sprintf("q%d", rand.IntN(queues))
				if rand.IntN(8) == 0 {
					if err := m.PauseQueue(q); err != nil {
						t.Errorf("PauseQueue: %v", err)
					}
					runtime.Gosched()
					if err := m.ResumeQueue(q); err != nil {
						t.Errorf("ResumeQueue: %v", err)
					}
				}
				runtime.Gosched()
			}
		})
	}
	defer func() {
		close(stop)
		meddler.Wait()
	}()

	next := make([]int, pubs)
	sent := 0
	for round := range rounds {
		var wg sync.WaitGroup
		for p := range pubs {
			n := 1 + rand.IntN(96)
			if rand.IntN(2) == 0 {
				// A lost wake shows only on a burst's last message
				// (the next publish would see the worker idle and
				// wake it): short bursts make many last messages.
				n = 2
			}
			first := next[p]
			next[p] += n
			sent += n * queues
			wg.Go(func() {
				for k := range n {
					if err := m.Publish("ev", &inboxStamp{pub: p, seq: first + k}); err != nil {
						t.Errorf("Publish: %v", err)
						return
					}
					if rand.IntN(16) == 0 {
						runtime.Gosched()
					}
				}
			})
		}
		wg.Wait()
		deadline := time.Now().Add(5 * time.Second)
		for delivered.Load() < int64(sent) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d of %d messages delivered after 5 s; stats: %+v", round, delivered.Load(), sent, m.Stats().Queues)
			}
			runtime.Gosched()
		}
	}
	for i, s := range all {
		s.mu.Lock()
		require.Empty(t, s.bad, "queue q%d", i)
		want := 0
		for p := range pubs {
			want += next[p]
		}
		require.Len(t, s.got, want, "queue q%d", i)
		s.mu.Unlock()
	}
	require.Equal(t, int64(sent), delivered.Load(), "no message delivered twice")
}

// A plain publish reaches a queue without its lock, so it can land while
// the queue's only worker, having found nothing, is on its way to park: the
// worker must see it before it parks (see acceptPlain and take). The park
// hook publishes in exactly that window, once: the message must arrive.
func TestAPublishWhileTheWorkerParksReachesIt(t *testing.T) {
	m := tinymq.New()
	got := make(chan int, 2)
	var armed atomic.Bool
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *inboxStamp) error {
		if v.seq == 1 {
			// Armed only now: the worker may still be on its way to its
			// first park when 1 is published, and 2 must come after 1.
			armed.Store(true)
		}
		got <- v.seq
		return nil
	}, 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	published := make(chan error, 1)
	defer tinymq.SetParkHook(func() {
		if armed.CompareAndSwap(true, false) {
			// The worker holds the queue's lock and is not idle yet: the
			// publish takes neither (it would wait for the lock only to
			// wake an idle worker).
			published <- m.Publish("ev", &inboxStamp{seq: 2})
		}
	})()
	// 1 reaches the worker, which arms the hook; once it handled 1 it
	// finds nothing and heads for the park, where the hook publishes 2.
	require.NoError(t, m.Publish("ev", &inboxStamp{seq: 1}))
	for want := 1; want <= 2; want++ {
		select {
		case seq := <-got:
			require.Equal(t, want, seq)
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d not delivered after 5 s: %+v", want, m.Stats().Queues["q"])
		}
	}
	require.NoError(t, <-published)
}
