package tinymqprom

import "github.com/tinymq/tinymq"

// SetStats replaces the Stats that c's Collect reads, so that a test can make
// it panic.
func SetStats(c *Collector, stats func() tinymq.Stats) { c.stats = stats }
