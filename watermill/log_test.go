package tinymqwatermill_test

import (
	"context"
	"log/slog"
	"sync"
)

// recorder is a slog.Handler keeping the text of the errors logged under the
// key "err".
type recorder struct {
	mu   sync.Mutex
	errs []string
}

func (r *recorder) logger() *slog.Logger { return slog.New(r) }

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			r.mu.Lock()
			r.errs = append(r.errs, a.Value.Resolve().String())
			r.mu.Unlock()
		}
		return true
	})
	return nil
}

func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

func (r *recorder) WithGroup(string) slog.Handler { return r }

func (r *recorder) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}
