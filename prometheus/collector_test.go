package tinymqprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	tinymqprom "github.com/tinymq/tinymq/prometheus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var errBill = errors.New("card declined")

// scenario runs an MQ through every counter the Collector exports (but the
// job-queue ones, which TestJobQueueCounters drives), each to a different
// value so that a swapped metric shows, and returns it stopped.
// It runs in a synctest bubble for the TTL and the retry backoff.
func scenario(t *testing.T) *tinymq.MQ {
	t.Helper()
	ok := func(context.Context, *tinymq.Msg) error { return nil }
	mq := tinymq.New()
	must := func(err error) { t.Helper(); require.NoError(t, err) }

	// orders: 3 published; "bill" fails message 2 twice and dead-letters it.
	must(mq.RegisterQueue("orders", tinymq.Fanout, ok, 1, tinymq.WithQueueName("ship")))
	must(mq.RegisterQueue("orders", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		if m.ID == 2 {
			return errBill
		}
		return nil
	}, 1, tinymq.WithQueueName("bill"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond}),
		tinymq.WithDeadLetter("orders.dead", "")))
	must(mq.RegisterQueue("orders.dead", tinymq.Fanout, ok, 1, tinymq.WithQueueName("dead")))
	// limited: 2 published, 1 rejected.
	must(mq.RegisterQueue("limited", tinymq.Fanout, ok, 1, tinymq.WithQueueName("reject"),
		tinymq.WithMaxLen(1, tinymq.RejectPublish)))
	// burst: 4 published into a DropHead queue of 1: 3 overflow and are dropped.
	must(mq.RegisterQueue("burst", tinymq.Fanout, ok, 1, tinymq.WithQueueName("drophead"),
		tinymq.WithMaxLen(1, tinymq.DropHead)))
	// ttl: 1 message expires before Start and is dropped.
	must(mq.RegisterQueue("ttl", tinymq.Fanout, ok, 1, tinymq.WithQueueName("expire"),
		tinymq.WithMessageTTL(time.Second)))
	// nowhere: unroutable twice.
	must(mq.DeclareExchange("nowhere", tinymq.Direct))

	for i := range 3 {
		must(mq.Publish("orders", i))
	}
	must(mq.Publish("limited", 1))
	require.ErrorIs(t, mq.Publish("limited", 2), tinymq.ErrQueueFull)
	for i := range 4 {
		must(mq.Publish("burst", i))
	}
	must(mq.Publish("ttl", 1))
	require.ErrorIs(t, mq.Publish("nowhere", 1), tinymq.ErrNoRoute)
	require.ErrorIs(t, mq.Publish("nowhere", 2), tinymq.ErrNoRoute)
	time.Sleep(2 * time.Second) // the bubble's clock: the ttl message expires

	must(mq.Start(t.Context()))
	mq.Stop()
	return mq
}

const wantCounters = `
# HELP tinymq_exchange_published_total Messages accepted by the exchange (Publish returned nil), each once however many queues it reached.
# TYPE tinymq_exchange_published_total counter
tinymq_exchange_published_total{exchange="burst"} 4
tinymq_exchange_published_total{exchange="limited"} 1
tinymq_exchange_published_total{exchange="nowhere"} 0
tinymq_exchange_published_total{exchange="orders"} 3
tinymq_exchange_published_total{exchange="orders.dead"} 1
tinymq_exchange_published_total{exchange="ttl"} 1
# HELP tinymq_exchange_unroutable_total Publishes to the exchange refused because no queue would take the message.
# TYPE tinymq_exchange_unroutable_total counter
tinymq_exchange_unroutable_total{exchange="burst"} 0
tinymq_exchange_unroutable_total{exchange="limited"} 0
tinymq_exchange_unroutable_total{exchange="nowhere"} 2
tinymq_exchange_unroutable_total{exchange="orders"} 0
tinymq_exchange_unroutable_total{exchange="orders.dead"} 0
tinymq_exchange_unroutable_total{exchange="ttl"} 0
# HELP tinymq_queue_accepted_total Messages accepted into the queue.
# TYPE tinymq_queue_accepted_total counter
tinymq_queue_accepted_total{queue="bill"} 3
tinymq_queue_accepted_total{queue="dead"} 1
tinymq_queue_accepted_total{queue="drophead"} 4
tinymq_queue_accepted_total{queue="expire"} 1
tinymq_queue_accepted_total{queue="reject"} 1
tinymq_queue_accepted_total{queue="ship"} 3
# HELP tinymq_queue_delivered_total Consumer calls, retries included.
# TYPE tinymq_queue_delivered_total counter
tinymq_queue_delivered_total{queue="bill"} 4
tinymq_queue_delivered_total{queue="dead"} 1
tinymq_queue_delivered_total{queue="drophead"} 1
tinymq_queue_delivered_total{queue="expire"} 0
tinymq_queue_delivered_total{queue="reject"} 1
tinymq_queue_delivered_total{queue="ship"} 3
# HELP tinymq_queue_succeeded_total Consumer calls that returned nil.
# TYPE tinymq_queue_succeeded_total counter
tinymq_queue_succeeded_total{queue="bill"} 2
tinymq_queue_succeeded_total{queue="dead"} 1
tinymq_queue_succeeded_total{queue="drophead"} 1
tinymq_queue_succeeded_total{queue="expire"} 0
tinymq_queue_succeeded_total{queue="reject"} 1
tinymq_queue_succeeded_total{queue="ship"} 3
# HELP tinymq_queue_failed_total Consumer calls that returned an error or panicked.
# TYPE tinymq_queue_failed_total counter
tinymq_queue_failed_total{queue="bill"} 2
tinymq_queue_failed_total{queue="dead"} 0
tinymq_queue_failed_total{queue="drophead"} 0
tinymq_queue_failed_total{queue="expire"} 0
tinymq_queue_failed_total{queue="reject"} 0
tinymq_queue_failed_total{queue="ship"} 0
# HELP tinymq_queue_retried_total Failed consumer calls scheduled for another attempt.
# TYPE tinymq_queue_retried_total counter
tinymq_queue_retried_total{queue="bill"} 1
tinymq_queue_retried_total{queue="dead"} 0
tinymq_queue_retried_total{queue="drophead"} 0
tinymq_queue_retried_total{queue="expire"} 0
tinymq_queue_retried_total{queue="reject"} 0
tinymq_queue_retried_total{queue="ship"} 0
# HELP tinymq_queue_dead_lettered_total Messages published to the queue's dead-letter exchange.
# TYPE tinymq_queue_dead_lettered_total counter
tinymq_queue_dead_lettered_total{queue="bill"} 1
tinymq_queue_dead_lettered_total{queue="dead"} 0
tinymq_queue_dead_lettered_total{queue="drophead"} 0
tinymq_queue_dead_lettered_total{queue="expire"} 0
tinymq_queue_dead_lettered_total{queue="reject"} 0
tinymq_queue_dead_lettered_total{queue="ship"} 0
# HELP tinymq_queue_expired_total Messages whose TTL passed before a consumer got them.
# TYPE tinymq_queue_expired_total counter
tinymq_queue_expired_total{queue="bill"} 0
tinymq_queue_expired_total{queue="dead"} 0
tinymq_queue_expired_total{queue="drophead"} 0
tinymq_queue_expired_total{queue="expire"} 1
tinymq_queue_expired_total{queue="reject"} 0
tinymq_queue_expired_total{queue="ship"} 0
# HELP tinymq_queue_overflowed_total Messages evicted by a DropHead length limit.
# TYPE tinymq_queue_overflowed_total counter
tinymq_queue_overflowed_total{queue="bill"} 0
tinymq_queue_overflowed_total{queue="dead"} 0
tinymq_queue_overflowed_total{queue="drophead"} 3
tinymq_queue_overflowed_total{queue="expire"} 0
tinymq_queue_overflowed_total{queue="reject"} 0
tinymq_queue_overflowed_total{queue="ship"} 0
# HELP tinymq_queue_rejected_total Publishes refused because the queue was full.
# TYPE tinymq_queue_rejected_total counter
tinymq_queue_rejected_total{queue="bill"} 0
tinymq_queue_rejected_total{queue="dead"} 0
tinymq_queue_rejected_total{queue="drophead"} 0
tinymq_queue_rejected_total{queue="expire"} 0
tinymq_queue_rejected_total{queue="reject"} 1
tinymq_queue_rejected_total{queue="ship"} 0
# HELP tinymq_queue_dropped_total Dead messages with no dead-letter exchange, or one that could not route them.
# TYPE tinymq_queue_dropped_total counter
tinymq_queue_dropped_total{queue="bill"} 0
tinymq_queue_dropped_total{queue="dead"} 0
tinymq_queue_dropped_total{queue="drophead"} 3
tinymq_queue_dropped_total{queue="expire"} 1
tinymq_queue_dropped_total{queue="reject"} 0
tinymq_queue_dropped_total{queue="ship"} 0
# HELP tinymq_queue_undelivered_total Messages a Shutdown deadline, or a Stop before Start, kept from a consumer, and those Stop left in a queue no consumer takes.
# TYPE tinymq_queue_undelivered_total counter
tinymq_queue_undelivered_total{queue="bill"} 0
tinymq_queue_undelivered_total{queue="dead"} 0
tinymq_queue_undelivered_total{queue="drophead"} 0
tinymq_queue_undelivered_total{queue="expire"} 0
tinymq_queue_undelivered_total{queue="reject"} 0
tinymq_queue_undelivered_total{queue="ship"} 0
`

var counterNames = []string{
	"tinymq_exchange_published_total", "tinymq_exchange_unroutable_total",
	"tinymq_queue_accepted_total", "tinymq_queue_delivered_total", "tinymq_queue_succeeded_total",
	"tinymq_queue_failed_total", "tinymq_queue_retried_total", "tinymq_queue_dead_lettered_total",
	"tinymq_queue_expired_total", "tinymq_queue_overflowed_total", "tinymq_queue_rejected_total",
	"tinymq_queue_dropped_total", "tinymq_queue_undelivered_total",
}

func TestCollectEveryCounter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := tinymqprom.NewCollector(scenario(t))
		require.NoError(t, err)
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(wantCounters), counterNames...))

		// Stopped, nothing waits or runs: every gauge is 0, for every queue.
		for _, name := range []string{"tinymq_queue_messages_ready", "tinymq_queue_messages_scheduled", "tinymq_queue_messages_in_flight"} {
			vals := values(t, c, name)
			assert.Len(t, vals, 6, name)
			for q, v := range vals {
				assert.Zero(t, v, "%s{queue=%q}", name, q)
			}
		}
	})
}

func TestLint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := tinymqprom.NewCollector(scenario(t))
		require.NoError(t, err)
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		assert.Empty(t, problems)
	})
}

// values is gather's values of one metric.
func values(t *testing.T, c prometheus.Collector, name string) map[string]float64 {
	t.Helper()
	all, err := gather(c)
	require.NoError(t, err)
	return all[name]
}

func TestGaugesWhileRunning(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil
	}, 1, tinymq.WithQueueName("jobs")))
	require.NoError(t, mq.Start(t.Context()))
	defer func() {
		close(release)
		_ = mq.Shutdown(canceled(t)) // drops the delayed message, and those behind
		mq.Stop()
	}()

	require.NoError(t, mq.Publish("jobs", 0))
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer was not called")
	}
	// Published once the only worker is stuck, so that they stay ready (a
	// worker takes a batch of what is ready, and Stats counts the messages of
	// a batch neither as ready nor in flight).
	for i := range 3 {
		require.NoError(t, mq.Publish("jobs", i+1))
	}
	require.NoError(t, mq.Publish("jobs", 99, tinymq.WithDelay(time.Hour)))

	// One message is stuck in the consumer: Collect must not wait for it.
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	type result struct {
		vals map[string]map[string]float64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		vals, err := gather(c)
		done <- result{vals, err}
	}()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		assert.Equal(t, map[string]float64{"jobs": 1}, r.vals["tinymq_queue_messages_in_flight"])
		assert.Equal(t, map[string]float64{"jobs": 3}, r.vals["tinymq_queue_messages_ready"])
		assert.Equal(t, map[string]float64{"jobs": 1}, r.vals["tinymq_queue_messages_scheduled"])
		assert.Equal(t, map[string]float64{"jobs": 5}, r.vals["tinymq_queue_accepted_total"])
	case <-time.After(10 * time.Second):
		t.Fatal("Collect waited for a consumer")
	}
}

// gather registers c alone and returns the value of every counter and gauge,
// by metric name and then by the value of its one variable label.
func gather(c prometheus.Collector) (map[string]map[string]float64, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		vals := map[string]float64{}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != 1 {
				continue
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				vals[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				vals[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		out[mf.GetName()] = vals
	}
	return out, nil
}

func canceled(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	return ctx
}

func TestNewCollectorRefuses(t *testing.T) {
	mq := tinymq.New()
	for _, tc := range []struct {
		name string
		mq   *tinymq.MQ
		opts []tinymqprom.Option
	}{
		{"nil mq", nil, nil},
		{"nil option", mq, []tinymqprom.Option{nil}},
		{"no buckets", mq, []tinymqprom.Option{tinymqprom.WithBuckets()}},
		{"decreasing buckets", mq, []tinymqprom.Option{tinymqprom.WithBuckets(1, 0.5)}},
		{"equal buckets", mq, []tinymqprom.Option{tinymqprom.WithBuckets(1, 1)}},
		{"own label", mq, []tinymqprom.Option{tinymqprom.WithConstLabels(prometheus.Labels{"queue": "x"})}},
		{"le label", mq, []tinymqprom.Option{tinymqprom.WithConstLabels(prometheus.Labels{"le": "x"})}},
		{"bad label", mq, []tinymqprom.Option{tinymqprom.WithConstLabels(prometheus.Labels{"a-b": "x"})}},
		{"reserved label", mq, []tinymqprom.Option{tinymqprom.WithConstLabels(prometheus.Labels{"__x": "x"})}},
		{"label value not UTF-8", mq, []tinymqprom.Option{tinymqprom.WithConstLabels(prometheus.Labels{"mq": "a\xff"})}},
		{"reason label", mq, []tinymqprom.Option{tinymqprom.WithConstLabels(prometheus.Labels{"reason": "x"})}},
		{"NaN bucket", mq, []tinymqprom.Option{tinymqprom.WithBuckets(1, math.NaN())}},
		{"negative stuck after", mq, []tinymqprom.Option{tinymqprom.WithStuckAfter(-time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tinymqprom.NewCollector(tc.mq, tc.opts...)
			assert.Error(t, err)
			assert.Nil(t, c)
		})
	}
}

func TestTwoMQsWithConstLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, name := range []string{"billing", "shipping"} {
		mq := tinymq.New()
		require.NoError(t, mq.RegisterQueue("events", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("events")))
		c, err := tinymqprom.NewCollector(mq, tinymqprom.WithConstLabels(prometheus.Labels{"mq": name}))
		require.NoError(t, err)
		require.NoError(t, reg.Register(c))
	}
	n, err := testutil.GatherAndCount(reg, "tinymq_queue_accepted_total")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	// Without the labels the second one collides with the first.
	mq := tinymq.New()
	require.NoError(t, mq.DeclareExchange("events", tinymq.Fanout))
	c1, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	c2, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	reg2 := prometheus.NewRegistry()
	require.NoError(t, reg2.Register(c1))
	assert.Error(t, reg2.Register(c2))
}

// TestScrapeOverHTTP serves a registry on loopback, as an application would,
// and parses what a Prometheus server would read.
func TestScrapeOverHTTP(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	require.NoError(t, mq.RegisterQueue("user.created", tinymq.Fanout,
		c.Instrument(func(_ context.Context, m *tinymq.Msg) error {
			if m.Data.(int)%2 == 1 {
				return errBill
			}
			return nil
		}), 2, tinymq.WithQueueName("welcome")))
	require.NoError(t, mq.Start(t.Context()))
	for i := range 10 {
		require.NoError(t, mq.Publish("user.created", i))
	}
	mq.Stop()

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	require.True(t, strings.HasPrefix(srv.URL, "http://127.0.0.1:"), srv.URL)

	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)

	byQueue := func(name string) float64 {
		mf := mfs[name]
		require.NotNil(t, mf, name)
		require.Len(t, mf.GetMetric(), 1, name)
		assert.Equal(t, "welcome", mf.GetMetric()[0].GetLabel()[0].GetValue())
		return mf.GetMetric()[0].GetCounter().GetValue()
	}
	assert.Equal(t, 10.0, byQueue("tinymq_queue_delivered_total"))
	assert.Equal(t, 5.0, byQueue("tinymq_queue_succeeded_total"))
	assert.Equal(t, 5.0, byQueue("tinymq_queue_failed_total"))
	assert.Equal(t, 5.0, byQueue("tinymq_queue_dropped_total"))
	assert.Equal(t, dto.MetricType_COUNTER, mfs["tinymq_exchange_published_total"].GetType())
	assert.Equal(t, dto.MetricType_GAUGE, mfs["tinymq_queue_messages_ready"].GetType())
	assert.Nil(t, mfs["tinymq_queue_consumer_time_seconds"], "the summary is gone")

	hist := mfs["tinymq_queue_consumer_duration_seconds"]
	require.NotNil(t, hist)
	require.Equal(t, dto.MetricType_HISTOGRAM, hist.GetType())
	require.Len(t, hist.GetMetric(), 1)
	m := hist.GetMetric()[0]
	require.Len(t, m.GetLabel(), 1)
	assert.Equal(t, "welcome", m.GetLabel()[0].GetValue())
	assert.Equal(t, uint64(10), m.GetHistogram().GetSampleCount(), "every call, failed ones included")
	assert.Len(t, m.GetHistogram().GetBucket(), len(tinymqprom.DefaultBuckets)+1, "and +Inf")
	assert.Equal(t, 0.0, byQueue("tinymq_queue_calls_stuck"))
}

// TestCollectRacingPublishers scrapes over and over while publishers and
// consumers run; under -race it checks that the Collector shares nothing
// unsafely, and that every counter only grows from scrape to scrape.
func TestCollectRacingPublishers(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	const queues, publishers, each = 8, 4, 500
	for i := range queues {
		require.NoError(t, mq.RegisterQueue(fmt.Sprintf("ex%d", i), tinymq.Fanout,
			c.Instrument(func(context.Context, *tinymq.Msg) error { return nil }), 1,
			tinymq.WithQueueName(fmt.Sprintf("q%d", i))))
	}
	require.NoError(t, mq.Start(t.Context()))

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	stop := make(chan struct{})
	scraped := make(chan error, 1)
	go func() {
		last := map[string]float64{}
		for {
			mfs, err := reg.Gather()
			if err != nil {
				scraped <- err
				return
			}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					var v float64
					switch mf.GetType() {
					case dto.MetricType_COUNTER:
						v = m.GetCounter().GetValue()
					case dto.MetricType_HISTOGRAM:
						v = float64(m.GetHistogram().GetSampleCount())
					default:
						continue
					}
					key := mf.GetName()
					for _, l := range m.GetLabel() {
						key += "," + l.GetName() + "=" + l.GetValue()
					}
					if v < last[key] {
						scraped <- fmt.Errorf("%s went down: %v after %v", key, v, last[key])
						return
					}
					last[key] = v
				}
			}
			select {
			case <-stop:
				scraped <- nil
				return
			default:
			}
		}
	}()
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, mq.Publish(fmt.Sprintf("ex%d", (p+i)%queues), i))
			}
		})
	}
	wg.Wait()
	mq.Stop()
	close(stop)
	require.NoError(t, <-scraped)

	var total float64
	for _, v := range values(t, c, "tinymq_queue_succeeded_total") {
		total += v
	}
	assert.Equal(t, float64(publishers*each), total)
}

// Each binding of a queue is an info metric, so that a query can label a
// queue's metrics with the exchanges it is bound to.
func TestBindingInfo(t *testing.T) {
	m := tinymq.New()
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	require.NoError(t, m.RegisterQueue("users", tinymq.Fanout, nop, 1, tinymq.WithQueueName("audit")))
	require.NoError(t, m.RegisterQueue("orders", tinymq.Topic, nop, 1, tinymq.WithQueueName("billing"),
		tinymq.WithBindingKey("order.*"), tinymq.WithBindingKey("order.#")))
	require.NoError(t, m.Bind("audit", "orders", tinymq.Topic, tinymq.WithBindingKey("#")))
	c, err := tinymqprom.NewCollector(m)
	require.NoError(t, err)
	want := `
# HELP tinymq_queue_binding_info 1 for each exchange the queue is bound to: join on queue to label a queue's metrics with its exchanges.
# TYPE tinymq_queue_binding_info gauge
tinymq_queue_binding_info{exchange="orders",queue="audit"} 1
tinymq_queue_binding_info{exchange="orders",queue="billing"} 1
tinymq_queue_binding_info{exchange="users",queue="audit"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "tinymq_queue_binding_info"))
	m.Stop()
}

// TestNamesThatAreNotUTF8NeverBreakTheScrape serves a real registry over
// loopback with an exchange and queues whose names are not valid UTF-8: the
// scrape must answer 200 with every metric, each name as its own series.
func TestNamesThatAreNotUTF8NeverBreakTheScrape(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	done := make(chan struct{}, 3)
	ok := c.Instrument(func(context.Context, *tinymq.Msg) error { done <- struct{}{}; return nil })
	// Two names that differ only in their invalid byte, and a valid name that
	// reads like the escaped form of one of them.
	queues := map[string]string{"q\xfe": `q\xfe`, "q\xff": `q\xff`, `q\xff`: `q\\xff`}
	for name := range queues {
		require.NoError(t, mq.RegisterQueue("ex\xff", tinymq.Fanout, ok, 1, tinymq.WithQueueName(name)))
	}
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ex\xff", 1))
	for range queues {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a consumer was not called")
		}
	}
	mq.Stop()

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)

	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	want := map[string]float64{}
	for _, v := range queues {
		want[v] = 1
	}
	for _, name := range append(append([]string(nil), counterNames[2:]...), "tinymq_queue_consumer_duration_seconds") {
		mf := mfs[name]
		require.NotNil(t, mf, name)
		got := map[string]float64{}
		for _, m := range mf.GetMetric() {
			got[label(m, "queue")] = m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
		switch name {
		case "tinymq_queue_accepted_total", "tinymq_queue_delivered_total", "tinymq_queue_succeeded_total",
			"tinymq_queue_consumer_duration_seconds":
			assert.Equal(t, want, got, name)
		default:
			assert.Len(t, got, len(queues), name)
		}
	}
	published := mfs["tinymq_exchange_published_total"]
	require.NotNil(t, published)
	require.Len(t, published.GetMetric(), 1)
	assert.Equal(t, `ex\xff`, label(published.GetMetric()[0], "exchange"))
	assert.Equal(t, 1.0, published.GetMetric()[0].GetCounter().GetValue())
	bindings := map[[2]string]bool{}
	for _, m := range mfs["tinymq_queue_binding_info"].GetMetric() {
		bindings[[2]string{label(m, "exchange"), label(m, "queue")}] = true
	}
	assert.Len(t, bindings, len(queues))
	for _, v := range queues {
		assert.True(t, bindings[[2]string{`ex\xff`, v}], v)
	}
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestCollectorPanicNeverFailsTheScrape makes Collect panic inside Stats: the
// scrape must still answer 200 with the Collector's other metrics, and count
// the panic in tinymq_collector_errors_total.
func TestCollectorPanicNeverFailsTheScrape(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	tinymqprom.SetReadHook(c, func(string) { panic("stats broke") })

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for scrape := 1; scrape <= 2; scrape++ {
		resp, err := srv.Client().Get(srv.URL + "/metrics")
		require.NoError(t, err)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, "scrape %d", scrape)
		require.NoError(t, err)
		errs := mfs["tinymq_collector_errors_total"]
		require.NotNil(t, errs)
		assert.Equal(t, float64(scrape), errs.GetMetric()[0].GetCounter().GetValue(), "one panic per scrape")
	}
}

// labelValues returns the values of label in every series of family.
func labelValues(mfs []*dto.MetricFamily, family, label string) []string {
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out = append(out, lp.GetValue())
				}
			}
		}
	}
	return out
}

// collectorErrors returns the sum of tinymq_collector_errors_total, or -1 if
// the family is missing.
func collectorErrors(mfs []*dto.MetricFamily) float64 {
	for _, mf := range mfs {
		if mf.GetName() == "tinymq_collector_errors_total" {
			var s float64
			for _, m := range mf.GetMetric() {
				s += m.GetCounter().GetValue()
			}
			return s
		}
	}
	return -1
}

// TestEveryNameThatIsNotUTF8IsEscapedAsDocumented: names with every kind of
// invalid UTF-8 (a lone byte, a cut sequence, an encoded surrogate, a code
// point past U+10FFFF), with backslashes, an unnamed queue named after a bad
// exchange, and an unregistered durable queue restored from the log under a
// bad name are each labelled as the package doc says, in their own series;
// the scrape never fails, in any exposition format.
func TestEveryNameThatIsNotUTF8IsEscapedAsDocumented(t *testing.T) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	dir := t.TempDir()
	// A durable queue with a bad name left in the log, to come back Unregistered.
	m0 := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m0.RegisterQueue("ex\xfe", tinymq.Fanout, nop, 1, tinymq.WithQueueName("orphan\xff\xfe"), tinymq.WithDurable()))
	require.NoError(t, m0.Publish("ex\xfe", 1))
	require.NoError(t, m0.Publish("ex\xfe", 2))
	require.ErrorIs(t, m0.Shutdown(t.Context()), tinymq.ErrUndelivered, "before Start: they stay in the log")

	m := tinymq.New(tinymq.WithDataDir(dir))
	c, err := tinymqprom.NewCollector(m)
	require.NoError(t, err)
	names := map[string]string{ // name -> label
		"q\xff":            `q\xff`,
		`q\xff`:            `q\\xff`,
		"\xc3\x28":         `\xc3(`,
		"caf\u00e9":        "caf\u00e9",
		`back\slash`:       `back\\slash`,
		"\xed\xa0\x80":     `\xed\xa0\x80`,     // a UTF-16 surrogate encoded: not valid UTF-8
		"\xf4\x90\x80\x80": `\xf4\x90\x80\x80`, // beyond U+10FFFF
	}
	for name := range names {
		require.NoError(t, m.RegisterQueue("ex\xfe", tinymq.Fanout, c.Instrument(nop), 1, tinymq.WithQueueName(name)))
	}
	require.NoError(t, m.RegisterQueue("bad\x80ex", tinymq.Fanout, c.Instrument(nop), 1)) // named after its exchange
	require.NoError(t, m.Start(t.Context()))
	require.NoError(t, m.Publish("ex\xfe", "hello"))
	require.NoError(t, m.Publish("bad\x80ex", "hello"))
	require.Eventually(t, func() bool {
		for name, q := range m.Stats().Queues {
			if name != "orphan\xff\xfe" && q.Succeeded == 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err, "the scrape must not fail")
	assert.Zero(t, collectorErrors(mfs), "tinymq_collector_errors_total")

	qs := labelValues(mfs, "tinymq_queue_accepted_total", "queue")
	seen := map[string]bool{}
	for _, q := range qs {
		assert.True(t, utf8.ValidString(q), "label %q", q)
		assert.False(t, seen[q], "two names share the series %q", q)
		seen[q] = true
	}
	for name, want := range names {
		assert.True(t, seen[want], "name %q should be labelled %q; got %q", name, want, qs)
	}
	assert.Contains(t, labelValues(mfs, "tinymq_queue_messages_ready", "queue"), `orphan\xff\xfe`, "the unregistered durable queue's label")
	exs := labelValues(mfs, "tinymq_exchange_published_total", "exchange")
	assert.Contains(t, exs, `ex\xfe`)
	assert.Contains(t, exs, `bad\x80ex`)
	hq := labelValues(mfs, "tinymq_queue_consumer_duration_seconds", "queue")
	assert.Contains(t, hq, `q\xff`, "Instrument's label")
	for _, q := range hq {
		assert.True(t, utf8.ValidString(q), "Instrument's label %q", q)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	for _, accept := range []string{"text/plain", "application/openmetrics-text; version=1.0.0",
		"application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("Accept", accept)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", accept, body)
		if strings.HasPrefix(accept, "text") {
			assert.True(t, utf8.Valid(body), accept)
		}
	}
	m.Stop()
}

// TestScrapesRacingInvalidNamesAndStopNeverFail scrapes while queues with
// random names that are not valid UTF-8 are registered and published to, and
// while the MQ stops: no scrape fails or counts an error.
func TestScrapesRacingInvalidNamesAndStopNeverFail(t *testing.T) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	m := tinymq.New()
	c, err := tinymqprom.NewCollector(m, tinymqprom.WithConstLabels(prometheus.Labels{"mq": "x"}))
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.NoError(t, m.Start(t.Context()))
	var stopping sync.WaitGroup
	stopAsync := sync.OnceFunc(func() { stopping.Go(m.Stop) })
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			b := fmt.Appendf(nil, "q%d", i)
			b = append(b, byte(0x80+i%0x80), '\\', byte(0xff-i%3))
			ex := string([]byte{'e', byte(0xc0 + i%2)})
			_ = m.RegisterQueue(ex, tinymq.Fanout, c.Instrument(nop), 1, tinymq.WithQueueName(string(b)))
			_ = m.Publish(ex, i)
			if i == 300 {
				stopAsync() // a Stop racing the scrapes
			}
		}
	})
	for range 20 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		assert.Zero(t, collectorErrors(mfs))
	}
	close(done)
	wg.Wait()
	stopAsync()
	stopping.Wait()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	assert.Zero(t, collectorErrors(mfs))
}

func TestRunTimeTopologyIsExported(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue("parked", "ev", tinymq.Fanout))
	require.NoError(t, mq.DeclareQueue("gone", "ev", tinymq.Fanout))
	sub, err := mq.Consume("parked", func(context.Context, *tinymq.Msg) error { return nil }, 2)
	require.NoError(t, err)
	require.NoError(t, mq.PauseQueue("parked"))
	for i := range 3 {
		require.NoError(t, mq.Publish("ev", i))
	}
	n, err := mq.PurgeQueue("parked")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = mq.DeleteQueue("gone")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)

	assert.Equal(t, map[string]float64{"parked": 1}, values(t, c, "tinymq_queue_consumers"))
	assert.Equal(t, map[string]float64{"parked": 1}, values(t, c, "tinymq_queue_paused"))
	assert.Equal(t, map[string]float64{"parked": 3}, values(t, c, "tinymq_queue_purged_total"))
	assert.Equal(t, map[string]float64{"deleted": 1, "expired": 0}, values(t, c, "tinymq_queues_deleted_total"))
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP tinymq_deleted_queues_messages_removed_total Messages that the deletes of their queues removed: waiting ones, and those whose delivery failed after the delete.
# TYPE tinymq_deleted_queues_messages_removed_total counter
tinymq_deleted_queues_messages_removed_total 3
`), "tinymq_deleted_queues_messages_removed_total"))
	require.NoError(t, sub.Cancel(t.Context()))
	mq.Stop()
}

// The job-queue counters: a delivery that outlives WithDeliveryTimeout
// counts in tinymq_queue_timed_out_total and, while its call still runs, in
// tinymq_queue_calls_abandoned; a publish that WithDeduplication finds
// accepted already counts in tinymq_exchange_duplicates_total. It runs in a
// synctest bubble for the timeout.
func TestJobQueueCounters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		mq := tinymq.New()
		// stuck ignores its context until release is closed.
		require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release
			return nil
		}, 2, tinymq.WithQueueName("slow"), tinymq.WithDeliveryTimeout(time.Second),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour})))
		require.NoError(t, mq.DeclareExchange("once", tinymq.Fanout, tinymq.WithDeduplication(time.Minute)))
		require.NoError(t, mq.RegisterQueue("once", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil },
			1, tinymq.WithQueueName("paid")))
		require.NoError(t, mq.Start(t.Context()))
		c, err := tinymqprom.NewCollector(mq)
		require.NoError(t, err)

		for i := range 2 {
			require.NoError(t, mq.Publish("jobs", i))
		}
		for range 3 {
			require.NoError(t, mq.Publish("once", "pay", tinymq.WithDeduplicationID("invoice-7")))
		}
		require.NoError(t, mq.Publish("once", "pay", tinymq.WithDeduplicationID("invoice-8")))
		time.Sleep(2 * time.Second) // the bubble's clock: both calls time out
		synctest.Wait()

		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP tinymq_exchange_duplicates_total Publishes that WithDeduplication found accepted already within its window: they returned nil and routed nothing.
# TYPE tinymq_exchange_duplicates_total counter
tinymq_exchange_duplicates_total{exchange="jobs"} 0
tinymq_exchange_duplicates_total{exchange="once"} 2
# HELP tinymq_queue_timed_out_total Deliveries that failed because the consumer outlived WithDeliveryTimeout (each also counts as failed).
# TYPE tinymq_queue_timed_out_total counter
tinymq_queue_timed_out_total{queue="paid"} 0
tinymq_queue_timed_out_total{queue="slow"} 2
# HELP tinymq_queue_calls_abandoned Consumer calls of the queue that outlived WithDeliveryTimeout and still run, their worker slots taken by new goroutines.
# TYPE tinymq_queue_calls_abandoned gauge
tinymq_queue_calls_abandoned{queue="paid"} 0
tinymq_queue_calls_abandoned{queue="slow"} 2
`), "tinymq_exchange_duplicates_total", "tinymq_queue_timed_out_total", "tinymq_queue_calls_abandoned"))
		vals, err := gather(c)
		require.NoError(t, err)
		assert.Equal(t, map[string]float64{"jobs": 2, "once": 2}, vals["tinymq_exchange_published_total"],
			"duplicates are not published")
		assert.Equal(t, map[string]float64{"paid": 0, "slow": 2}, vals["tinymq_queue_failed_total"],
			"a timed-out delivery failed")
		assert.Equal(t, map[string]float64{"paid": 0, "slow": 2}, vals["tinymq_queue_retried_total"])

		close(release) // the abandoned calls return
		synctest.Wait()
		vals, err = gather(c)
		require.NoError(t, err)
		assert.Equal(t, map[string]float64{"paid": 0, "slow": 0}, vals["tinymq_queue_calls_abandoned"],
			"no call is abandoned once they returned")
		assert.Equal(t, map[string]float64{"paid": 0, "slow": 2}, vals["tinymq_queue_timed_out_total"], "counters only grow")
		// The retries wait an hour: Shutdown's deadline drops them.
		require.ErrorIs(t, mq.Shutdown(canceled(t)), context.Canceled)
		mq.Stop()
	})
}

// A dead letter that ReplayDeadLetters moves back counts in
// tinymq_queue_replayed_total of the queue it left, so that the queue's
// ledger adds up (it is neither succeeded nor dropped there).
func TestReplayedCounter(t *testing.T) {
	var fixed atomic.Bool
	done := make(chan struct{}, 2)
	mq := tinymq.New(tinymq.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		defer func() { done <- struct{}{} }()
		if !fixed.Load() {
			return errBill
		}
		return nil
	}, 1, tinymq.WithQueueName("bill"), tinymq.WithDeadLetter("orders.dead", "")))
	require.NoError(t, mq.DeclareQueue("parked", "orders.dead", tinymq.Fanout))
	require.NoError(t, mq.Start(t.Context()))
	defer mq.Stop()
	require.NoError(t, mq.Publish("orders", 1))
	<-done
	require.Eventually(t, func() bool { return mq.Stats().Queues["parked"].Depth == 1 }, 10*time.Second, time.Millisecond)
	fixed.Store(true)
	n, err := mq.ReplayDeadLetters("parked", 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	<-done
	require.Eventually(t, func() bool { return mq.Stats().Queues["bill"].Succeeded == 1 }, 10*time.Second, time.Millisecond)

	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"bill": 0, "parked": 1}, values(t, c, "tinymq_queue_replayed_total"))
}

// The Collector shares each queue's label pairs between its metrics and
// between scrapes; a registry that wraps it and adds labels must copy them,
// not write into them: every scrape has each series with exactly its own
// labels.
func TestWrappedRegistererAddsLabelsToEveryScrape(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	mq := tinymq.New(tinymqprom.Instrument(prometheus.WrapRegistererWith(prometheus.Labels{"env": "prod"}, reg),
		tinymqprom.WithConstLabels(prometheus.Labels{"mq": "billing"})))
	for _, q := range []string{"a", "b"} {
		require.NoError(t, mq.DeclareQueue(q, "ex", tinymq.Fanout))
	}
	for scrape := range 3 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "tinymq_queue_") || mf.GetName() == "tinymq_queue_binding_info" {
				continue
			}
			require.Len(t, mf.GetMetric(), 2, "%s, scrape %d", mf.GetName(), scrape)
			for i, m := range mf.GetMetric() {
				var got []string
				for _, l := range m.GetLabel() {
					got = append(got, l.GetName()+"="+l.GetValue())
				}
				assert.Equal(t, []string{"env=prod", "mq=billing", "queue=" + []string{"a", "b"}[i]}, got,
					"%s, scrape %d", mf.GetName(), scrape)
			}
		}
	}
	mq.Stop()
}

func TestOldestMessageAgeIsExported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mq := tinymq.New()
		require.NoError(t, mq.DeclareQueue("idle", "ev", tinymq.Fanout))
		require.NoError(t, mq.DeclareQueue("waiting", "work", tinymq.Fanout))
		require.NoError(t, mq.Start(context.Background()))
		defer mq.Stop()
		require.NoError(t, mq.Publish("work", "job"))
		time.Sleep(90 * time.Second)
		c, err := tinymqprom.NewCollector(mq)
		require.NoError(t, err)
		got := values(t, c, "tinymq_queue_oldest_message_age_seconds")
		assert.Equal(t, 0.0, got["idle"], "nothing waits")
		assert.InDelta(t, 90, got["waiting"], 0.011, "the job has waited 90s")
	})
}
