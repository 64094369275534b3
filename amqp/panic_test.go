package amqp_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// stringPanics is a panic value whose String panics.
type stringPanics struct{}

func (stringPanics) String() string { panic("String panics") }

// stringGoexits is a panic value whose String ends the calling goroutine.
type stringGoexits struct{}

func (stringGoexits) String() string { runtime.Goexit(); return "" }

// selfPanics is a panic value whose String panics with itself: fmt gives up
// on nested panics and panics again.
type selfPanics struct{}

func (selfPanics) String() string { panic(selfPanics{}) }

// failures is a log handler that keeps the err and stack of every record
// about a failed delivery.
type failures struct {
	mu      *sync.Mutex
	records *[]failure
}

type failure struct{ msg, err, stack string }

func newFailures() failures { return failures{mu: new(sync.Mutex), records: new([]failure)} }

func (f failures) Enabled(context.Context, slog.Level) bool { return true }
func (f failures) WithAttrs([]slog.Attr) slog.Handler       { return f }
func (f failures) WithGroup(string) slog.Handler            { return f }

func (f failures) Handle(_ context.Context, r slog.Record) error {
	var rec failure
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "err":
			rec.err = a.Value.String()
		case "stack":
			rec.stack = a.Value.String()
		}
		return true
	})
	if rec.err != "" {
		rec.msg = r.Message
		f.mu.Lock()
		*f.records = append(*f.records, rec)
		f.mu.Unlock()
	}
	return nil
}

// first waits for the first failure logged.
func (f failures) first(t *testing.T) failure {
	t.Helper()
	var got failure
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(*f.records) == 0 {
			return false
		}
		got = (*f.records)[0]
		return true
	}, 10*time.Second, 5*time.Millisecond, "no failure was logged")
	return got
}

// panicking runs one message that makes its consumer panic with value, then
// one that succeeds, on m, and returns what was logged about the failure.
func panicking(t *testing.T, m *tinymq.MQ, f failures, exchange, queue string, value any) failure {
	t.Helper()
	ok := make(chan struct{})
	require.NoError(t, m.RegisterQueue(exchange, tinymq.Fanout, tinymq.Handler(func(_ context.Context, s string) error {
		if s == "panic" {
			panic(value)
		}
		close(ok)
		return nil
	}), 1, tinymq.WithQueueName(queue), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(exchange, "panic"))
	require.NoError(t, m.Publish(exchange, "ok"))
	select {
	case <-ok:
	case <-time.After(10 * time.Second):
		t.Fatal("the queue stopped consuming after the panic")
	}
	got := f.first(t)
	require.Eventually(t, func() bool {
		st := m.Stats().Queues[queue]
		return st.Failed == 1 && st.Succeeded == 1 && st.Dropped == 1 && st.InFlight == 0
	}, 10*time.Second, 5*time.Millisecond, "%+v", m.Stats().Queues[queue])
	stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, m.Shutdown(stop))
	return got
}

// A consumer that panics with a value whose methods are hostile (its String
// panics, calls runtime.Goexit, or panics beyond fmt's recover) fails that
// delivery only: the worker goes on, nothing leaks (TestMain's goleak), and
// the failure is logged with the same err text as the core logs, and with
// the panic's stack, since both engines freeze a panic the same way.
func TestHostilePanicValuesAreReportedAsTheCoreReportsThem(t *testing.T) {
	b := broker(t)
	for name, value := range map[string]any{
		"String panics":        stringPanics{},
		"String calls Goexit":  stringGoexits{},
		"String panics itself": selfPanics{},
	} {
		t.Run(name, func(t *testing.T) {
			n := uniq(t)
			core := newFailures()
			want := panicking(t, tinymq.New(tinymq.WithLogger(slog.New(core))), core, "ex", "q", value)

			logged := newFailures()
			m := tinymq.New(amqp.Engine(b.URL(), amqp.WithReconnectBackoff(20*time.Millisecond, 500*time.Millisecond)),
				tinymq.WithLogger(slog.New(logged)))
			t.Cleanup(m.Stop)
			got := panicking(t, m, logged, n("ex"), n("q"), value)

			assert.Equal(t, want.err, got.err, "the engines report the panic differently")
			assert.NotEmpty(t, want.stack, "the core logs the panic's stack")
			assert.Contains(t, got.stack, "panic_test.go", "the panic's stack, taken where it was recovered")
			t.Logf("core: %q: %q", want.msg, want.err)
		})
	}
}
