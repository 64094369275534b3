package tinymqprom

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinymq/tinymq"
)

// SetReadHook has fn run as each scrape of c starts reading the MQ (with
// "") and for each queue it reads (with its name), so that a test can make
// the read panic.
func SetReadHook(c *Collector, fn func(queue string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readHook = fn
}

// Middleware returns the middleware that Instrument installs, fed into c, so
// that a benchmark can call it directly.
func Middleware(c *Collector) tinymq.Middleware { return c.middleware }

// InstrumentCollector is Instrument, with the Collector it registers.
func InstrumentCollector(reg prometheus.Registerer, opts ...Option) (tinymq.Option, *Collector) {
	return instrument(reg, opts)
}

// Observers returns how many queues c keeps observers for.
func Observers(c *Collector) int {
	c.obsMu.Lock()
	defer c.obsMu.Unlock()
	return len(c.obs)
}
