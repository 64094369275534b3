package durabletest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

const bound = 15 * time.Second

// got is what a consumer saw: one entry per delivery.
type got struct {
	N           int
	ID          uint64
	Queue       string
	RoutingKey  string
	Headers     map[string]any
	Deaths      []tinymq.Death
	Attempt     int
	Redelivered bool
	At          time.Time
}

type recorder struct {
	mu   sync.Mutex
	all  []got
	want int
	done chan struct{}
	fail func(n int, attempt int) error // nil: succeed
	mq   *tinymq.MQ                     // if set, waitAll logs its Stats when it times out
}

func newRecorder(want int) *recorder {
	r := &recorder{want: want, done: make(chan struct{})}
	if want == 0 {
		close(r.done)
	}
	return r
}

func decodeInt(t testing.TB, d any) int {
	if n, ok := d.(int); ok {
		return n
	}
	e, ok := d.(tinymq.Encoded)
	if !ok {
		panic(fmt.Sprintf("Data is %T, not Encoded", d))
	}
	var n int
	if err := e.Decode(&n); err != nil {
		panic(err)
	}
	return n
}

func (r *recorder) consumer(t testing.TB) tinymq.ConsumerFunc {
	return func(_ context.Context, m *tinymq.Msg) error {
		n := decodeInt(t, m.Data)
		r.mu.Lock()
		r.all = append(r.all, got{N: n, ID: m.ID, Queue: m.Queue, RoutingKey: m.RoutingKey, Headers: m.Headers,
			Deaths: m.Deaths, Attempt: m.Attempt, Redelivered: m.Redelivered, At: time.Now()})
		k := len(r.all)
		r.mu.Unlock()
		if k == r.want {
			close(r.done)
		}
		if r.fail != nil {
			return r.fail(n, m.Attempt)
		}
		return nil
	}
}

func (r *recorder) snapshot() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.all...)
}

func (r *recorder) ns() []int {
	var out []int
	for _, g := range r.snapshot() {
		out = append(out, g.N)
	}
	return out
}

func (r *recorder) waitAll(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(bound):
		// Every goroutine's stack, for the stall's cause (the MQ's workers,
		// its scheduler, the log's writer) in CI's log.
		buf := make([]byte, 1<<20)
		t.Logf("goroutines at the timeout:\n%s", buf[:runtime.Stack(buf, true)])
		if r.mq != nil {
			for name, q := range r.mq.Stats().Queues {
				t.Logf("queue %s at the timeout: %+v", name, q)
			}
		}
		t.Fatalf("only %d of %d deliveries arrived", len(r.snapshot()), r.want)
	}
}

// blocker holds each message until the consumers' context ends.
func blocker(ctx context.Context, _ *tinymq.Msg) error {
	<-ctx.Done()
	return ctx.Err()
}

func stopWithin(t *testing.T, m *tinymq.MQ) {
	t.Helper()
	done := make(chan struct{})
	go func() { m.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("Stop did not return within %v", bound)
	}
}

// shutdownShort ends m with a short deadline, leaving what was not done in the
// log, then waits for its workers.
func shutdownShort(t *testing.T, m *tinymq.MQ, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	err := m.Shutdown(ctx)
	stopWithin(t, m)
	return err
}

func checkLedger(t *testing.T, m *tinymq.MQ, queues ...string) {
	t.Helper()
	st := m.Stats()
	for _, q := range queues {
		s, ok := st.Queues[q]
		require.True(t, ok, "queue %s in Stats", q)
		sum := s.Succeeded + s.DeadLettered + s.Dropped + s.Undelivered
		if s.Accepted != sum {
			t.Errorf("ledger of %s: Accepted %d != Succeeded %d + DeadLettered %d + Dropped %d + Undelivered %d (=%d)",
				q, s.Accepted, s.Succeeded, s.DeadLettered, s.Dropped, s.Undelivered, sum)
		}
		if s.Depth != 0 || s.InFlight != 0 {
			t.Errorf("%s not idle after stop: depth %d inflight %d", q, s.Depth, s.InFlight)
		}
	}
}

func seq(a, b int) []int {
	var out []int
	for i := a; i < b; i++ {
		out = append(out, i)
	}
	return out
}

func sorted(x []int) []int {
	y := append([]int(nil), x...)
	sort.Ints(y)
	return y
}

func isStopped(err error) bool { return errors.Is(err, tinymq.ErrStopped) }
