package tinymq

import (
	"context"
	"errors"
	"log/slog"
)

// Option configures an MQ in [New].
type Option interface {
	applyMQ(*MQ)
}

type optionFunc func(*MQ)

func (f optionFunc) applyMQ(m *MQ) { f(m) }

// WithLogger sets the logger that TinyMQ reports to what it cannot return as an
// error: failed deliveries (with the keys exchange, queue, msg_id, err, and stack
// for panics) and messages a shutdown left undelivered. A nil logger, like the
// default, discards everything.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(m *MQ) {
		if l != nil {
			m.log = l
		}
	})
}

var discardLogger = slog.New(slog.DiscardHandler)

// logFailure logs a failed delivery of m.
func logFailure(ctx context.Context, log *slog.Logger, m *Msg, err error) {
	if !log.Enabled(ctx, slog.LevelError) {
		return
	}
	attrs := []slog.Attr{
		slog.String("exchange", m.Exchange),
		slog.String("queue", m.Queue),
		slog.Uint64("msg_id", m.ID),
		slog.Any("err", err),
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		attrs = append(attrs, slog.String("stack", string(pe.Stack)))
	}
	log.LogAttrs(ctx, slog.LevelError, "tinymq: delivery failed", attrs...)
}
