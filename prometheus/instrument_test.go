package tinymqprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	tinymqprom "github.com/tinymq/tinymq/prometheus"
)

// nilError is an error type whose typed nil pointer is a non-nil error.
type nilError struct{}

func (*nilError) Error() string { return "typed nil" }

// badError's Error panics.
type badError struct{}

func (*badError) Error() string { panic("Error of a typed nil") }

// histCounts returns the histogram's sample counts by queue, from a gather
// of g.
func histCounts(t *testing.T, g prometheus.Gatherer) map[string]uint64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "tinymq_queue_consumer_duration_seconds" {
			continue
		}
		require.Equal(t, dto.MetricType_HISTOGRAM, mf.GetType())
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			b := h.GetBucket()
			for i := 1; i < len(b); i++ {
				require.GreaterOrEqual(t, b[i].GetCumulativeCount(), b[i-1].GetCumulativeCount(), "buckets are cumulative")
			}
			require.LessOrEqual(t, b[len(b)-1].GetCumulativeCount(), h.GetSampleCount())
			out[queueLabel(m)] = h.GetSampleCount()
		}
	}
	return out
}

// gaugeByQueue returns the values of a gauge family by queue.
func gaugeByQueue(t *testing.T, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out[queueLabel(m)] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func queueLabel(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "queue" {
			return l.GetValue()
		}
	}
	return ""
}

// quiet discards the MQ's log, for tests whose messages are dropped on purpose.
var quiet = tinymq.WithLogger(slog.New(slog.DiscardHandler))

func collectorOf(t *testing.T, c prometheus.Collector) prometheus.Gatherer {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	return reg
}

// Instrument observes every consumer call, of every consumer form, retries
// and failures and panics included: each queue's histogram counts exactly
// the calls its consumer got, which is also Stats' Delivered.
func TestInstrumentCountsEveryCallOfEveryForm(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	mq := tinymq.New(tinymqprom.Instrument(reg), quiet)
	var mu sync.Mutex
	calls := map[string]int{}
	// outcome counts the call and fails the first attempt of 1 (retried
	// once, then a success), fails 2 for good, and panics on 3.
	outcome := func(queue string, v, attempt int) error {
		mu.Lock()
		calls[queue]++
		mu.Unlock()
		switch {
		case v == 1 && attempt == 1:
			return errBill
		case v == 2:
			return errBill
		case v == 3:
			panic("boom")
		}
		return nil
	}
	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})
	must := func(err error) { t.Helper(); require.NoError(t, err) }
	must(mq.RegisterQueue("ex.func", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		return outcome("func", m.Data.(int), m.Attempt)
	}, 2, tinymq.WithQueueName("func"), retry))
	must(tinymq.RegisterHandler(mq, "ex.handler", tinymq.Fanout, func(ctx context.Context, v int) error {
		return outcome("handler", v, 2) // a handler does not see the attempt: no retry succeeds
	}, 2, tinymq.WithQueueName("handler"), retry))
	must(tinymq.RegisterDeliveryHandler(mq, "ex.delivery", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[int]) error {
		return outcome("delivery", d.Data, d.Attempt)
	}, 2, tinymq.WithQueueName("delivery"), retry))
	for _, q := range []string{"consume", "consume.handler", "consume.deliveries"} {
		must(mq.DeclareQueue(q, "ex."+q, tinymq.Fanout, retry))
	}
	must(mq.Start(t.Context()))
	// The subscriptions come after Start: Instrument wraps them too.
	sub1, err := mq.Consume("consume", func(_ context.Context, m *tinymq.Msg) error {
		return outcome("consume", m.Data.(int), m.Attempt)
	}, 2)
	must(err)
	sub2, err := tinymq.ConsumeHandler(mq, "consume.handler", func(_ context.Context, v int) error {
		return outcome("consume.handler", v, 2)
	}, 1)
	must(err)
	sub3, err := tinymq.ConsumeDeliveries(mq, "consume.deliveries", func(_ context.Context, d tinymq.Delivery[int]) error {
		return outcome("consume.deliveries", d.Data, d.Attempt)
	}, 3)
	must(err)
	queues := []string{"func", "handler", "delivery", "consume", "consume.handler", "consume.deliveries"}
	for _, q := range queues {
		for v := range 20 {
			must(mq.Publish("ex."+q, v%5))
		}
	}
	mq.Stop() // delivers everything, retries included
	for _, s := range []*tinymq.Subscription{sub1, sub2, sub3} {
		must(s.Cancel(t.Context()))
	}

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	got := histCounts(t, reg)
	st := mq.Stats()
	for _, q := range queues {
		// 20 messages, 4 each of 0 to 4; those that fail are retried once.
		assert.GreaterOrEqual(t, calls[q], 20, q)
		assert.Equal(t, uint64(calls[q]), got[q], "%s: the histogram counts every call", q)
		assert.Equal(t, st.Queues[q].Delivered, got[q], "%s: as Stats' Delivered does", q)
	}
	assert.Len(t, got, len(queues), "one histogram per queue, no result label")
}

// A queue declared after New and after Start, and a Consume subscription,
// are instrumented: each has its histogram and stuck gauge at 0 before its
// first call, and the next scrape sees the calls.
func TestInstrumentCoversQueuesDeclaredLater(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	mq := tinymq.New(tinymqprom.Instrument(reg))
	require.NoError(t, mq.Start(t.Context()))
	defer mq.Stop()
	assert.Empty(t, histCounts(t, reg), "no queue yet")

	done := make(chan struct{}, 10)
	ok := func(context.Context, *tinymq.Msg) error { done <- struct{}{}; return nil }
	require.NoError(t, mq.RegisterQueue("late", tinymq.Fanout, ok, 1, tinymq.WithQueueName("late")))
	require.NoError(t, mq.DeclareQueue("parked", "events", tinymq.Fanout))
	assert.Equal(t, map[string]uint64{"late": 0, "parked": 0}, histCounts(t, reg), "at 0 before the first call")
	assert.Equal(t, map[string]float64{"late": 0, "parked": 0}, gaugeByQueue(t, reg, "tinymq_queue_calls_stuck"))

	sub, err := mq.Consume("parked", ok, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, sub.Cancel(t.Context())) }()
	require.NoError(t, mq.Publish("late", 1))
	for i := range 3 {
		require.NoError(t, mq.Publish("events", i))
	}
	for range 4 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a consumer was not called")
		}
	}
	// A call is observed before the worker counts it: wait for Stats, then
	// the histogram must agree.
	require.Eventually(t, func() bool {
		st := mq.Stats()
		return st.Queues["late"].Succeeded == 1 && st.Queues["parked"].Succeeded == 3
	}, 10*time.Second, time.Millisecond)
	assert.Equal(t, map[string]uint64{"late": 1, "parked": 3}, histCounts(t, reg))
}

// tinymq_queue_calls_stuck counts, at each scrape, the calls that have run
// longer than WithStuckAfter: those that block, abandoned ones included, and
// no longer once they return. It runs in a synctest bubble, so that a minute
// passes at once.
func TestStuckCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		mq := tinymq.New(tinymqprom.Instrument(reg), quiet) // WithStuckAfter's default: a minute
		release := make(chan struct{})
		entered := make(chan int, 10)
		block := func(_ context.Context, m *tinymq.Msg) error {
			entered <- m.Data.(int)
			<-release // ignores its context
			return nil
		}
		require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, block, 2, tinymq.WithQueueName("jobs")))
		// The slow queue's calls outlive WithDeliveryTimeout: abandoned,
		// they still run, and are stuck all the same.
		require.NoError(t, mq.RegisterQueue("slow", tinymq.Fanout, block, 1, tinymq.WithQueueName("slow"),
			tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, mq.RegisterQueue("idle", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("idle")))
		require.NoError(t, mq.Start(t.Context()))
		require.NoError(t, mq.Publish("jobs", 1))
		require.NoError(t, mq.Publish("jobs", 2))
		require.NoError(t, mq.Publish("slow", 3))
		require.NoError(t, mq.Publish("idle", 4))
		for range 3 {
			<-entered
		}
		synctest.Wait()
		stuck := func() map[string]float64 { return gaugeByQueue(t, reg, "tinymq_queue_calls_stuck") }
		assert.Equal(t, map[string]float64{"jobs": 0, "slow": 0, "idle": 0}, stuck(), "running, not yet stuck")

		time.Sleep(59 * time.Second)
		assert.Equal(t, map[string]float64{"jobs": 0, "slow": 0, "idle": 0}, stuck(), "59s is not a minute")
		time.Sleep(2 * time.Second)
		assert.Equal(t, map[string]float64{"jobs": 2, "slow": 1, "idle": 0}, stuck())
		assert.Equal(t, 1.0, gaugeByQueue(t, reg, "tinymq_queue_calls_abandoned")["slow"])

		close(release)
		synctest.Wait()
		assert.Equal(t, map[string]float64{"jobs": 0, "slow": 0, "idle": 0}, stuck(), "returned calls are not stuck")
		mq.Stop()
	})
}

func TestWithStuckAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		mq := tinymq.New(tinymqprom.Instrument(reg, tinymqprom.WithStuckAfter(10*time.Second)))
		release := make(chan struct{})
		require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release
			return nil
		}, 1, tinymq.WithQueueName("jobs")))
		require.NoError(t, mq.Start(t.Context()))
		require.NoError(t, mq.Publish("jobs", 1))
		synctest.Wait()
		time.Sleep(11 * time.Second)
		assert.Equal(t, map[string]float64{"jobs": 1}, gaugeByQueue(t, reg, "tinymq_queue_calls_stuck"))
		close(release)
		mq.Stop()
	})
}

// Instrument panics for what it cannot do, as MustRegister does: at once for
// a bad argument, in New for a registry that refuses the Collector.
func TestInstrumentPanics(t *testing.T) {
	assert.PanicsWithError(t, "tinymqprom: invalid collector: nil Registerer", func() { tinymqprom.Instrument(nil) })
	assert.Panics(t, func() { tinymqprom.Instrument(prometheus.NewRegistry(), tinymqprom.WithBuckets()) })
	assert.Panics(t, func() { tinymqprom.Instrument(prometheus.NewRegistry(), nil) })

	reg := prometheus.NewPedanticRegistry()
	first := tinymq.New(tinymqprom.Instrument(reg))
	defer first.Stop()
	v := func() (v any) {
		defer func() { v = recover() }()
		tinymq.New(tinymqprom.Instrument(reg)) // the same metrics again
		return nil
	}()
	err, ok := v.(error)
	require.True(t, ok, "New panics with an error: %v", v)
	var are prometheus.AlreadyRegisteredError
	assert.ErrorAs(t, err, &are)
	assert.ErrorContains(t, err, "tinymqprom: Instrument")

	// WithConstLabels tells two MQs apart in one registry.
	reg2 := prometheus.NewPedanticRegistry()
	for _, name := range []string{"billing", "shipping"} {
		mq := tinymq.New(tinymqprom.Instrument(reg2, tinymqprom.WithConstLabels(prometheus.Labels{"mq": name})))
		defer mq.Stop()
		require.NoError(t, mq.DeclareQueue("q", "ex", tinymq.Fanout))
	}
	n := 0
	mfs, err := reg2.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "tinymq_queue_accepted_total" {
			n = len(mf.GetMetric())
		}
	}
	assert.Equal(t, 2, n)

	// One option serves one MQ.
	opt := tinymqprom.Instrument(prometheus.NewRegistry())
	one := tinymq.New(opt)
	defer one.Stop()
	assert.Panics(t, func() { tinymq.New(opt) })
}

// The middleware returns the consumer's error as it is, lets a panic go on
// unrecovered, and hands the consumer its context and delivery unchanged.
func TestMiddlewarePassesThrough(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue("q", "ex", tinymq.Fanout))
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	mw := tinymqprom.Middleware(c)
	assert.Nil(t, mw(nil))

	type key struct{}
	ctx := context.WithValue(t.Context(), key{}, "v")
	d := tinymq.Delivery[any]{ID: 7, Queue: "q", Data: "x", Attempt: 2}
	errFail := errors.New("fail")
	got := mw(func(gotCtx context.Context, got tinymq.Delivery[any]) error {
		assert.Equal(t, "v", gotCtx.Value(key{}))
		assert.Equal(t, d, got)
		return errFail
	})(ctx, d)
	assert.Same(t, errFail, got)
	var bad *badError // an error whose Error panics is returned, never read
	assert.Equal(t, error(bad), mw(func(context.Context, tinymq.Delivery[any]) error { return bad })(ctx, d))
	boom := errors.New("boom")
	assert.PanicsWithValue(t, boom, func() {
		_ = mw(func(context.Context, tinymq.Delivery[any]) error { panic(boom) })(ctx, d)
	})
	assert.Equal(t, map[string]uint64{"q": 3}, histCounts(t, collectorOf(t, c)), "each call observed, the panic too")
}

// Collector.Instrument, for an MQ made without the option, observes every
// call of the consumers it wraps, into the same histogram; one wrapped
// consumer may serve several queues.
func TestCollectorInstrument(t *testing.T) {
	mq := tinymq.New(quiet)
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	var typedNil *nilError
	consumer := c.Instrument(func(_ context.Context, m *tinymq.Msg) error {
		switch m.Data.(int) {
		case 1:
			return errBill
		case 2:
			panic("boom")
		case 3:
			return typedNil // a non-nil error
		}
		return nil
	})
	for _, q := range []string{"a", "b"} {
		require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, consumer, 1, tinymq.WithQueueName(q)))
	}
	// A queue whose consumer is not wrapped has neither series.
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("plain")))
	require.NoError(t, mq.Start(t.Context()))
	for _, v := range []int{0, 0, 1, 2, 3} {
		require.NoError(t, mq.Publish("ex", v))
	}
	mq.Stop()

	g := collectorOf(t, c)
	assert.Equal(t, map[string]uint64{"a": 5, "b": 5}, histCounts(t, g))
	assert.Equal(t, map[string]float64{"a": 0, "b": 0}, gaugeByQueue(t, g, "tinymq_queue_calls_stuck"))
	for _, q := range []string{"a", "b"} { // TinyMQ saw the same: the wrapper changed nothing
		qs := mq.Stats().Queues[q]
		assert.Equal(t, uint64(2), qs.Succeeded, q)
		assert.Equal(t, uint64(3), qs.Failed, q)
	}
}

func TestCollectorInstrumentPassesThrough(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue("q", "ex", tinymq.Fanout))
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	assert.Nil(t, c.Instrument(nil))

	q := &tinymq.Msg{Queue: "q"}
	errFail := errors.New("fail")
	got := c.Instrument(func(context.Context, *tinymq.Msg) error { return errFail })(t.Context(), q)
	assert.Same(t, errFail, got)
	var bad *badError // an error whose Error panics is returned as it is, never read
	got = c.Instrument(func(context.Context, *tinymq.Msg) error { return bad })(t.Context(), q)
	assert.Equal(t, error(bad), got)
	boom := errors.New("boom") // the panic goes on with its own value, not recovered
	assert.PanicsWithValue(t, boom, func() {
		_ = c.Instrument(func(context.Context, *tinymq.Msg) error { panic(boom) })(t.Context(), q)
	})
	// A nil Msg (never from TinyMQ) is observed under queue "", which no
	// scrape exports.
	assert.NoError(t, c.Instrument(func(context.Context, *tinymq.Msg) error { return nil })(t.Context(), nil))
	assert.Equal(t, map[string]uint64{"q": 3}, histCounts(t, collectorOf(t, c)))
}

// A panic through Collector.Instrument reaches TinyMQ, which counts a failed
// delivery and dead-letters the message with the panic's text.
func TestCollectorInstrumentPanicReachesTinyMQ(t *testing.T) {
	mq := tinymq.New(quiet)
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	boom := errors.New("boom")
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, c.Instrument(func(context.Context, *tinymq.Msg) error {
		panic(boom)
	}), 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dead", "")))
	deaths := make(chan tinymq.Death, 1)
	require.NoError(t, mq.RegisterQueue("dead", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		deaths <- m.Deaths[0]
		return nil
	}, 1))
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ex", 1))
	mq.Stop()
	d := <-deaths
	assert.Contains(t, d.LastError, "boom")
	assert.Equal(t, uint64(1), mq.Stats().Queues["q"].Failed)
}

// The observers of a deleted queue are forgotten once two scrapes did not
// find it, so that queues that come and go do not pile up; a queue made
// again under its name starts a new histogram, as its counters start again,
// and a consumer wrapper that had cached the old observers finds the new
// ones (no call is lost).
func TestObserversOfDeletedQueuesAreForgotten(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	g := collectorOf(t, c)
	done := make(chan struct{}, 1)
	consumer := c.Instrument(func(context.Context, *tinymq.Msg) error { done <- struct{}{}; return nil })
	require.NoError(t, mq.Start(t.Context()))
	defer mq.Stop()
	call := func() {
		t.Helper()
		require.NoError(t, mq.Publish("ex", 1))
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the consumer was not called")
		}
		require.Eventually(t, func() bool { return mq.Stats().Queues["tmp"].Succeeded == 1 }, 10*time.Second, time.Millisecond)
	}
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, consumer, 1, tinymq.WithQueueName("tmp")))
	call()
	assert.Equal(t, map[string]uint64{"tmp": 1}, histCounts(t, g))
	assert.Equal(t, 1, tinymqprom.Observers(c))

	_, err = mq.DeleteQueue("tmp")
	require.NoError(t, err)
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		assert.NotContains(t, labelValues(mfs, mf.GetName(), "queue"), "tmp", "%s: a deleted queue has no series", mf.GetName())
	}
	assert.Equal(t, 1, tinymqprom.Observers(c), "kept for one scrape")
	assert.Empty(t, histCounts(t, g))
	assert.Equal(t, 0, tinymqprom.Observers(c), "forgotten after two")

	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, consumer, 1, tinymq.WithQueueName("tmp")))
	call()
	assert.Equal(t, map[string]uint64{"tmp": 1}, histCounts(t, g), "a new histogram, with the new call")
}

// Scrapes race queues that come and go and calls that run: under -race
// nothing is shared unsafely, no scrape fails, and once the churn stops the
// observers of the queues gone are forgotten.
func TestScrapesRacingQueuesComingAndGoing(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	opt, c := tinymqprom.InstrumentCollector(reg)
	mq := tinymq.New(opt)
	require.NoError(t, mq.Start(t.Context()))
	var calls atomic.Int64
	nop := func(context.Context, *tinymq.Msg) error { calls.Add(1); return nil }
	require.NoError(t, mq.RegisterQueue("steady", tinymq.Fanout, nop, 2))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("q%d", i%7)
			_ = mq.RegisterQueue("churn", tinymq.Fanout, nop, 1, tinymq.WithQueueName(name))
			_ = mq.Publish("churn", i)
			_ = mq.Publish("steady", i)
			_, _ = mq.DeleteQueue(name)
		}
	})
	for range 30 {
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	close(stop)
	wg.Wait()
	mq.Stop()
	for range 3 {
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	assert.Equal(t, 1, tinymqprom.Observers(c), "only the steady queue's are kept")
	assert.Equal(t, mq.Stats().Queues["steady"].Delivered, histCounts(t, reg)["steady"])
}
