package tinymqprom

import (
	"compress/gzip"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/tinymq/tinymq"
)

// DefaultBuckets are the upper bounds, in seconds, of the consumer-duration
// histogram when [WithBuckets] is not given: from 100µs to 10s, since an
// in-process consumer is often far faster than the client library's default
// buckets (5ms to 10s) can tell apart.
var DefaultBuckets = []float64{.0001, .0005, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// DefaultStuckAfter is how long a consumer call runs before
// tinymq_queue_calls_stuck counts it, when [WithStuckAfter] is not given.
const DefaultStuckAfter = time.Minute

// Collector is a [prometheus.Collector] over one MQ's stats
// ([tinymq.MQ.WalkStats]) and bindings ([tinymq.MQ.Topology]), plus what the
// consumer calls it observes tell: their durations and those running too
// long. [Instrument] makes one and registers it; [NewCollector] makes one
// over an MQ made elsewhere; [Collector.Handler] serves one without a
// registry, for an MQ of many queues ([InstrumentHandler] makes that one).
// It is safe for concurrent use, and keeps working after the MQ stops: the
// counters then stay as they were.
//
// Concurrency: the package starts no goroutine. A scrape, Collect on the
// registry's goroutine or [Collector.Handler] on the server's, holds mu for
// the whole scrape (so two scrapes take turns), taking the MQ's locks inside
// WalkStats, TopologyVersion and Topology and obsMu inside it; lock order
// mu, then the MQ's, or mu, then obsMu. A consumer call (the middleware,
// Collector.Instrument) takes obsMu only, to find its queue's observers: on
// a consumer's first call, after a sweep forgot them, or when a wrapper
// shared by several queues changes queue; otherwise it takes no lock, and it
// never holds one while the consumer runs.
type Collector struct {
	// instrumented says that the Instrument middleware sees every consumer
	// call, so that every queue has a histogram and a stuck gauge, at 0
	// before its first call.
	instrumented bool
	epoch        time.Time // the clock of the observers (see now)
	stuckAfter   int64     // ns
	bounds       []int64   // bucket upper bounds, ns, for observe
	upper        []float64 // the same, seconds, for the exposition (shared, never written)

	exchangeDescs [len(exchangeCounters)]*prometheus.Desc
	counterDescs  [len(queueCounters)]*prometheus.Desc
	gaugeDescs    [len(queueGauges)]*prometheus.Desc
	stuck         *prometheus.Desc
	hist          *prometheus.Desc
	binding       *prometheus.Desc
	deletedQueues *prometheus.Desc
	deletedMsgs   *prometheus.Desc
	collectErrors *prometheus.Desc

	// text is what the handler writes of the labels (see exposition.go).
	text textLabels

	// errs counts the panics a scrape recovered.
	errs atomic.Uint64
	// gen numbers the scrapes; observers created read it (see queueObs).
	gen atomic.Uint64

	mu sync.Mutex // the scrape's: guards what follows, and queueObs' scrape fields
	// mq is the MQ read: nil until the Collector is bound to one
	// (NewCollector, or Instrument's setup).
	mq *tinymq.MQ
	// readHook, set by a test, runs as a scrape starts reading the MQ (with
	// "") and for each queue it reads (with its name), to make the read
	// panic.
	readHook func(queue string)
	snapshot              // what the last scrape read
	scratch  []uint64     // bucket counts being read
	exp      expWriter    // the handler's text on its way out
	gz       *gzip.Writer // the handler's, kept for the next scrape

	obsMu sync.Mutex
	obs   map[string]*queueObs // queue name -> its observers, made by the first call
}

// exchangeCounters are the counters of tinymq.ExchangeStats, in the order
// of Collector.exchangeDescs.
var exchangeCounters = [...]struct {
	name, help string
	get        func(*tinymq.ExchangeStats) uint64
}{
	{"published", "Messages accepted by the exchange (Publish returned nil), each once however many queues it reached.",
		func(s *tinymq.ExchangeStats) uint64 { return s.Published }},
	{"unroutable", "Publishes to the exchange refused because no queue would take the message.",
		func(s *tinymq.ExchangeStats) uint64 { return s.Unroutable }},
	{"duplicates", "Publishes that WithDeduplication found accepted already within its window: they returned nil and routed nothing.",
		func(s *tinymq.ExchangeStats) uint64 { return s.Duplicates }},
}

// queueCounters are the counters of tinymq.QueueStats, each exported as
// tinymq_queue_<name>_total.
var queueCounters = [...]struct {
	name, help string
	get        func(*tinymq.QueueStats) uint64
}{
	{"accepted", "Messages accepted into the queue.", func(s *tinymq.QueueStats) uint64 { return s.Accepted }},
	{"delivered", "Consumer calls, retries included.", func(s *tinymq.QueueStats) uint64 { return s.Delivered }},
	{"succeeded", "Consumer calls that returned nil.", func(s *tinymq.QueueStats) uint64 { return s.Succeeded }},
	{"failed", "Consumer calls that returned an error or panicked.", func(s *tinymq.QueueStats) uint64 { return s.Failed }},
	{"retried", "Failed consumer calls scheduled for another attempt.", func(s *tinymq.QueueStats) uint64 { return s.Retried }},
	{"dead_lettered", "Messages published to the queue's dead-letter exchange.", func(s *tinymq.QueueStats) uint64 { return s.DeadLettered }},
	{"expired", "Messages whose TTL passed before a consumer got them.", func(s *tinymq.QueueStats) uint64 { return s.Expired }},
	{"overflowed", "Messages evicted by a DropHead length limit.", func(s *tinymq.QueueStats) uint64 { return s.Overflowed }},
	{"rejected", "Publishes refused because the queue was full.", func(s *tinymq.QueueStats) uint64 { return s.Rejected }},
	{"dropped", "Dead messages with no dead-letter exchange, or one that could not route them.", func(s *tinymq.QueueStats) uint64 { return s.Dropped }},
	{"undelivered", "Messages a Shutdown deadline, or a Stop before Start, kept from a consumer, and those Stop left in a queue no consumer takes.",
		func(s *tinymq.QueueStats) uint64 { return s.Undelivered }},
	{"purged", "Messages that PurgeQueue removed from the queue.", func(s *tinymq.QueueStats) uint64 { return s.Purged }},
	{"replayed", "Messages that ReplayDeadLetters moved out of the queue, back to where they died.", func(s *tinymq.QueueStats) uint64 { return s.Replayed }},
	{"timed_out", "Deliveries that failed because the consumer outlived WithDeliveryTimeout (each also counts as failed).",
		func(s *tinymq.QueueStats) uint64 { return s.TimedOut }},
}

// queueGauges are the gauges of tinymq.QueueStats, each exported as
// tinymq_queue_<name>.
var queueGauges = [...]struct {
	name, help string
	get        func(*tinymq.QueueStats) float64
}{
	{"messages_ready", "Messages waiting in the queue for a worker.", func(s *tinymq.QueueStats) float64 { return float64(s.Ready) }},
	{"messages_scheduled", "Messages of the queue waiting for a delay or a retry backoff to pass.",
		func(s *tinymq.QueueStats) float64 { return float64(s.Scheduled) }},
	{"messages_in_flight", "Messages of the queue inside its consumer now.", func(s *tinymq.QueueStats) float64 { return float64(s.InFlight) }},
	{"oldest_message_age_seconds", "How long the oldest ready message of the queue has waited for a consumer (up to about 10 ms more than the truth); 0 when none is ready, and on an engine.",
		func(s *tinymq.QueueStats) float64 { return s.OldestAge.Seconds() }},
	{"calls_abandoned", "Consumer calls of the queue that outlived WithDeliveryTimeout and still run, their worker slots taken by new goroutines.",
		func(s *tinymq.QueueStats) float64 { return float64(s.Abandoned) }},
	{"consumers", "Consumers of the queue: its RegisterQueue's and each Consume not cancelled.",
		func(s *tinymq.QueueStats) float64 { return float64(s.Consumers) }},
	{"paused", "1 while PauseQueue has paused the queue, else 0.", func(s *tinymq.QueueStats) float64 {
		if s.Paused {
			return 1
		}
		return 0
	}},
}

// metricDoc is the name and help of a metric family.
type metricDoc struct{ name, help string }

// The families other than the counters and gauges of the stats.
var (
	stuckFamily = metricDoc{"tinymq_queue_calls_stuck",
		"Consumer calls of the queue that had run for longer than WithStuckAfter (default 1m) at the scrape, abandoned ones included."}
	histFamily = metricDoc{"tinymq_queue_consumer_duration_seconds",
		"Time the queue's consumer took per call, retries included: every call when the MQ was made with Instrument, else those of consumers wrapped by Collector.Instrument."}
	bindingFamily = metricDoc{"tinymq_queue_binding_info",
		"1 for each exchange the queue is bound to: join on queue to label a queue's metrics with its exchanges."}
	deletedQueuesFamily = metricDoc{"tinymq_queues_deleted_total",
		"Queues deleted, by DeleteQueue (reason deleted) or by their WithQueueExpiry (reason expired)."}
	deletedMsgsFamily = metricDoc{"tinymq_deleted_queues_messages_removed_total",
		"Messages that the deletes of their queues removed: waiting ones, and those whose delivery failed after the delete."}
	errorsFamily = metricDoc{"tinymq_collector_errors_total",
		"Panics the Collector recovered while collecting, each ending the MQ's part of a scrape; the rest of each scrape was served."}
)

// Option configures a [Collector] in [Instrument] and [NewCollector].
type Option interface {
	apply(*config)
}

type config struct {
	buckets     []float64
	constLabels prometheus.Labels
	stuckAfter  time.Duration
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithBuckets sets the upper bounds, in seconds and strictly increasing, of
// the buckets of tinymq_queue_consumer_duration_seconds. Default
// [DefaultBuckets]. A +Inf bucket is always added (a last bound of +Inf is
// that one). An empty list or bounds that do not increase are refused: an
// error of NewCollector, a panic of Instrument.
func WithBuckets(bounds ...float64) Option {
	b := append([]float64(nil), bounds...)
	return optionFunc(func(c *config) { c.buckets = b })
}

// WithConstLabels adds labels with fixed values to every metric of the
// Collector, such as {"mq": "billing"} to tell apart two MQs of one process
// registered in one registry. The names queue, exchange, reason and le are
// taken; a name that is one of them or is not a classic Prometheus label name
// ([a-zA-Z_][a-zA-Z0-9_]*, no leading "__"), or a value that is not valid
// UTF-8, is refused: an error of NewCollector, a panic of Instrument.
func WithConstLabels(labels prometheus.Labels) Option {
	l := make(prometheus.Labels, len(labels))
	for k, v := range labels {
		l[k] = v
	}
	return optionFunc(func(c *config) { c.constLabels = l })
}

// WithStuckAfter sets how long a consumer call must have run, at the
// scrape, for tinymq_queue_calls_stuck to count it. Default
// [DefaultStuckAfter] (one minute); 0 means the default. A negative d is
// refused: an error of NewCollector, a panic of Instrument.
func WithStuckAfter(d time.Duration) Option {
	return optionFunc(func(c *config) { c.stuckAfter = d })
}

// errInvalid is wrapped by every error of NewCollector and every panic of
// Instrument about an option.
var errInvalid = errors.New("tinymqprom: invalid collector")

// NewCollector returns a Collector over mq, for an MQ made without
// [Instrument]: an error rather than a panic, and nothing registered. It
// reads nothing until a scrape, does not block, and works whatever mq's
// state: before Start and after Stop. Its histogram and stuck gauge see the
// consumers wrapped by [Collector.Instrument] only. It returns an error for
// a nil mq, a nil option, or an option out of range (see [WithBuckets],
// [WithConstLabels] and [WithStuckAfter]).
func NewCollector(mq *tinymq.MQ, opts ...Option) (*Collector, error) {
	if mq == nil {
		return nil, fmt.Errorf("%w: nil MQ", errInvalid)
	}
	c, err := newCollector(opts)
	if err != nil {
		return nil, err
	}
	c.mq = mq
	return c, nil
}

// newCollector returns a Collector bound to no MQ.
func newCollector(opts []Option) (*Collector, error) {
	cfg := config{buckets: DefaultBuckets}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", errInvalid)
		}
		o.apply(&cfg)
	}
	if len(cfg.buckets) > 0 && math.IsInf(cfg.buckets[len(cfg.buckets)-1], 1) {
		cfg.buckets = cfg.buckets[:len(cfg.buckets)-1]
	}
	if err := checkBuckets(cfg.buckets); err != nil {
		return nil, err
	}
	if cfg.stuckAfter < 0 {
		return nil, fmt.Errorf("%w: negative WithStuckAfter %v", errInvalid, cfg.stuckAfter)
	}
	if cfg.stuckAfter == 0 {
		cfg.stuckAfter = DefaultStuckAfter
	}
	for name, v := range cfg.constLabels {
		switch name {
		case "queue", "exchange", "reason", "le":
			return nil, fmt.Errorf("%w: constant label %q is one of the Collector's own", errInvalid, name)
		}
		if !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, "__") {
			return nil, fmt.Errorf("%w: constant label %q is not a valid label name", errInvalid, name)
		}
		if !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: constant label %s has a value that is not valid UTF-8: %q", errInvalid, name, v)
		}
	}

	cl := cfg.constLabels
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, cl)
	}
	c := &Collector{
		epoch:         time.Now(),
		stuckAfter:    int64(cfg.stuckAfter),
		upper:         slices.Clone(cfg.buckets),
		bounds:        make([]int64, len(cfg.buckets)),
		stuck:         desc(stuckFamily.name, stuckFamily.help, "queue"),
		hist:          desc(histFamily.name, histFamily.help, "queue"),
		binding:       desc(bindingFamily.name, bindingFamily.help, "exchange", "queue"),
		deletedQueues: desc(deletedQueuesFamily.name, deletedQueuesFamily.help, "reason"),
		deletedMsgs:   desc(deletedMsgsFamily.name, deletedMsgsFamily.help),
		collectErrors: desc(errorsFamily.name, errorsFamily.help),
		snapshot: snapshot{
			queues:    make(map[string]*queueSeries),
			exchanges: make(map[string]*exchangeSeries),
			bindings:  make(map[[2]string]*bindingSeries),
		},
		scratch: make([]uint64, len(cfg.buckets)+1),
		obs:     make(map[string]*queueObs),
	}
	for i, b := range cfg.buckets {
		c.bounds[i] = durationBound(b)
	}
	c.text = newTextLabels(cl, c.upper)
	for i, e := range exchangeCounters {
		c.exchangeDescs[i] = desc("tinymq_exchange_"+e.name+"_total", e.help, "exchange")
	}
	for i, q := range queueCounters {
		c.counterDescs[i] = desc("tinymq_queue_"+q.name+"_total", q.help, "queue")
	}
	for i, q := range queueGauges {
		c.gaugeDescs[i] = desc("tinymq_queue_"+q.name, q.help, "queue")
	}
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

// durationBound is the bucket bound b (seconds) in whole nanoseconds: a
// duration of d ns is at most b seconds exactly when d <= durationBound(b).
func durationBound(b float64) int64 {
	ns := math.Floor(b * 1e9)
	switch {
	case ns >= math.MaxInt64:
		return math.MaxInt64
	case ns < 0:
		return -1
	}
	return int64(ns)
}

// Describe sends the descriptors of every metric the Collector can export.
// It implements [prometheus.Collector]; it does not block on the MQ.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.exchangeDescs {
		ch <- d
	}
	for _, d := range c.counterDescs {
		ch <- d
	}
	for _, d := range c.gaugeDescs {
		ch <- d
	}
	ch <- c.stuck
	ch <- c.hist
	ch <- c.binding
	ch <- c.deletedQueues
	ch <- c.deletedMsgs
	ch <- c.collectErrors
}

// Collect reads the MQ once ([tinymq.MQ.WalkStats], and [tinymq.MQ.Topology]
// when [tinymq.MQ.TopologyVersion] says it changed) and sends its metrics,
// then tinymq_collector_errors_total. It implements [prometheus.Collector].
// It holds no lock of the MQ while sending, and the MQ takes each queue's
// lock only briefly, so a scrape neither waits for consumers nor stalls
// publishers. The numbers of different queues are not taken at one instant
// (see Stats). After the MQ stops it reports the final counters. Two scrapes
// of one Collector (Collect or [Collector.Handler]) take turns.
//
// It sends the metrics of each queue and exchange in the order of their
// labels, and sends again the metric it sent last time for a number that did
// not change; so it allocates for what moved, and for new names. Collect
// never panics and never sends an invalid metric, either of which would fail
// the whole scrape: a panic (of the MQ's read, say) ends the MQ's part of
// this scrape and is counted in tinymq_collector_errors_total. Names that
// are not valid UTF-8 are escaped (see the package documentation).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectMQ(ch)
	ch <- prometheus.MustNewConstMetric(c.collectErrors, prometheus.CounterValue, float64(c.errs.Load()))
}

// collectMQ reads the MQ and sends its metrics. A panic is recovered here
// and counted, so that Collect still sends the rest.
func (c *Collector) collectMQ(ch chan<- prometheus.Metric) {
	defer func() {
		if r := recover(); r != nil {
			c.errs.Add(1)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.read() {
		return
	}
	for _, e := range c.sortedExchanges {
		if e.labels == nil {
			e.labels = labels(c.exchangeDescs[0], e.label)
		}
		for i, ec := range exchangeCounters {
			e.counters[i] = counter(e.counters[i], c.exchangeDescs[i], e.labels, float64(ec.get(&e.stats)))
			ch <- e.counters[i]
		}
	}
	for _, q := range c.sortedQueues {
		if q.labels == nil {
			q.labels = labels(c.counterDescs[0], q.label)
		}
		st := &q.stats
		for i, qc := range queueCounters {
			q.counters[i] = counter(q.counters[i], c.counterDescs[i], q.labels, float64(qc.get(st)))
			ch <- q.counters[i]
		}
		for i, qg := range queueGauges {
			q.gauges[i] = gauge(q.gauges[i], c.gaugeDescs[i], q.labels, qg.get(st))
			ch <- q.gauges[i]
		}
		if !q.observed {
			continue
		}
		q.stuckMetric = gauge(q.stuckMetric, c.stuck, q.labels, float64(q.stuck))
		ch <- q.stuckMetric
		q.hist = c.histogram(q.hist, q.labels, q.obs)
		ch <- q.hist
	}
	ch <- prometheus.MustNewConstMetric(c.deletedQueues, prometheus.CounterValue, float64(c.deleted), "deleted")
	ch <- prometheus.MustNewConstMetric(c.deletedQueues, prometheus.CounterValue, float64(c.expired), "expired")
	ch <- prometheus.MustNewConstMetric(c.deletedMsgs, prometheus.CounterValue, float64(c.removed))
	for _, b := range c.sortedBindings {
		if b.m == nil {
			b.m = gauge(nil, c.binding, labels(c.binding, b.exchange, b.queue), 1)
		}
		ch <- b.m
	}
}

// labels returns the label pairs of a series of d with the given values,
// built once per name and shared by the metrics of every scrape (the client
// library treats them as immutable). Its capacity is its length, so that a
// wrapping registry that appends labels copies them.
func labels(d *prometheus.Desc, values ...string) []*dto.LabelPair {
	return slices.Clip(prometheus.MakeLabelPairs(d, values))
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
