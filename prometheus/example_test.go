package tinymqprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/tinymq/tinymq"
	tinymqprom "github.com/tinymq/tinymq/prometheus"
)

// A Collector exports what Stats counts; register it with any registry.
func ExampleNewCollector() {
	mq := tinymq.New()
	_ = mq.RegisterQueue("user.created", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		if m.Data.(int) == 2 {
			return errors.New("mail server down")
		}
		return nil
	}, 1, tinymq.WithQueueName("welcome"))
	_ = mq.Start(context.Background())
	for i := range 3 {
		_ = mq.Publish("user.created", i)
	}
	mq.Stop()

	c, err := tinymqprom.NewCollector(mq)
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	out, _ := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain,
		"tinymq_exchange_published_total", "tinymq_queue_succeeded_total", "tinymq_queue_failed_total")
	for line := range strings.Lines(string(out)) {
		if !strings.HasPrefix(line, "#") {
			fmt.Print(line)
		}
	}
	// Output:
	// tinymq_exchange_published_total{exchange="user.created"} 3
	// tinymq_queue_failed_total{queue="welcome"} 1
	// tinymq_queue_succeeded_total{queue="welcome"} 2
}

// Instrument is one option of New: every queue and every consumer of the MQ
// is then measured, and the Collector is registered with reg.
func ExampleInstrument() {
	reg := prometheus.NewRegistry()
	mq := tinymq.New(tinymqprom.Instrument(reg, tinymqprom.WithBuckets(0.001, 0.01, 0.1, 1)))
	_ = tinymq.RegisterHandler(mq, "orders", tinymq.Fanout, func(context.Context, string) error {
		return nil // ship the order
	}, 2, tinymq.WithQueueName("ship"))
	_ = mq.Start(context.Background())
	for _, id := range []string{"a", "b", "c"} {
		_ = mq.Publish("orders", id)
	}
	mq.Stop()

	out, _ := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain,
		"tinymq_queue_delivered_total", "tinymq_queue_consumer_duration_seconds", "tinymq_queue_calls_stuck")
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, "_delivered_total{") || strings.Contains(line, "_count{") ||
			strings.Contains(line, "_stuck{") {
			fmt.Print(line)
		}
	}
	// Output:
	// tinymq_queue_calls_stuck{queue="ship"} 0
	// tinymq_queue_consumer_duration_seconds_count{queue="ship"} 3
	// tinymq_queue_delivered_total{queue="ship"} 3
}

// Collector.Instrument wraps one consumer, for an MQ made without the
// Instrument option: its queue gets the histogram and the stuck gauge.
func ExampleCollector_Instrument() {
	mq := tinymq.New()
	c, _ := tinymqprom.NewCollector(mq, tinymqprom.WithBuckets(0.001, 0.01, 0.1, 1))
	_ = mq.RegisterQueue("orders", tinymq.Fanout, c.Instrument(func(context.Context, *tinymq.Msg) error {
		return nil // handle the order
	}), 2, tinymq.WithQueueName("ship"))
	_ = mq.Start(context.Background())
	for i := range 5 {
		_ = mq.Publish("orders", i)
	}
	mq.Stop()

	out, _ := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "tinymq_queue_consumer_duration_seconds")
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, `le="+Inf"`) || strings.Contains(line, "_count{") {
			fmt.Print(line)
		}
	}
	// Output:
	// tinymq_queue_consumer_duration_seconds_bucket{queue="ship",le="+Inf"} 5
	// tinymq_queue_consumer_duration_seconds_count{queue="ship"} 5
}

// InstrumentHandler is Instrument for an MQ of many queues: nothing is
// registered, and the handler it returns streams the metrics on a path of
// their own.
func ExampleInstrumentHandler() {
	opt, metrics := tinymqprom.InstrumentHandler()
	mq := tinymq.New(opt)
	_ = tinymq.RegisterHandler(mq, "orders", tinymq.Fanout, func(context.Context, string) error {
		return nil // ship the order
	}, 2, tinymq.WithQueueName("ship"))
	_ = mq.Start(context.Background())
	for _, id := range []string{"a", "b", "c"} {
		_ = mq.Publish("orders", id)
	}
	mq.Stop()

	mux := http.NewServeMux()
	mux.Handle("/metrics/tinymq", metrics) // scraped as a job of its own
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics/tinymq", nil))
	fmt.Println(rec.Header().Get("Content-Type"))
	for line := range strings.Lines(rec.Body.String()) {
		if strings.Contains(line, "_delivered_total{") || strings.Contains(line, "_count{") {
			fmt.Print(line)
		}
	}
	// Output:
	// text/plain; version=0.0.4; charset=utf-8
	// tinymq_queue_consumer_duration_seconds_count{queue="ship"} 3
	// tinymq_queue_delivered_total{queue="ship"} 3
}

// Collector.Handler serves a Collector made with NewCollector, unregistered,
// as the registry route would.
func ExampleCollector_Handler() {
	mq := tinymq.New()
	_ = mq.DeclareQueue("audit", "users", tinymq.Fanout)
	_ = mq.Publish("users", "ann")
	c, _ := tinymqprom.NewCollector(mq)

	rec := httptest.NewRecorder()
	c.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, "tinymq_queue_messages_ready") || strings.HasPrefix(line, "tinymq_queue_binding_info") {
			fmt.Print(line)
		}
	}
	mq.Stop()
	// Output:
	// tinymq_queue_binding_info{exchange="users",queue="audit"} 1
	// tinymq_queue_messages_ready{queue="audit"} 1
}
