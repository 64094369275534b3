// Package tinymqprom exports a TinyMQ's counters to Prometheus.
//
// A [Collector] reads [tinymq.MQ.Stats] once per scrape and turns it into
// tinymq_exchange_* and tinymq_queue_* metrics: counters for what happened to
// messages, gauges for what waits, and a summary of the consumer time that
// the core samples. [Collector.Instrument] wraps a consumer to observe every
// call into a histogram with buckets of your choice, which Prometheus can
// aggregate across queues and processes as it cannot a summary.
//
//	c, err := tinymqprom.NewCollector(mq)
//	if err != nil {
//		return err
//	}
//	prometheus.MustRegister(c)
//	mq.RegisterQueue("orders", tinymq.Fanout, c.Instrument(handleOrder), 4)
//
// The README lists every metric, its type and labels.
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
// A Collector never fails a scrape: a metric it cannot build, or a panic while
// it collects, is left out of the scrape and counted in
// tinymq_collector_errors_total, which every scrape reports.
package tinymqprom

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/tinymq/tinymq"
)

// DefaultBuckets are the upper bounds, in seconds, of the consumer-duration
// histogram when [WithBuckets] is not given: from 100µs to 10s, since an
// in-process consumer is often far faster than the client library's default
// buckets (5ms to 10s) can tell apart.
var DefaultBuckets = []float64{.0001, .0005, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Collector is a [prometheus.Collector] over one MQ's [tinymq.MQ.Stats], plus
// the consumer-duration histogram that [Collector.Instrument] feeds. Create
// it with [NewCollector] and register it once. It is safe for concurrent use,
// and keeps working after the MQ stops: the counters then stay as they were.
type Collector struct {
	mq    *tinymq.MQ
	stats func() tinymq.Stats // mq.Stats; a test replaces it to make Collect panic
	hist  *prometheus.HistogramVec

	published, unroutable *prometheus.Desc
	duplicates            *prometheus.Desc
	counters              []queueCounter
	ready, scheduled      *prometheus.Desc
	inFlight, abandoned   *prometheus.Desc
	consumers, paused     *prometheus.Desc
	deletedQueues         *prometheus.Desc
	deletedRemoved        *prometheus.Desc
	binding               *prometheus.Desc
	consumerTime          *prometheus.Desc
	collectErrors         *prometheus.Desc

	// errs counts the metrics Collect left out and the panics it recovered.
	errs atomic.Uint64

	// sums keeps, per queue, the last _sum exported for consumerTime, so that
	// it never goes down (see consumerTimeSum).
	mu   sync.Mutex
	sums map[string]float64

	observers sync.Map // queue name -> *observers, for Instrument
}

// queueCounter is one counter of tinymq.QueueStats and how to read it.
type queueCounter struct {
	desc *prometheus.Desc
	get  func(*tinymq.QueueStats) uint64
}

// Option configures a [Collector] in [NewCollector].
type Option interface {
	apply(*config)
}

type config struct {
	buckets     []float64
	constLabels prometheus.Labels
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithBuckets sets the upper bounds, in seconds and strictly increasing, of
// the buckets of tinymq_queue_consumer_duration_seconds, the histogram that
// [Collector.Instrument] observes into. Default [DefaultBuckets]. A +Inf
// bucket is always added. NewCollector returns an error for an empty list or
// bounds that do not increase.
func WithBuckets(bounds ...float64) Option {
	b := append([]float64(nil), bounds...)
	return optionFunc(func(c *config) { c.buckets = b })
}

// WithConstLabels adds labels with fixed values to every metric of the
// Collector, such as {"mq": "billing"} to tell apart two MQs of one process
// registered in one registry. The names queue, exchange, result, quantile and
// le are taken; NewCollector returns an error for them or for a name that is
// not a classic Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, no
// leading "__"), and for a value that is not valid UTF-8.
func WithConstLabels(labels prometheus.Labels) Option {
	l := make(prometheus.Labels, len(labels))
	for k, v := range labels {
		l[k] = v
	}
	return optionFunc(func(c *config) { c.constLabels = l })
}

// errInvalid is wrapped by every error of NewCollector.
var errInvalid = errors.New("tinymqprom: invalid collector")

// NewCollector returns a Collector over mq. It reads nothing until a scrape,
// does not block, and works whatever mq's state: before Start and after Stop.
// It returns an error for a nil mq, a nil option, or an option out of range
// (see [WithBuckets] and [WithConstLabels]).
func NewCollector(mq *tinymq.MQ, opts ...Option) (*Collector, error) {
	if mq == nil {
		return nil, fmt.Errorf("%w: nil MQ", errInvalid)
	}
	cfg := config{buckets: append([]float64(nil), DefaultBuckets...)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", errInvalid)
		}
		o.apply(&cfg)
	}
	if err := checkBuckets(cfg.buckets); err != nil {
		return nil, err
	}
	for name := range cfg.constLabels {
		switch name {
		case "queue", "exchange", "result", "quantile", "le":
			return nil, fmt.Errorf("%w: constant label %q is one of the Collector's own", errInvalid, name)
		}
		if !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, "__") {
			return nil, fmt.Errorf("%w: constant label %q is not a valid label name", errInvalid, name)
		}
		if v := cfg.constLabels[name]; !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: constant label %s has a value that is not valid UTF-8: %q", errInvalid, name, v)
		}
	}

	cl := cfg.constLabels
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, cl)
	}
	c := &Collector{
		mq:    mq,
		stats: mq.Stats,
		hist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "tinymq_queue_consumer_duration_seconds",
			Help:        "Time the queue's consumer took per call, retries included (every call of a consumer wrapped by Instrument).",
			Buckets:     cfg.buckets,
			ConstLabels: cl,
		}, []string{"queue", "result"}),
		published:      desc("tinymq_exchange_published_total", "Messages accepted by the exchange (Publish returned nil), each once however many queues it reached.", "exchange"),
		unroutable:     desc("tinymq_exchange_unroutable_total", "Publishes to the exchange refused because no queue would take the message.", "exchange"),
		duplicates:     desc("tinymq_exchange_duplicates_total", "Publishes that WithDeduplication found accepted already within its window: they returned nil and routed nothing.", "exchange"),
		ready:          desc("tinymq_queue_messages_ready", "Messages waiting in the queue for a worker.", "queue"),
		scheduled:      desc("tinymq_queue_messages_scheduled", "Messages of the queue waiting for a delay or a retry backoff to pass.", "queue"),
		inFlight:       desc("tinymq_queue_messages_in_flight", "Messages of the queue inside its consumer now.", "queue"),
		abandoned:      desc("tinymq_queue_calls_abandoned", "Consumer calls of the queue that outlived WithDeliveryTimeout and still run, their worker slots taken by new goroutines.", "queue"),
		consumers:      desc("tinymq_queue_consumers", "Consumers of the queue: its RegisterQueue's and each Consume not cancelled.", "queue"),
		paused:         desc("tinymq_queue_paused", "1 while PauseQueue has paused the queue, else 0.", "queue"),
		deletedQueues:  desc("tinymq_queues_deleted_total", "Queues deleted, by DeleteQueue (reason deleted) or by their WithQueueExpiry (reason expired).", "reason"),
		deletedRemoved: desc("tinymq_deleted_queues_messages_removed_total", "Messages that the deletes of their queues removed: waiting ones, and those whose delivery failed after the delete."),
		binding:        desc("tinymq_queue_binding_info", "1 for each exchange the queue is bound to: join on queue to label a queue's metrics with its exchanges.", "exchange", "queue"),
		consumerTime:   desc("tinymq_queue_consumer_time_seconds", "Time the queue's consumer took, sampled by TinyMQ since the queue was registered; quantiles are upper bounds within a factor of 2.", "queue"),
		sums:           make(map[string]float64),
	}
	c.collectErrors = desc("tinymq_collector_errors_total", "Metrics the Collector left out of a scrape because it could not build them, and panics it recovered while collecting; the rest of each scrape was served.")
	counter := func(name, help string, get func(*tinymq.QueueStats) uint64) {
		c.counters = append(c.counters, queueCounter{desc("tinymq_queue_"+name+"_total", help, "queue"), get})
	}
	counter("accepted", "Messages accepted into the queue.", func(s *tinymq.QueueStats) uint64 { return s.Accepted })
	counter("delivered", "Consumer calls, retries included.", func(s *tinymq.QueueStats) uint64 { return s.Delivered })
	counter("succeeded", "Consumer calls that returned nil.", func(s *tinymq.QueueStats) uint64 { return s.Succeeded })
	counter("failed", "Consumer calls that returned an error or panicked.", func(s *tinymq.QueueStats) uint64 { return s.Failed })
	counter("retried", "Failed consumer calls scheduled for another attempt.", func(s *tinymq.QueueStats) uint64 { return s.Retried })
	counter("dead_lettered", "Messages published to the queue's dead-letter exchange.", func(s *tinymq.QueueStats) uint64 { return s.DeadLettered })
	counter("expired", "Messages whose TTL passed before a consumer got them.", func(s *tinymq.QueueStats) uint64 { return s.Expired })
	counter("overflowed", "Messages evicted by a DropHead length limit.", func(s *tinymq.QueueStats) uint64 { return s.Overflowed })
	counter("rejected", "Publishes refused because the queue was full.", func(s *tinymq.QueueStats) uint64 { return s.Rejected })
	counter("dropped", "Dead messages with no dead-letter exchange, or one that could not route them.", func(s *tinymq.QueueStats) uint64 { return s.Dropped })
	counter("undelivered", "Messages a Shutdown deadline, or a Stop before Start, kept from a consumer, and those Stop left in a queue no consumer takes.", func(s *tinymq.QueueStats) uint64 { return s.Undelivered })
	counter("purged", "Messages that PurgeQueue removed from the queue.", func(s *tinymq.QueueStats) uint64 { return s.Purged })
	counter("timed_out", "Deliveries that failed because the consumer outlived WithDeliveryTimeout (each also counts as failed).", func(s *tinymq.QueueStats) uint64 { return s.TimedOut })
	return c, nil
}

func checkBuckets(b []float64) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: no buckets", errInvalid)
	}
	for i, v := range b {
		if math.IsNaN(v) {
			return fmt.Errorf("%w: bucket %d is NaN", errInvalid, i)
		}
		if i > 0 && v <= b[i-1] {
			return fmt.Errorf("%w: buckets must increase: %v after %v", errInvalid, v, b[i-1])
		}
	}
	return nil
}

// Describe sends the descriptors of every metric the Collector can export.
// It implements [prometheus.Collector]; it does not block on the MQ.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.published
	ch <- c.unroutable
	ch <- c.duplicates
	for _, qc := range c.counters {
		ch <- qc.desc
	}
	ch <- c.ready
	ch <- c.scheduled
	ch <- c.inFlight
	ch <- c.abandoned
	ch <- c.consumers
	ch <- c.paused
	ch <- c.deletedQueues
	ch <- c.deletedRemoved
	ch <- c.consumerTime
	ch <- c.binding
	c.hist.Describe(ch)
	ch <- c.collectErrors
}

// Collect takes one [tinymq.MQ.Stats] snapshot and sends its metrics, then
// the histogram's, then tinymq_collector_errors_total. It implements
// [prometheus.Collector]. It holds no lock of the MQ while sending, and Stats
// takes each queue's lock only briefly, so a scrape neither waits for
// consumers nor stalls publishers; it costs about 20 metrics per queue. The
// numbers of different queues are not taken at one instant (see Stats). After
// the MQ stops it reports the final counters.
//
// Collect never panics and never sends an invalid metric, either of which
// would fail the whole scrape: a metric it cannot build is left out, a panic
// (of Stats, say) ends the MQ's part of this scrape, and each is counted in
// tinymq_collector_errors_total. Names that are not valid UTF-8 are escaped
// (see the package documentation), so they cost nothing of the kind.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectMQ(ch)
	c.hist.Collect(ch)
	ch <- prometheus.MustNewConstMetric(c.collectErrors, prometheus.CounterValue, float64(c.errs.Load()))
}

// collectMQ sends the metrics of one Stats snapshot and of the topology. A
// panic is recovered here and counted, so that Collect still sends the rest.
func (c *Collector) collectMQ(ch chan<- prometheus.Metric) {
	defer func() {
		if r := recover(); r != nil {
			c.errs.Add(1)
		}
	}()
	send := func(m prometheus.Metric, err error) {
		if err != nil {
			c.errs.Add(1)
			return
		}
		ch <- m
	}
	st := c.stats()
	for name, ex := range st.Exchanges {
		l := labelValue(name)
		send(prometheus.NewConstMetric(c.published, prometheus.CounterValue, float64(ex.Published), l))
		send(prometheus.NewConstMetric(c.unroutable, prometheus.CounterValue, float64(ex.Unroutable), l))
		send(prometheus.NewConstMetric(c.duplicates, prometheus.CounterValue, float64(ex.Duplicates), l))
	}
	for name, qs := range st.Queues {
		l := labelValue(name)
		for _, qc := range c.counters {
			send(prometheus.NewConstMetric(qc.desc, prometheus.CounterValue, float64(qc.get(&qs)), l))
		}
		send(prometheus.NewConstMetric(c.ready, prometheus.GaugeValue, float64(qs.Ready), l))
		send(prometheus.NewConstMetric(c.scheduled, prometheus.GaugeValue, float64(qs.Scheduled), l))
		send(prometheus.NewConstMetric(c.inFlight, prometheus.GaugeValue, float64(qs.InFlight), l))
		send(prometheus.NewConstMetric(c.abandoned, prometheus.GaugeValue, float64(qs.Abandoned), l))
		send(prometheus.NewConstMetric(c.consumers, prometheus.GaugeValue, float64(qs.Consumers), l))
		paused := 0.0
		if qs.Paused {
			paused = 1
		}
		send(prometheus.NewConstMetric(c.paused, prometheus.GaugeValue, paused, l))
		ct := qs.ConsumerTime
		quantiles := map[float64]float64{.5: math.NaN(), .9: math.NaN(), .99: math.NaN()}
		if ct.Samples > 0 {
			quantiles[.5], quantiles[.9], quantiles[.99] = ct.P50.Seconds(), ct.P90.Seconds(), ct.P99.Seconds()
		}
		send(prometheus.NewConstSummary(c.consumerTime, ct.Samples, c.consumerTimeSum(name, ct), quantiles, l))
	}
	send(prometheus.NewConstMetric(c.deletedQueues, prometheus.CounterValue, float64(st.DeletedQueues-st.ExpiredQueues), "deleted"))
	send(prometheus.NewConstMetric(c.deletedQueues, prometheus.CounterValue, float64(st.ExpiredQueues), "expired"))
	send(prometheus.NewConstMetric(c.deletedRemoved, prometheus.CounterValue, float64(st.Deleted.Removed)))
	seen := make(map[[2]string]bool)
	for _, ex := range c.mq.Topology().Exchanges {
		for _, b := range ex.Bindings {
			if k := [2]string{ex.Name, b.Queue}; !seen[k] {
				seen[k] = true
				send(prometheus.NewConstMetric(c.binding, prometheus.GaugeValue, 1, labelValue(ex.Name), labelValue(b.Queue)))
			}
		}
	}
}

// labelValue returns the label value of an exchange or queue name: name itself
// if it is valid UTF-8 and has no backslash, else name with each byte that is
// not part of valid UTF-8 written \xNN and each backslash written \\. The
// result is always valid UTF-8, and different names give different labels
// (the escaping can be undone), so two names never collide into one series.
func labelValue(name string) string {
	if utf8.ValidString(name) && strings.IndexByte(name, '\\') < 0 {
		return name
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(name) + 8)
	for i := 0; i < len(name); {
		r, size := utf8.DecodeRuneInString(name[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteByte(hex[name[i]>>4])
			b.WriteByte(hex[name[i]&0xf])
		case r == '\\':
			b.WriteString(`\\`)
		default:
			b.WriteString(name[i : i+size])
		}
		i += size
	}
	return b.String()
}

// consumerTimeSum returns the summary's _sum for a queue: Mean times Samples,
// since DurationStats has no total. Mean is rounded down to a nanosecond, so
// that product can fall a little between two scrapes, which Prometheus would
// take for a counter reset; it is therefore never allowed below the last value
// exported. The error stays under a nanosecond per sample.
func (c *Collector) consumerTimeSum(queue string, ct tinymq.DurationStats) float64 {
	sum := ct.Mean.Seconds() * float64(ct.Samples)
	c.mu.Lock()
	defer c.mu.Unlock()
	if last := c.sums[queue]; sum < last {
		return last
	}
	c.sums[queue] = sum
	return sum
}
