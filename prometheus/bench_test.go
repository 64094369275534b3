package tinymqprom_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinymq/tinymq"
	tinymqprom "github.com/tinymq/tinymq/prometheus"
)

const benchQueues = 100

// benchMQ returns a started MQ with benchQueues exchanges, each with one
// queue whose consumer does nothing, wrapped by c.Instrument when c is set.
func benchMQ(b *testing.B, instrument bool) (*tinymq.MQ, *tinymqprom.Collector) {
	b.Helper()
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	if err != nil {
		b.Fatal(err)
	}
	var consumer tinymq.ConsumerFunc = func(context.Context, *tinymq.Msg) error { return nil }
	if instrument {
		consumer = c.Instrument(consumer)
	}
	for i := range benchQueues {
		if err := mq.RegisterQueue(fmt.Sprintf("ex%d", i), tinymq.Fanout, consumer, 1,
			tinymq.WithQueueName(fmt.Sprintf("q%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	if err := mq.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return mq, c
}

// BenchmarkPublishWhileScraping publishes round-robin to 100 queues from
// parallel publishers, with nothing scraping and with a goroutine gathering
// the registry over and over: the ns/op of the two should be close, since a
// scrape holds no lock that a publisher needs for more than a moment.
func BenchmarkPublishWhileScraping(b *testing.B) {
	for _, bc := range []struct {
		name       string
		scrape     bool
		instrument bool
	}{
		{"scrape=none", false, false},
		{"scrape=continuous", true, false},
		{"scrape=continuous/instrumented", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			mq, c := benchMQ(b, bc.instrument)
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			stop := make(chan struct{})
			var scrapes int
			var wg sync.WaitGroup
			if bc.scrape {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := reg.Gather(); err != nil {
							b.Error(err)
							return
						}
						scrapes++
					}
				})
			}
			b.ReportAllocs()
			b.ResetTimer()
			var next sync.Mutex
			n := 0
			b.RunParallel(func(pb *testing.PB) {
				next.Lock()
				i := n
				n++
				next.Unlock()
				names := make([]string, benchQueues)
				for q := range names {
					names[q] = fmt.Sprintf("ex%d", q)
				}
				for pb.Next() {
					if err := mq.Publish(names[i%benchQueues], i); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
			b.StopTimer()
			close(stop)
			wg.Wait()
			mq.Stop()
			b.ReportMetric(float64(scrapes), "scrapes")
		})
	}
}

// BenchmarkScrape measures one Gather of a registry holding a Collector over
// 100 queues, histogram included: the cost of a scrape.
func BenchmarkScrape(b *testing.B) {
	mq, c := benchMQ(b, true)
	defer mq.Stop()
	for i := range benchQueues {
		if err := mq.Publish(fmt.Sprintf("ex%d", i), i); err != nil {
			b.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInstrument measures what Instrument adds to one consumer call.
func BenchmarkInstrument(b *testing.B) {
	c, err := tinymqprom.NewCollector(tinymq.New())
	if err != nil {
		b.Fatal(err)
	}
	plain := func(context.Context, *tinymq.Msg) error { return nil }
	msg := &tinymq.Msg{Queue: "q"}
	for _, bc := range []struct {
		name     string
		consumer tinymq.ConsumerFunc
	}{{"plain", plain}, {"instrumented", c.Instrument(plain)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				_ = bc.consumer(ctx, msg)
			}
		})
	}
}
