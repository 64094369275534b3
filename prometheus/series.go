package tinymqprom

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The metrics a scrape sends. Each is written once, before it is first sent,
// and never changed after: a scrape whose number did not change sends the
// same metric again, and one whose number changed makes a new one. So two
// scrapes (and the encoders of their results) may share one, and a queue that
// did not move costs no allocation.

// counterMetric is one counter's series.
type counterMetric struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	v      float64
	dto    dto.Counter
}

// counter returns last if it is the series of v, else a new metric of v.
func counter(last *counterMetric, d *prometheus.Desc, labels []*dto.LabelPair, v float64) *counterMetric {
	if last != nil && last.v == v {
		return last
	}
	m := &counterMetric{desc: d, labels: labels, v: v}
	m.dto.Value = &m.v
	return m
}

// Desc implements prometheus.Metric.
func (m *counterMetric) Desc() *prometheus.Desc { return m.desc }

// Write implements prometheus.Metric.
func (m *counterMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	out.Counter = &m.dto
	return nil
}

// gaugeMetric is one gauge's series.
type gaugeMetric struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	v      float64
	dto    dto.Gauge
}

// gauge returns last if it is the series of v, else a new metric of v.
func gauge(last *gaugeMetric, d *prometheus.Desc, labels []*dto.LabelPair, v float64) *gaugeMetric {
	if last != nil && last.v == v {
		return last
	}
	m := &gaugeMetric{desc: d, labels: labels, v: v}
	m.dto.Value = &m.v
	return m
}

// Desc implements prometheus.Metric.
func (m *gaugeMetric) Desc() *prometheus.Desc { return m.desc }

// Write implements prometheus.Metric.
func (m *gaugeMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	out.Gauge = &m.dto
	return nil
}

// histogramMetric is one queue's consumer-duration histogram.
type histogramMetric struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	count  uint64
	sumNS  uint64
	sum    float64
	cum    []uint64 // cumulative count of each finite bucket
	dto    dto.Histogram
}

// histogram returns last if o has observed nothing since, else a new
// metric of what o observed (of nothing, for a nil o). It reads the buckets
// one at a time while calls may be observed, and makes the count their sum,
// so that the +Inf bucket always equals the count; the sum may lag the
// count by the calls being observed.
func (c *Collector) histogram(last *histogramMetric, labels []*dto.LabelPair, o *queueObs) *histogramMetric {
	counts := c.scratch
	var count, sumNS uint64
	if o != nil {
		sumNS = o.sumNS.Load()
		for i := range o.counts {
			counts[i] = o.counts[i].Load()
			count += counts[i]
		}
	} else {
		clear(counts)
	}
	if last != nil && last.count == count && last.sumNS == sumNS {
		return last
	}
	n := len(c.upper)
	m := &histogramMetric{desc: c.hist, labels: labels, count: count, sumNS: sumNS, sum: float64(sumNS) / 1e9,
		cum: make([]uint64, n)}
	buckets := make([]dto.Bucket, n)
	ptrs := make([]*dto.Bucket, n)
	var cum uint64
	for i := range n {
		cum += counts[i]
		m.cum[i] = cum
		buckets[i].CumulativeCount = &m.cum[i]
		buckets[i].UpperBound = &c.upper[i]
		ptrs[i] = &buckets[i]
	}
	m.dto.SampleCount = &m.count
	m.dto.SampleSum = &m.sum
	m.dto.Bucket = ptrs
	return m
}

// Desc implements prometheus.Metric.
func (m *histogramMetric) Desc() *prometheus.Desc { return m.desc }

// Write implements prometheus.Metric.
func (m *histogramMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	out.Histogram = &m.dto
	return nil
}
