package tinymq

import "log/slog"

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
