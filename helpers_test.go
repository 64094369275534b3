package tinymq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
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
