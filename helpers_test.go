package tinymq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// An MQ without WithLogger logs its warnings to slog.Default: most tests
	// provoke failures on purpose, and the tests of the default logger set
	// their own.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	if os.Getenv(scenarioEnv) != "" || os.Getenv(crashEnv) != "" {
		// A child process of TestReentrancy: its scenario may strand a
		// goroutine on purpose (a logger that blocks forever).
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

// wait is the bound on every wait for something that should happen promptly.
const wait = 10 * time.Second

// recv receives n values from ch, failing the test if they do not all arrive in time.
func recv[T any](t *testing.T, ch <-chan T, n int) []T {
	t.Helper()
	out := make([]T, 0, n)
	timeout := time.After(wait)
	for len(out) < n {
		select {
		case v := <-ch:
			out = append(out, v)
		case <-timeout:
			t.Fatalf("received %d of %d values before the timeout", len(out), n)
		}
	}
	return out
}

// closedWithin fails the test unless ch is closed (or sends) within the bound.
func closedWithin(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("%s did not happen in time", what)
	}
}

// sink is a consumer that sends every message it gets to a channel.
func sink(ch chan<- *tinymq.Msg) tinymq.ConsumerFunc {
	return func(_ context.Context, m *tinymq.Msg) error {
		ch <- m
		return nil
	}
}

// started returns a running MQ that the test stops when it ends.
func started(t *testing.T, opts ...tinymq.Option) *tinymq.MQ {
	t.Helper()
	m := tinymq.New(opts...)
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(m.Stop)
	return m
}

// counter records how often each message ID reached each queue.
type counter struct {
	mu   sync.Mutex
	seen map[string]map[uint64]int
}

func newCounter() *counter { return &counter{seen: make(map[string]map[uint64]int)} }

func (c *counter) consume(_ context.Context, m *tinymq.Msg) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[m.Queue] == nil {
		c.seen[m.Queue] = make(map[uint64]int)
	}
	c.seen[m.Queue][m.ID]++
	return nil
}

// logRecords returns a logger writing JSON to a buffer, and a function that
// parses what was logged.
func logRecords() (*slog.Logger, func(t *testing.T) []map[string]any) {
	var mu sync.Mutex
	var buf bytes.Buffer
	h := slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, nil)
	return slog.New(h), func(t *testing.T) []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		var out []map[string]any
		dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
		for dec.More() {
			var rec map[string]any
			require.NoError(t, dec.Decode(&rec))
			out = append(out, rec)
		}
		return out
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// deadLetters registers a fanout exchange "dlx" with one queue collecting
// everything dead-lettered into it.
func deadLetters(t *testing.T, m *tinymq.MQ) <-chan *tinymq.Msg {
	t.Helper()
	ch := make(chan *tinymq.Msg, 1000)
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(ch), 1, tinymq.WithQueueName("dead")))
	return ch
}

// formCall is what a consumer form saw of one delivery. Attempt is 0 and the
// metadata empty for the forms that do not see it.
type formCall struct {
	N           int
	ID          uint64
	Exchange    string
	Queue       string
	RoutingKey  string
	Attempt     int
	Redelivered bool
	Headers     map[string]any
	Deaths      []tinymq.Death
}

// consumerForm is one way to register a consumer of *numbered.
type consumerForm struct {
	name     string
	meta     bool
	register func(m *tinymq.MQ, ex string, kind tinymq.ExchangeType, fn func(context.Context, formCall) error, conc int, opts ...tinymq.QueueOption) error
}

// numberOf extracts N from a *numbered or an Encoded numbered.
func numberOf(data any) (int, bool) {
	switch d := data.(type) {
	case *numbered:
		if d == nil {
			return -1, true
		}
		return d.N, true
	case tinymq.Encoded:
		var p numbered
		if d.Decode(&p) != nil {
			return 0, false
		}
		return p.N, true
	}
	return 0, false
}

func numberOfPtr(p *numbered) int {
	if p == nil {
		return -1
	}
	return p.N
}

func consumerForms() []consumerForm {
	return []consumerForm{
		{name: "RegisterQueue", meta: true, register: func(m *tinymq.MQ, ex string, kind tinymq.ExchangeType, fn func(context.Context, formCall) error, conc int, opts ...tinymq.QueueOption) error {
			return m.RegisterQueue(ex, kind, func(ctx context.Context, msg *tinymq.Msg) error {
				n, ok := numberOf(msg.Data)
				if !ok {
					return tinymq.Permanent(fmt.Errorf("%w: %T", tinymq.ErrPayloadType, msg.Data))
				}
				return fn(ctx, formCall{N: n, ID: msg.ID, Exchange: msg.Exchange, Queue: msg.Queue, RoutingKey: msg.RoutingKey,
					Attempt: msg.Attempt, Redelivered: msg.Redelivered, Headers: msg.Headers, Deaths: msg.Deaths})
			}, conc, opts...)
		}},
		{name: "Handler", register: func(m *tinymq.MQ, ex string, kind tinymq.ExchangeType, fn func(context.Context, formCall) error, conc int, opts ...tinymq.QueueOption) error {
			return m.RegisterQueue(ex, kind, tinymq.Handler(func(ctx context.Context, p *numbered) error {
				return fn(ctx, formCall{N: numberOfPtr(p)})
			}), conc, opts...)
		}},
		{name: "RegisterHandler", register: func(m *tinymq.MQ, ex string, kind tinymq.ExchangeType, fn func(context.Context, formCall) error, conc int, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterHandler(m, ex, kind, func(ctx context.Context, p *numbered) error {
				return fn(ctx, formCall{N: numberOfPtr(p)})
			}, conc, opts...)
		}},
		{name: "RegisterDeliveryHandler", meta: true, register: func(m *tinymq.MQ, ex string, kind tinymq.ExchangeType, fn func(context.Context, formCall) error, conc int, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterDeliveryHandler(m, ex, kind, func(ctx context.Context, d tinymq.Delivery[*numbered]) error {
				return fn(ctx, formCall{N: numberOfPtr(d.Data), ID: d.ID, Exchange: d.Exchange, Queue: d.Queue, RoutingKey: d.RoutingKey,
					Attempt: d.Attempt, Redelivered: d.Redelivered, Headers: d.Headers, Deaths: d.Deaths})
			}, conc, opts...)
		}},
	}
}

// barrier lets through its callers once need of them are inside at once.
type barrier struct {
	mu   sync.Mutex
	n    int
	need int
	all  chan struct{}
	out  chan error
}

func newBarrier(need int) *barrier {
	return &barrier{need: need, all: make(chan struct{}), out: make(chan error, 64)}
}

// arrive waits (at most 5s) for need callers to be inside at once, and
// reports the outcome on out.
func (b *barrier) arrive(ctx context.Context) error {
	b.mu.Lock()
	b.n++
	if b.n == b.need {
		close(b.all)
	}
	n := b.n
	b.mu.Unlock()
	var err error
	select {
	case <-b.all:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(5 * time.Second):
		err = fmt.Errorf("arrival %d of %d: alone after 5s, the others never ran side by side", n, b.need)
	}
	b.out <- err
	return err
}

// expectBarrier waits for need outcomes of b and fails on any error,
// logging the queue's Stats as the first error arrives.
func expectBarrier(t *testing.T, b *barrier, m *tinymq.MQ, queue string) {
	t.Helper()
	logged := false
	for range b.need {
		err := recv(t, b.out, 1)[0]
		if err != nil && !logged && m != nil {
			logged = true
			s := m.Stats().Queues[queue]
			t.Logf("when a barrier consumer gave up: Depth %d Ready %d Scheduled %d InFlight %d Delivered %d Succeeded %d",
				s.Depth, s.Ready, s.Scheduled, s.InFlight, s.Delivered, s.Succeeded)
		}
		assert.NoError(t, err)
	}
}

// callCounts counts calls per payload N.
type callCounts struct {
	mu sync.Mutex
	n  map[int]int
}

func (c *callCounts) inc(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = make(map[int]int)
	}
	c.n[n]++
	return c.n[n]
}

// assertLedger checks that every accepted message of a stopped queue ended once.
func assertLedger(t *testing.T, name string, s tinymq.QueueStats) {
	t.Helper()
	assert.Zero(t, s.Depth, "%s: Depth after stop", name)
	assert.Zero(t, s.InFlight, "%s: InFlight after stop", name)
	assert.Equal(t, s.Accepted, s.Succeeded+s.DeadLettered+s.Dropped+s.Undelivered+s.Purged+s.Removed+s.Replayed,
		"%s: Accepted != Succeeded+DeadLettered+Dropped+Undelivered+Purged+Removed+Replayed (%+v)", name, s)
	assert.Equal(t, s.Delivered, s.Succeeded+s.Failed, "%s: Delivered != Succeeded+Failed (%+v)", name, s)
}

// publishAll publishes payloads 0 to pubs*per-1 to "ev" from pubs
// goroutines, per each, and returns once all are done.
func publishAll(t *testing.T, m *tinymq.MQ, pubs, per int) {
	t.Helper()
	var wg sync.WaitGroup
	for p := range pubs {
		wg.Go(func() {
			for i := range per {
				if err := m.Publish("ev", &numbered{N: p*per + i}); err != nil {
					t.Errorf("Publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// flaky is a consumer that always fails payloads divisible by 5, panics on
// the first delivery of those divisible by 7, calls runtime.Goexit on the
// first of those divisible by 11 and, with typedNil, returns a typed nil on
// the first of those divisible by 13; every other delivery succeeds and
// counts in ok.
func flaky(ok *atomic.Int64, typedNil bool) func(context.Context, formCall) error {
	var calls callCounts
	return func(_ context.Context, c formCall) error {
		k := calls.inc(c.N)
		switch {
		case c.N%5 == 0:
			return errors.New("always")
		case c.N%7 == 0 && k == 1:
			panic("once")
		case c.N%11 == 0 && k == 1:
			runtime.Goexit()
		case typedNil && c.N%13 == 0 && k == 1:
			var e *nilErr
			return e
		}
		ok.Add(1)
		return nil
	}
}

// settleWait bounds the waits of tests that are expected to settle quickly, so
// that a failure does not cost the full wait.
const settleWait = 3 * time.Second

// quiet is WithLogger(discardLogger), for tests that provoke logged losses on purpose.
func quiet() tinymq.Option {
	return tinymq.WithLogger(discardLogger)
}

// waitSettled waits until the queue's failed deliveries are all accounted for
// (retried, dead-lettered or dropped) and reports its stats.
func waitSettled(t *testing.T, m *tinymq.MQ, queue string, failed uint64) tinymq.QueueStats {
	t.Helper()
	var st tinymq.QueueStats
	ok := assert.Eventually(t, func() bool {
		st = m.Stats().Queues[queue]
		return st.Failed >= failed && st.Failed == st.Retried+st.DeadLettered+st.Dropped+st.Undelivered && st.InFlight == 0
	}, settleWait, time.Millisecond)
	if !ok {
		t.Logf("queue %s never settled: %+v", queue, st)
	}
	return st
}

// waitDrained waits until queue has nothing waiting and nothing in a consumer.
func waitDrained(t *testing.T, m *tinymq.MQ, queue string) {
	t.Helper()
	require.Eventually(t, func() bool {
		st := m.Stats().Queues[queue]
		return st.Depth == 0 && st.InFlight == 0
	}, wait, time.Millisecond)
}

// discardLogger drops everything, such as the undelivered count that a Stop
// before Start logs.
var discardLogger = slog.New(slog.DiscardHandler)

// numbered is the payload of the handler tests. A *numbered boxes into an
// interface without allocating, so Publish of one allocates nothing.
type numbered struct{ N int }

// deadAfterRetries publishes one message to a queue "q" (3 attempts, 1 ms
// apart, dead-lettered to "dlx") whose consumer returns or panics with what
// fail does, and returns the running MQ (stopped when the test ends) and
// the message's dead letter.
func deadAfterRetries(t *testing.T, fail func() error) (*tinymq.MQ, *tinymq.Msg) {
	t.Helper()
	m := tinymq.New(quiet())
	dead := deadLetters(t, m)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return fail()
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { stopWithin(t, m) })
	require.NoError(t, m.Publish("ev", 1))
	return m, recv(t, dead, 1)[0]
}
