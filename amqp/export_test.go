package amqp

import "time"

// WithHelperLease shortens how long the engine's helper queues outlive
// their TTL unused (an hour otherwise; see wait.go), so that a test sees the
// broker delete one.
func WithHelperLease(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		c.helperLease = d
		return nil
	})
}
