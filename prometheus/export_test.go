package tinymqprom

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinymq/tinymq"
)

// SetStats replaces the Stats that c's Collect reads, so that a test can make
// it panic.
func SetStats(c *Collector, stats func() tinymq.Stats) { c.stats = stats }

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
