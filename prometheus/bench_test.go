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

// benchMQ returns a started MQ with n exchanges, each with one queue whose
// consumer does nothing, instrumented with Instrument, the registry it
// registered with, and the Collector.
func benchMQ(b *testing.B, n int) (*tinymq.MQ, *prometheus.Registry, *tinymqprom.Collector) {
	b.Helper()
	reg := prometheus.NewRegistry()
	opt, c := tinymqprom.InstrumentCollector(reg)
	mq := tinymq.New(opt)
	consumer := func(context.Context, *tinymq.Msg) error { return nil }
	for i := range n {
		if err := mq.RegisterQueue(fmt.Sprintf("ex%d", i), tinymq.Fanout, consumer, 1,
			tinymq.WithQueueName(fmt.Sprintf("q%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	if err := mq.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return mq, reg, c
}

// publishAll publishes one message to each of the n exchanges of benchMQ
// and waits until every consumer call returned.
func publishAll(b *testing.B, mq *tinymq.MQ, n int) {
	b.Helper()
	var want uint64
	for _, q := range mq.Stats().Queues {
		want += q.Succeeded
	}
	want += uint64(n)
	for i := range n {
		if err := mq.Publish(fmt.Sprintf("ex%d", i), i); err != nil {
			b.Fatal(err)
		}
	}
	for {
		var got uint64
		for _, q := range mq.Stats().Queues {
			got += q.Succeeded
		}
		if got >= want {
			return
		}
	}
}

// BenchmarkPublishWhileScraping publishes round-robin to 100 queues from
// parallel publishers, with nothing scraping and with a goroutine gathering
// the registry over and over: the ns/op of the two should be close, since a
// scrape holds no lock that a publisher needs for more than a moment.
func BenchmarkPublishWhileScraping(b *testing.B) {
	const queues = 100
	for _, bc := range []struct {
		name   string
		scrape bool
	}{
		{"scrape=none", false},
		{"scrape=continuous", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			mq, reg, _ := benchMQ(b, queues)
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
				names := make([]string, queues)
				for q := range names {
					names[q] = fmt.Sprintf("ex%d", q)
				}
				for pb.Next() {
					if err := mq.Publish(names[i%queues], i); err != nil {
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

// BenchmarkScrape measures a scrape of an MQ of 100 and of 10,000 queues
// (each bound to an exchange of its own, its consumer called once):
//
//   - gather: Registry.Gather, what a scrape costs, client library included;
//   - gather/moving: the same when every queue had a call since the last
//     scrape (the publishes and calls are not timed), the worst case;
//   - collect: the Collector's own part, Collect into a drained channel
//     (the MQ's Stats and Topology included);
//   - stats and topology: those two calls of the core alone.
//
// series reports how many metrics the Collector sends.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("queues=%d", n), func(b *testing.B) {
			mq, reg, c := benchMQ(b, n)
			defer mq.Stop()
			publishAll(b, mq, n)
			if _, err := reg.Gather(); err != nil { // the Collector's first scrape fills its caches
				b.Fatal(err)
			}
			b.Run("gather", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := reg.Gather(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("gather/moving", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					publishAll(b, mq, n)
					b.StartTimer()
					if _, err := reg.Gather(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("collect", func(b *testing.B) {
				ch := make(chan prometheus.Metric, 1024)
				series := make(chan int)
				go func() {
					n := 0
					for range ch {
						n++
					}
					series <- n
				}()
				b.ReportAllocs()
				for b.Loop() {
					c.Collect(ch)
				}
				close(ch)
				b.ReportMetric(float64(<-series)/float64(b.N), "series")
			})
			b.Run("stats", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					mq.Stats()
				}
			})
			b.Run("topology", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					mq.Topology()
				}
			})
		})
	}
}

// BenchmarkMiddleware measures what Instrument's middleware adds to one
// consumer call: plain is the consumer alone, instrumented the same through
// the middleware; parallel runs calls of one queue from every P at once.
func BenchmarkMiddleware(b *testing.B) {
	mq := tinymq.New()
	if err := mq.DeclareQueue("q", "ex", tinymq.Fanout); err != nil {
		b.Fatal(err)
	}
	c, err := tinymqprom.NewCollector(mq)
	if err != nil {
		b.Fatal(err)
	}
	plain := tinymq.DeliveryFunc(func(context.Context, tinymq.Delivery[any]) error { return nil })
	d := tinymq.Delivery[any]{ID: 1, Queue: "q", Data: 1, Attempt: 1}
	for _, bc := range []struct {
		name string
		fn   tinymq.DeliveryFunc
	}{{"plain", plain}, {"instrumented", tinymqprom.Middleware(c)(plain)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				_ = bc.fn(ctx, d)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					_ = bc.fn(ctx, d)
				}
			})
		})
	}
}
