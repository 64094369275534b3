package tinymqprom_test

import (
	"context"
	"errors"
	"fmt"
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

// Instrument observes every call of a consumer into a histogram with the
// buckets given to NewCollector.
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

	fmt.Println(testutil.CollectAndCount(c, "tinymq_queue_consumer_duration_seconds"), "series (success, error, panic)")
	out, _ := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "tinymq_queue_consumer_duration_seconds")
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, `result="success"`) && strings.Contains(line, "_count") {
			fmt.Print(line)
		}
	}
	// Output:
	// 3 series (success, error, panic)
	// tinymq_queue_consumer_duration_seconds_count{queue="ship",result="success"} 5
}
