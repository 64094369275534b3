package tinymqwatermill_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a slog.Handler keeping the text of the errors logged under the
// key "err", and each record's message with its "queue".
type recorder struct {
	mu     sync.Mutex
	errs   []string
	lines  []line
	signal chan struct{} // closed, and cleared, by the next record; made by await
}

type line struct{ msg, queue string }

func (r *recorder) logger() *slog.Logger { return slog.New(r) }

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	l := line{msg: rec.Message}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "err":
			r.errs = append(r.errs, a.Value.Resolve().String())
		case "queue":
			l.queue = a.Value.Resolve().String()
		}
		return true
	})
	r.lines = append(r.lines, l)
	if r.signal != nil {
		close(r.signal)
		r.signal = nil
	}
	return nil
}

// await waits until a record whose message contains text has been handled.
func (r *recorder) await(t *testing.T, text string) {
	t.Helper()
	timeout := time.After(wait)
	for {
		r.mu.Lock()
		for _, l := range r.lines {
			if strings.Contains(l.msg, text) {
				r.mu.Unlock()
				return
			}
		}
		if r.signal == nil {
			r.signal = make(chan struct{})
		}
		signal := r.signal
		r.mu.Unlock()
		select {
		case <-signal:
		case <-timeout:
			t.Fatalf("nothing logged %q", text)
		}
	}
}

func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

func (r *recorder) WithGroup(string) slog.Handler { return r }

func (r *recorder) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// queues returns the queues of the records whose message contains text.
func (r *recorder) queues(text string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var qs []string
	for _, l := range r.lines {
		if strings.Contains(l.msg, text) {
			qs = append(qs, l.queue)
		}
	}
	return qs
}
