package tinymqprom

import (
	"cmp"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/tinymq/tinymq"
)

// snapshot is what the last scrape read of the MQ, kept from scrape to
// scrape so that a name is escaped once and a number that did not change
// costs nothing. Both routes fill it through read and expose it: Collect as
// metrics, the handler as text. It is guarded by the Collector's mu.
type snapshot struct {
	queues          map[string]*queueSeries
	sortedQueues    []*queueSeries // by label: the exposition's order
	exchanges       map[string]*exchangeSeries
	sortedExchanges []*exchangeSeries
	bindings        map[[2]string]*bindingSeries // by name: exchange, queue
	sortedBindings  []*bindingSeries             // by label: exchange, queue
	// stale says that a series was made or forgotten since the sorted
	// lists were built: a read that panicked may have left it so.
	stale bool
	// bindingsStale is stale for the bindings.
	bindingsStale bool
	// topologyVersion is the MQ's TopologyVersion when the bindings were
	// last read, valid once topologyRead.
	topologyVersion uint64
	topologyRead    bool
	// deleted, expired and removed are the MQ's totals of deleted queues.
	deleted, expired, removed uint64
}

// exchangeSeries is one exchange's numbers and series.
type exchangeSeries struct {
	name   string
	label  string
	gen    uint64 // the last scrape that saw the exchange
	stats  tinymq.ExchangeStats
	labels []*dto.LabelPair // Collect's, made by its first
	text   string           // the handler's, made by its first (see textLabels)

	counters [len(exchangeCounters)]*counterMetric // what Collect sent last
}

// queueSeries is one queue's numbers and series.
type queueSeries struct {
	name  string
	label string
	gen   uint64 // the last scrape that saw the queue
	stats tinymq.QueueStats
	obs   *queueObs // nil until a consumer call of the queue was observed
	// observed says that the queue has a histogram and a stuck gauge this
	// scrape, stuck calls running for longer than WithStuckAfter.
	observed bool
	stuck    int
	labels   []*dto.LabelPair // Collect's, made by its first
	text     string           // the handler's, made by its first

	counters    [len(queueCounters)]*counterMetric // what Collect sent last
	gauges      [len(queueGauges)]*gaugeMetric
	stuckMetric *gaugeMetric
	hist        *histogramMetric
}

// bindingSeries is the info series of one (exchange, queue) pair bound.
type bindingSeries struct {
	exchange, queue string // labels
	gen             uint64 // the last read of the topology that found it
	m               *gaugeMetric
	text            string
}

// read reads the MQ into the snapshot: WalkStats for the exchanges and
// queues, Topology for the bindings once TopologyVersion moved, and each
// queue's observers; then it forgets what the MQ no longer has. It reports
// false when the Collector is bound to no MQ yet. The caller holds mu; a
// panic (of the MQ) leaves the snapshot fit for the next read.
func (c *Collector) read() bool {
	if c.mq == nil { // an Instrument option not given to New yet
		return false
	}
	gen := c.gen.Add(1)
	now := c.now()
	if c.readHook != nil {
		c.readHook("")
	}
	var exchanges, queues int // seen by this read
	st := c.mq.WalkStats(func(name string, es *tinymq.ExchangeStats) bool {
		e := c.exchanges[name]
		if e == nil {
			e = &exchangeSeries{name: name, label: labelValue(name)}
			c.exchanges[name] = e
			c.stale = true
		}
		if e.gen != gen {
			e.gen = gen
			exchanges++
		}
		e.stats = *es
		return true
	}, func(name string, qs *tinymq.QueueStats) bool {
		if c.readHook != nil {
			c.readHook(name)
		}
		q := c.queues[name]
		if q == nil {
			q = &queueSeries{name: name, label: labelValue(name)}
			c.queues[name] = q
			c.stale = true
		}
		if q.gen != gen {
			q.gen = gen
			queues++
		}
		q.stats = *qs
		return true
	})
	c.deleted, c.expired, c.removed = st.DeletedQueues-st.ExpiredQueues, st.ExpiredQueues, st.Deleted.Removed
	if c.stale || exchanges != len(c.exchanges) || queues != len(c.queues) {
		c.sortedExchanges = c.sortedExchanges[:0]
		for name, e := range c.exchanges {
			if e.gen != gen {
				delete(c.exchanges, name)
				continue
			}
			c.sortedExchanges = append(c.sortedExchanges, e)
		}
		slices.SortFunc(c.sortedExchanges, func(a, b *exchangeSeries) int { return cmp.Compare(a.label, b.label) })
		c.sortedQueues = c.sortedQueues[:0]
		for name, q := range c.queues {
			if q.gen != gen {
				delete(c.queues, name)
				continue
			}
			c.sortedQueues = append(c.sortedQueues, q)
		}
		slices.SortFunc(c.sortedQueues, func(a, b *queueSeries) int { return cmp.Compare(a.label, b.label) })
		clear(c.sortedExchanges[len(c.sortedExchanges):cap(c.sortedExchanges)])
		clear(c.sortedQueues[len(c.sortedQueues):cap(c.sortedQueues)])
		c.stale = false
	}
	c.readBindings()

	withObs := 0
	for _, q := range c.sortedQueues {
		if q.obs == nil || q.obs.dead.Load() {
			q.obs = c.lookupObs(q.name)
		}
		q.observed, q.stuck = q.obs != nil || c.instrumented, 0
		if o := q.obs; o != nil {
			withObs++
			o.lastSeen = gen
			q.stuck = o.stuck(now, c.stuckAfter)
		}
	}
	c.sweepObs(gen, withObs)
	return true
}

// readBindings reads the MQ's Topology, and from it the bindings, unless
// TopologyVersion says that it did not change since the last read. The
// version is read first: a change that lands between the two reads is then
// read again by the next scrape, never missed.
func (c *Collector) readBindings() {
	v := c.mq.TopologyVersion()
	if c.topologyRead && v == c.topologyVersion {
		return
	}
	top := c.mq.Topology()
	gen := c.gen.Load()
	n := 0
	for _, ex := range top.Exchanges {
		for _, b := range ex.Bindings {
			k := [2]string{ex.Name, b.Queue}
			s := c.bindings[k]
			if s == nil {
				s = &bindingSeries{exchange: labelValue(ex.Name), queue: labelValue(b.Queue)}
				c.bindings[k] = s
				c.bindingsStale = true
			}
			if s.gen != gen { // not another binding of the same pair (other keys)
				s.gen = gen
				n++
			}
		}
	}
	if c.bindingsStale || n != len(c.bindings) {
		c.sortedBindings = c.sortedBindings[:0]
		for k, s := range c.bindings {
			if s.gen != gen {
				delete(c.bindings, k)
				continue
			}
			c.sortedBindings = append(c.sortedBindings, s)
		}
		slices.SortFunc(c.sortedBindings, func(a, b *bindingSeries) int {
			return cmp.Or(cmp.Compare(a.exchange, b.exchange), cmp.Compare(a.queue, b.queue))
		})
		clear(c.sortedBindings[len(c.sortedBindings):cap(c.sortedBindings)])
		c.bindingsStale = false
	}
	c.topologyVersion, c.topologyRead = v, true
}
