package tinymqprom_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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

// scrapeGet GETs url with the Accept-Encoding encoding ("" for none) and
// reads the body, as sent, to its end; it returns the body's length.
func scrapeGet(b *testing.B, client *http.Client, url, encoding string) int64 {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
	return n
}

// benchHTTP runs the HTTP scrapes of h: plain, gzipped, plain when every
// queue had a call since the last scrape, and plain when TopologyVersion
// moved since the last scrape (the calls and the move not timed).
// body-bytes is the size of the response as sent.
func benchHTTP(b *testing.B, route string, h http.Handler, mq *tinymq.MQ, n int) {
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	for _, bc := range []struct {
		name, encoding   string
		moving, topology bool
	}{{"", "", false, false}, {"/gzip", "gzip", false, false}, {"/moving", "", true, false}, {"/topology", "", false, true}} {
		b.Run("http/"+route+bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var body int64
			for b.Loop() {
				if bc.moving {
					b.StopTimer()
					publishAll(b, mq, n)
					b.StartTimer()
				}
				if bc.topology {
					b.StopTimer()
					if err := mq.DeclareExchange("ex0", tinymq.Fanout); err != nil { // changes nothing, moves the version
						b.Fatal(err)
					}
					b.StartTimer()
				}
				body = scrapeGet(b, client, srv.URL, bc.encoding)
			}
			b.ReportMetric(float64(body), "body-bytes")
		})
	}
}

// BenchmarkScrape measures a scrape of an MQ of 100 and of 10,000 queues
// (each bound to an exchange of its own, its consumer called once):
//
//   - http/registry: an HTTP GET over loopback of promhttp.HandlerFor the
//     registry that holds the Collector, what Prometheus's scrape costs the
//     process, client side included (/gzip: gzipped, as Prometheus asks by
//     default; /moving: every queue had a call since the last scrape, the
//     publishes and calls not timed; /topology: TopologyVersion moved since
//     the last scrape, so that the Collector reads Topology again);
//   - http/handler: the same of Collector.Handler;
//   - handler: Collector.Handler's ServeHTTP alone, into a writer that
//     discards;
//   - gather: Registry.Gather, the registry route without encoding and
//     HTTP; gather/moving as above;
//   - collect: the Collector's own part, Collect into a drained channel
//     (the MQ's read included);
//   - walk, stats and topology: MQ.WalkStats, MQ.Stats and MQ.Topology
//     alone.
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
			benchHTTP(b, "registry", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), mq, n)
			benchHandler(b, c, mq, n)
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
			b.Run("walk", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					benchWalk(mq)
				}
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

// benchHandler runs the scrapes of the Collector's handler: over HTTP, and
// its ServeHTTP alone.
func benchHandler(b *testing.B, c *tinymqprom.Collector, mq *tinymq.MQ, n int) {
	h := c.Handler()
	h.ServeHTTP(&discardWriter{header: http.Header{}}, httptest.NewRequest(http.MethodGet, "/", nil)) // its first scrape makes its labels
	benchHTTP(b, "handler", h, mq, n)
	b.Run("handler", func(b *testing.B) {
		w := &discardWriter{header: http.Header{}}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		b.ReportAllocs()
		for b.Loop() {
			clear(w.header)
			h.ServeHTTP(w, r)
		}
	})
}

// benchWalk reads every exchange's and queue's stats, as a scrape does.
func benchWalk(mq *tinymq.MQ) {
	var sum uint64
	mq.WalkStats(func(_ string, es *tinymq.ExchangeStats) bool { sum += es.Published; return true },
		func(_ string, qs *tinymq.QueueStats) bool { sum += qs.Accepted; return true })
}
