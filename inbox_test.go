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

// orderSeq is a message of TestOneWorkerKeepsPublishOrderAcrossInboxAndBuffer:
// its place in the publisher's sequence.
type orderSeq struct{ N int }

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

// A queue's one worker delivers in publish order whichever way each message
// came in: plain publishes through the inbox without the queue's lock (a
// burst larger than the inbox moves it into the buffer under the lock), and
// publishes with their own TTL under the lock into the buffer, which moves
// the inbox first, while the worker takes from the buffer before the inbox
// (see take). Meanwhile the consumer blocks now and then, and another
// goroutine calls Stats, Peek, Pause and Resume, which move the inbox too
// and give the worker's batch back.
func TestOneWorkerKeepsPublishOrderAcrossInboxAndBuffer(t *testing.T) {
	for rep := range 4 {
		t.Run(fmt.Sprint(rep), func(t *testing.T) {
			m := tinymq.New(quiet())
			var mu sync.Mutex
			last := -1
			var bad []string
			got := 0
			done := make(chan struct{})
			const total = 3000
			gate := make(chan struct{}, 1)
			err := m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
				n := msg.Data.(*orderSeq).N
				if n%97 == 0 {
					select { // block a little, until the meddler says go (bounded)
					case <-gate:
					case <-time.After(50 * time.Millisecond):
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if n <= last {
					bad = append(bad, fmt.Sprintf("%d after %d", n, last))
				}
				last = n
				got++
				if got == total {
					close(done)
				}
				return nil
			}, 1, tinymq.WithQueueName("q"))
			if err != nil {
				t.Fatal(err)
			}
			// Some published before Start.
			n := 0
			for ; n < 50; n++ {
				if err := m.Publish("ev", &orderSeq{n}); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer m.Stop()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(rep), 1))
				for {
					select {
					case <-stop:
						return
					default:
					}
					switch r.IntN(6) {
					case 0:
						_ = m.Stats()
					case 1:
						_, _ = m.Peek("q", 1+r.IntN(40))
					case 2:
						_ = m.PauseQueue("q")
						for range r.IntN(50) {
							runtime.Gosched()
						}
						_ = m.ResumeQueue("q")
					case 3:
						select {
						case gate <- struct{}{}:
						default:
						}
					default:
						runtime.Gosched()
					}
				}
			})
			r := rand.New(rand.NewPCG(uint64(rep), 2))
			for n < total {
				burst := 1 + r.IntN(100)
				for i := 0; i < burst && n < total; i++ {
					var err error
					if r.IntN(10) == 0 {
						err = m.Publish("ev", &orderSeq{n}, tinymq.WithExpiration(time.Hour))
					} else {
						err = m.Publish("ev", &orderSeq{n})
					}
					if err != nil {
						t.Fatal(err)
					}
					n++
				}
				for range r.IntN(200) {
					runtime.Gosched()
				}
			}
			select {
			case <-done:
			case <-time.After(wait):
				mu.Lock()
				t.Errorf("got %d of %d; stats %+v", got, total, m.Stats().Queues["q"])
				mu.Unlock()
			}
			close(stop)
			wg.Wait()
			mu.Lock()
			if len(bad) > 0 {
				t.Errorf("out of order (%d): %v", len(bad), bad[:min(len(bad), 10)])
			}
			mu.Unlock()
		})
	}
}
