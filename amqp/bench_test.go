package amqp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// stamp is the benchmarks' payload: when it was published.
type stamp struct {
	T int64 `json:"t"`
}

const benchPublishers, benchWorkers = 4, 4

// runPipeline publishes b.N stamps from benchPublishers goroutines, each
// Publish waiting for its confirm, and reads the end-to-end latency of each
// from recv. It reports messages per second and the p50/p99 latency.
func runPipeline(b *testing.B, publish func(stamp) error, recv <-chan time.Duration) {
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, benchPublishers)
	for p := range benchPublishers {
		k := b.N / benchPublishers
		if p < b.N%benchPublishers {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range k {
				if err := publish(stamp{T: time.Now().UnixNano()}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	timeout := time.After(5 * time.Minute)
	for len(lat) < b.N {
		select {
		case d := <-recv:
			lat = append(lat, d)
		case err := <-errs:
			b.Fatal(err)
		case <-timeout:
			b.Fatalf("%d of %d messages arrived", len(lat), b.N)
		}
	}
	elapsed := time.Since(start)
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func stampConsumer(recv chan<- time.Duration) tinymq.ConsumerFunc {
	return tinymq.Handler(func(_ context.Context, s stamp) error {
		recv <- time.Since(time.Unix(0, s.T))
		return nil
	})
}

// BenchmarkPublishConsume compares, in one run, the same pipeline (4
// publishers each waiting for their message to be accepted, a queue with 4
// workers) on the in-memory engine, on RabbitMQ through this engine, and on
// RabbitMQ through amqp091-go used directly (persistent messages, confirms,
// manual acks, prefetch 4), the floor of what the engine can do.
func BenchmarkPublishConsume(b *testing.B) {
	b.Run("engine=memory", func(b *testing.B) {
		recv := make(chan time.Duration, 1024)
		m := tinymq.New()
		defer m.Stop()
		if err := m.RegisterQueue("bench", tinymq.Fanout, stampConsumer(recv), benchWorkers, tinymq.WithQueueName("bench")); err != nil {
			b.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		runPipeline(b, func(s stamp) error { return m.Publish("bench", s) }, recv)
	})
	b.Run("engine=rabbitmq", func(b *testing.B) {
		recv := make(chan time.Duration, 1024)
		m := newMQ(b)
		name := fmt.Sprintf("bench.engine.%d", time.Now().UnixNano())
		if err := m.RegisterQueue(name, tinymq.Fanout, stampConsumer(recv), benchWorkers, tinymq.WithQueueName(name)); err != nil {
			b.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		runPipeline(b, func(s stamp) error { return m.Publish(name, s) }, recv)
		m.Stop()
	})
	b.Run("amqp091-direct", func(b *testing.B) {
		benchDirect(b)
	})
}

func benchDirect(b *testing.B) {
	url := broker(b).URL()
	name := fmt.Sprintf("bench.direct.%d", time.Now().UnixNano())
	pubConn, err := amqp091.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer pubConn.Close()
	subConn, err := amqp091.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer subConn.Close()
	pub, err := pubConn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pub.QueueDeclare(name, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}
	sub, err := subConn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.Qos(benchWorkers, 0, false); err != nil {
		b.Fatal(err)
	}
	dels, err := sub.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	recv := make(chan time.Duration, 1024)
	var wg sync.WaitGroup
	for range benchWorkers {
		wg.Add(1)
		go func() { // joined below, after the connection closes dels
			defer wg.Done()
			for d := range dels {
				var s stamp
				if json.Unmarshal(d.Body, &s) == nil {
					recv <- time.Since(time.Unix(0, s.T))
				}
				_ = d.Ack(false)
			}
		}()
	}
	runPipeline(b, func(s stamp) error {
		body, err := json.Marshal(s)
		if err != nil {
			return err
		}
		dc, err := pub.PublishWithDeferredConfirm("", name, true, false, amqp091.Publishing{
			ContentType: "application/json", DeliveryMode: amqp091.Persistent, Body: body,
		})
		if err != nil {
			return err
		}
		if !dc.Wait() {
			return fmt.Errorf("nacked")
		}
		return nil
	}, recv)
	_ = sub.Close()
	wg.Wait()
}

// BenchmarkQuorumVsClassic compares, in one run on the three-node test
// cluster, the pipeline of BenchmarkPublishConsume through this engine on a
// classic queue and on a quorum queue (WithQuorumQueues: each publish is
// replicated to a majority of the nodes before its confirm). The cluster's
// start (about 30 s) is not measured.
func BenchmarkQuorumVsClassic(b *testing.B) {
	for _, quorum := range []bool{false, true} {
		name := "queue=classic"
		if quorum {
			name = "queue=quorum"
		}
		b.Run(name, func(b *testing.B) {
			recv := make(chan time.Duration, 1024)
			urls := cluster(b).URLs()
			opts := []amqp.Option{amqp.WithNodes(urls[1:]...)}
			if quorum {
				opts = append(opts, amqp.WithQuorumQueues())
			}
			m := tinymq.New(amqp.Engine(urls[0], opts...), tinymq.WithLogger(logger()))
			defer m.Stop()
			q := fmt.Sprintf("bench.%s.%d", name[len("queue="):], time.Now().UnixNano())
			if err := m.RegisterQueue(q, tinymq.Fanout, stampConsumer(recv), benchWorkers, tinymq.WithQueueName(q)); err != nil {
				b.Fatal(err)
			}
			if err := m.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			runPipeline(b, func(s stamp) error { return m.Publish(q, s) }, recv)
			m.Stop()
			cleanup := tinymq.New(amqp.Engine(urls[0], opts...))
			defer cleanup.Stop()
			if err := cleanup.DeclareQueue(q, q, tinymq.Fanout); err == nil {
				_, _ = cleanup.DeleteQueue(q) // the benchmark's queues do not pile up on the cluster
			}
		})
	}
}
