// Package tinymqprom exports a TinyMQ's metrics to Prometheus.
//
// One option instruments an MQ: every exchange, every queue (those declared
// later included) and every consumer of every form (RegisterQueue,
// RegisterHandler, RegisterDeliveryHandler, Consume, ConsumeHandler,
// ConsumeDeliveries):
//
//	mq := tinymq.New(tinymqprom.Instrument(prometheus.DefaultRegisterer))
//
// [Instrument] registers a [Collector] with the registry and wraps every
// consumer call in a [tinymq.Middleware] that times it. A scrape then reads
// the MQ's stats once ([tinymq.MQ.WalkStats]; [tinymq.MQ.Topology] only
// after [tinymq.MQ.TopologyVersion] moved) and turns them into
// tinymq_exchange_* and tinymq_queue_* metrics: counters for what happened
// to messages, gauges for what waits and what runs,
// tinymq_queue_consumer_duration_seconds (a histogram of every consumer
// call) and tinymq_queue_calls_stuck (calls running longer than
// [WithStuckAfter]). Instrument panics, as [prometheus.MustRegister] does,
// if the registry refuses the Collector.
//
// # Many queues
//
// A registry builds an object for every series of every scrape: 38 series a
// queue cost it about 50ms and 8 MB a thousand queues. For an MQ of
// thousands, [InstrumentHandler] instruments the MQ in the same way but
// registers nothing, and returns a [net/http.Handler] that writes the same
// series, in the text format, straight from the MQ's stats: a tenth of the
// time and a hundredth of the memory. Serve it on a path, and scrape it as a
// job, of its own. [Collector.Handler] serves any Collector so.
//
// [NewCollector] builds the Collector over an MQ made elsewhere, and returns
// an error rather than panicking; its histogram and stuck gauge then see only
// the consumers wrapped by [Collector.Instrument].
//
// The README lists every metric, its type and labels, and how many series a
// queue and an exchange cost.
//
// # Label values
//
// Prometheus requires label values to be valid UTF-8, and TinyMQ does not
// require that of names. So that one bad name cannot fail a scrape, the
// exchange and queue labels are the names with each byte that is not part of
// valid UTF-8 written \xNN (two lowercase hex digits) and each backslash
// written \\. Every other name is its label unchanged, and no two names share
// a series: "q\xff" (the byte) is labelled q\xff and the four-character name
// `q\xff` is labelled q\\xff.
//
// # Failures
//
// A Collector never fails a scrape: a panic while it collects (of Stats, say)
// ends the MQ's part of that scrape and is counted in
// tinymq_collector_errors_total, which every scrape reports.
//
// # Costs
//
// A consumer call costs two clock readings, a few atomic operations and no
// allocation more (BenchmarkMiddleware). A scrape keeps, per queue and
// exchange, the label pairs and the metrics it sent last, and sends them
// again when the number did not change, so that the Collector allocates
// little for a queue that did not move; the handler keeps each series'
// labels as text, and allocates nothing per queue (BenchmarkScrape).
package tinymqprom
