package hostile24_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// logRec records every log line the MQ writes.
type logRec struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRec) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRec) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String())
	b.WriteString(" ")
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" ")
		b.WriteString(a.Key)
		b.WriteString("=")
		b.WriteString(a.Value.String())
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logRec) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRec) WithGroup(string) slog.Handler      { return l }
func (l *logRec) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}
func (l *logRec) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func newLog() (*logRec, tinymq.Option) {
	l := &logRec{}
	return l, tinymq.WithLogger(slog.New(l))
}

// eventually polls cond for up to 10s of real time (outside synctest).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func qs(m *tinymq.MQ, q string) tinymq.QueueStats { return m.Stats().Queues[q] }

// stopBounded stops the MQ, failing (not hanging) if Stop takes over 10s of
// real time. Outside synctest only.
func stopBounded(t *testing.T, m *tinymq.MQ) {
	t.Helper()
	done := make(chan struct{})
	go func() { m.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("Stop did not return within 10s")
	}
}

// settled reports whether every accepted message of q has reached an end.
func settled(s tinymq.QueueStats) bool {
	return s.Depth == 0 && s.InFlight == 0 &&
		s.Accepted == s.Succeeded+s.DeadLettered+s.Dropped+s.Undelivered+s.Purged+s.Replayed+s.Removed
}
