package tinymqprom_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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

// histCounts returns the histogram's sample counts by queue and result.
func histCounts(t *testing.T, c prometheus.Collector) map[[2]string]uint64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[[2]string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "tinymq_queue_consumer_duration_seconds" {
			continue
		}
		require.Equal(t, dto.MetricType_HISTOGRAM, mf.GetType())
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[[2]string{l["queue"], l["result"]}] = m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

func TestInstrumentResults(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	errFail := errors.New("fail")
	var typedNil *nilError
	consumer := c.Instrument(func(_ context.Context, m *tinymq.Msg) error {
		switch m.Data.(int) {
		case 1:
			return errFail
		case 2:
			panic("boom")
		case 3:
			return typedNil // a non-nil error
		}
		return nil
	})
	// One wrapped consumer serves two queues.
	for _, q := range []string{"a", "b"} {
		require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, consumer, 1, tinymq.WithQueueName(q)))
	}
	require.NoError(t, mq.Start(t.Context()))
	for _, v := range []int{0, 0, 1, 2, 3} {
		require.NoError(t, mq.Publish("ex", v))
	}
	mq.Stop()

	assert.Equal(t, map[[2]string]uint64{
		{"a", "success"}: 2, {"a", "error"}: 2, {"a", "panic"}: 1,
		{"b", "success"}: 2, {"b", "error"}: 2, {"b", "panic"}: 1,
	}, histCounts(t, c))
	// TinyMQ saw the same: the wrapper changed nothing.
	for _, q := range []string{"a", "b"} {
		qs := mq.Stats().Queues[q]
		assert.Equal(t, uint64(2), qs.Succeeded, q)
		assert.Equal(t, uint64(3), qs.Failed, q)
	}
}

func TestInstrumentPassesThrough(t *testing.T) {
	c, err := tinymqprom.NewCollector(tinymq.New())
	require.NoError(t, err)
	assert.Nil(t, c.Instrument(nil))

	errFail := errors.New("fail")
	got := c.Instrument(func(context.Context, *tinymq.Msg) error { return errFail })(t.Context(), &tinymq.Msg{Queue: "q"})
	assert.Same(t, errFail, got)
	// An error whose Error panics is returned as it is, never read.
	var bad *badError
	got = c.Instrument(func(context.Context, *tinymq.Msg) error { return bad })(t.Context(), &tinymq.Msg{Queue: "q"})
	assert.Equal(t, error(bad), got)

	// The panic goes on with its own value, not recovered.
	boom := errors.New("boom")
	assert.PanicsWithValue(t, boom, func() {
		_ = c.Instrument(func(context.Context, *tinymq.Msg) error { panic(boom) })(t.Context(), &tinymq.Msg{Queue: "q"})
	})
	// A nil Msg (never from TinyMQ) is counted under queue "".
	assert.NoError(t, c.Instrument(func(context.Context, *tinymq.Msg) error { return nil })(t.Context(), nil))

	assert.Equal(t, map[[2]string]uint64{
		{"q", "success"}: 0, {"q", "error"}: 2, {"q", "panic"}: 1,
		{"", "success"}: 1, {"", "error"}: 0, {"", "panic"}: 0,
	}, histCounts(t, c))
}

// A panic through Instrument reaches TinyMQ, which counts a failed delivery
// and dead-letters the message with the panic's text.
func TestInstrumentPanicReachesTinyMQ(t *testing.T) {
	mq := tinymq.New()
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
