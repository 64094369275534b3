package tinymqprom_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	tinymqprom "github.com/tinymq/tinymq/prometheus"
)

// get GETs url with the given Accept-Encoding ("" for none) and returns the
// body as sent, and the response.
func get(t *testing.T, url, encoding string) ([]byte, *http.Response) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	return body, resp
}

// canonical parses a text exposition with expfmt and writes it again, family
// by family in name order and each family's series in label order, so that
// two expositions of the same metrics compare equal as text.
func canonical(t *testing.T, body []byte) string {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err, "%s", body)
	var out strings.Builder
	for _, name := range slicesSortedKeys(mfs) {
		mf := mfs[name]
		slices.SortFunc(mf.Metric, func(a, b *dto.Metric) int { return strings.Compare(labelKey(a), labelKey(b)) })
		_, err := expfmt.MetricFamilyToText(&out, mf)
		require.NoError(t, err)
	}
	return out.String()
}

func slicesSortedKeys(m map[string]*dto.MetricFamily) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func labelKey(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.GetLabel() {
		fmt.Fprintf(&b, "%s=%q,", l.GetName(), l.GetValue())
	}
	return b.String()
}

// routes serves c twice over loopback: through a registry that holds c alone
// (promhttp), and through c.Handler.
func routes(t *testing.T, c *tinymqprom.Collector, reg *prometheus.Registry) (registry, handler string) {
	t.Helper()
	r := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	t.Cleanup(r.Close)
	h := httptest.NewServer(c.Handler())
	t.Cleanup(h.Close)
	return r.URL, h.URL
}

// sameOnBothRoutes fails the test unless the two routes serve the same
// metrics, and returns them.
func sameOnBothRoutes(t *testing.T, registry, handler string) string {
	t.Helper()
	want, _ := get(t, registry, "")
	got, resp := get(t, handler, "")
	assert.Equal(t, "text/plain; version=0.0.4; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Empty(t, resp.Header.Get("Content-Encoding"))
	w := canonical(t, want)
	require.Equal(t, w, canonical(t, got))
	// The same order and formatting too, as client_golang v1.25 writes them.
	assert.True(t, bytes.Equal(want, got), "the same metrics, but not byte for byte")
	return w
}

// hasSeries reports whether text has a series of family whose labels
// include each of the given name="value" pairs.
func hasSeries(text, family string, labels ...string) bool {
	for line := range strings.Lines(text) {
		if !strings.HasPrefix(line, family+"{") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && (strings.Contains(line, "{"+l+",") || strings.Contains(line, ","+l+",") ||
				strings.Contains(line, "{"+l+"}") || strings.Contains(line, ","+l+"}"))
		}
		if all {
			return true
		}
	}
	return false
}

// hardNames are queue and exchange names that every escaping must get
// right: invalid UTF-8, backslashes, double quotes, line feeds.
var hardNames = []string{"plain", "q\xff", `q\xff`, `back\slash`, `say "hi"`, "two\nlines", "caf\u00e9"}

// handlerMQ returns a running MQ, idle, instrumented with opts, whose
// queues (named hardNames, plus a deleted one, an unroutable exchange, a
// topic binding of two keys and a queue bound twice) each had calls, some
// failed, and its Collector registered alone in a registry.
func handlerMQ(t *testing.T, opts ...tinymqprom.Option) (*tinymq.MQ, *tinymqprom.Collector, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	opt, c := tinymqprom.InstrumentCollector(reg, opts...)
	mq := tinymq.New(opt, tinymq.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(mq.Stop)
	for i, name := range hardNames {
		require.NoError(t, mq.RegisterQueue("ex."+name, tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
			if m.Data.(int)%2 == 1 {
				return errBill
			}
			return nil
		}, 1, tinymq.WithQueueName(name), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: i%3 + 1, InitialBackoff: time.Millisecond})))
	}
	require.NoError(t, mq.RegisterQueue("topic", tinymq.Topic, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("keys"), tinymq.WithBindingKey("a.*"), tinymq.WithBindingKey("b.#")))
	require.NoError(t, mq.Bind("keys", "ex.plain", tinymq.Fanout))
	require.NoError(t, mq.DeclareQueue("gone", "ex.plain", tinymq.Fanout))
	require.NoError(t, mq.DeclareExchange("nowhere", tinymq.Direct))
	require.NoError(t, mq.Start(t.Context()))
	for i, name := range hardNames {
		for n := range i + 2 {
			require.NoError(t, mq.Publish("ex."+name, n))
		}
	}
	require.NoError(t, mq.Publish("topic", 1, tinymq.WithRoutingKey("a.x")))
	require.ErrorIs(t, mq.Publish("nowhere", 1), tinymq.ErrNoRoute)
	_, err := mq.DeleteQueue("gone")
	require.NoError(t, err)
	require.Eventually(t, func() bool { // every message ended, and every call was observed
		for _, qs := range mq.Stats().Queues {
			if qs.Accepted != qs.Succeeded+qs.Dropped || qs.Delivered != qs.Succeeded+qs.Failed || qs.InFlight > 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
	return mq, c, reg
}

// The handler serves what the registry route serves for the same MQ: every
// family, help, type, label and value, names that need escaping included,
// with the default options and with constant labels and buckets of one's
// own; and again after the topology changed.
func TestHandlerServesWhatTheRegistryServes(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []tinymqprom.Option
	}{
		{"defaults", nil},
		{"options", []tinymqprom.Option{
			tinymqprom.WithConstLabels(prometheus.Labels{"mq": `bill "A"` + "\n\\", "zone": "z", "app": "a"}),
			tinymqprom.WithBuckets(1e-9, 0.5, 1, 1e6, 2.5e7),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mq, c, reg := handlerMQ(t, tc.opts...)
			registry, handler := routes(t, c, reg)
			text := sameOnBothRoutes(t, registry, handler)
			for _, family := range []string{"tinymq_queue_consumer_duration_seconds", "tinymq_queue_binding_info",
				"tinymq_queue_calls_stuck", "tinymq_exchange_unroutable_total", "tinymq_queues_deleted_total",
				"tinymq_deleted_queues_messages_removed_total", "tinymq_collector_errors_total"} {
				assert.True(t, strings.Contains(text, "# TYPE "+family+" "), "the comparison covers %s", family)
			}
			assert.True(t, hasSeries(text, "tinymq_queue_accepted_total", `queue="say \"hi\""`))
			assert.True(t, hasSeries(text, "tinymq_queue_accepted_total", `queue="two\nlines"`))
			assert.True(t, hasSeries(text, "tinymq_queue_accepted_total", `queue="q\\\\xff"`), `the name q\xff, its backslash escaped twice`)
			assert.True(t, hasSeries(text, "tinymq_queue_binding_info", `exchange="ex.plain"`, `queue="keys"`))

			// The bindings change: the handler reads them again.
			require.NoError(t, mq.Unbind("keys", "ex.plain"))
			require.NoError(t, mq.Bind("plain", "topic", tinymq.Topic, tinymq.WithBindingKey("#")))
			text = sameOnBothRoutes(t, registry, handler)
			assert.False(t, hasSeries(text, "tinymq_queue_binding_info", `exchange="ex.plain"`, `queue="keys"`))
			assert.True(t, hasSeries(text, "tinymq_queue_binding_info", `exchange="topic"`, `queue="plain"`))
			_, err := mq.DeleteQueue("plain")
			require.NoError(t, err)
			sameOnBothRoutes(t, registry, handler)
		})
	}
}

// With NewCollector only the queues whose consumers Collector.Instrument
// wraps have a histogram, on both routes; an MQ with nothing in it serves
// the MQ's totals alone.
func TestHandlerOfNewCollector(t *testing.T) {
	mq := tinymq.New()
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	registry, handler := routes(t, c, reg)
	text := sameOnBothRoutes(t, registry, handler)
	assert.NotContains(t, text, "tinymq_queue_")
	assert.Contains(t, text, "tinymq_queues_deleted_total")

	done := make(chan struct{}, 2)
	nop := func(context.Context, *tinymq.Msg) error { done <- struct{}{}; return nil }
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, c.Instrument(nop), 1, tinymq.WithQueueName("wrapped")))
	require.NoError(t, mq.RegisterQueue("ex", tinymq.Fanout, nop, 1, tinymq.WithQueueName("bare")))
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ex", 1))
	<-done
	<-done
	mq.Stop()
	text = sameOnBothRoutes(t, registry, handler)
	assert.Contains(t, text, `tinymq_queue_consumer_duration_seconds_count{queue="wrapped"} 1`)
	assert.NotContains(t, text, `tinymq_queue_consumer_duration_seconds_count{queue="bare"}`)
}

// A client that accepts gzip gets the same text gzipped; q=0 refuses it.
func TestHandlerGzips(t *testing.T) {
	_, c, reg := handlerMQ(t)
	registry, handler := routes(t, c, reg)
	plain, _ := get(t, registry, "")
	for _, enc := range []string{"gzip", "deflate, gzip;q=0.5", "x-gzip", "GZIP ; q=1"} {
		body, resp := get(t, handler, enc)
		require.Equal(t, "gzip", resp.Header.Get("Content-Encoding"), enc)
		zr, err := gzip.NewReader(bytes.NewReader(body))
		require.NoError(t, err, enc)
		text, err := io.ReadAll(zr)
		require.NoError(t, err, enc)
		assert.Equal(t, canonical(t, plain), canonical(t, text), enc)
	}
	for _, enc := range []string{"gzip;q=0", "deflate", "identity"} {
		body, resp := get(t, handler, enc)
		assert.Empty(t, resp.Header.Get("Content-Encoding"), enc)
		assert.Equal(t, canonical(t, plain), canonical(t, body), enc)
	}
}

// A panic while the MQ is read (here halfway through its queues) is counted,
// and that scrape serves tinymq_collector_errors_total alone, with 200; the
// next one serves everything again, the queues the broken read had found
// first included.
func TestHandlerPanicNeverFailsTheScrape(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	opt, c := tinymqprom.InstrumentCollector(reg)
	mq := tinymq.New(opt)
	defer mq.Stop()
	for i := range 6 {
		require.NoError(t, mq.DeclareQueue(fmt.Sprintf("q%d", i), "ex", tinymq.Fanout))
	}
	registry, handler := routes(t, c, reg)
	var broken sync.Once
	tinymqprom.SetReadHook(c, func(queue string) {
		if queue == "q3" {
			broken.Do(func() { panic("the read broke") })
		}
	})
	body, _ := get(t, handler, "")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	require.Len(t, mfs, 1, "%s", body)
	assert.Equal(t, 1.0, mfs["tinymq_collector_errors_total"].GetMetric()[0].GetCounter().GetValue())

	text := sameOnBothRoutes(t, registry, handler)
	for i := range 6 {
		assert.Contains(t, text, fmt.Sprintf(`tinymq_queue_messages_ready{queue="q%d"} 0`, i))
	}
	assert.Contains(t, text, "tinymq_collector_errors_total 1")
}

// InstrumentHandler instruments the MQ and registers nothing: before New its
// handler serves the error counter alone, then every metric, the histogram
// of every queue included; its option serves one New.
func TestInstrumentHandler(t *testing.T) {
	opt, h := tinymqprom.InstrumentHandler(tinymqprom.WithConstLabels(prometheus.Labels{"mq": "jobs"}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	body, _ := get(t, srv.URL, "")
	assert.Equal(t, "# HELP tinymq_collector_errors_total Panics the Collector recovered while collecting, each ending the MQ's part of a scrape; the rest of each scrape was served.\n"+
		"# TYPE tinymq_collector_errors_total counter\n"+
		`tinymq_collector_errors_total{mq="jobs"} 0`+"\n", string(body))

	mq := tinymq.New(opt)
	done := make(chan struct{})
	require.NoError(t, tinymq.RegisterHandler(mq, "ex", tinymq.Fanout, func(context.Context, int) error {
		close(done)
		return nil
	}, 1, tinymq.WithQueueName("typed")))
	require.NoError(t, mq.Start(t.Context()))
	require.NoError(t, mq.Publish("ex", 1))
	<-done
	mq.Stop()
	body, _ = get(t, srv.URL, "")
	text := canonical(t, body)
	assert.Contains(t, text, `tinymq_queue_consumer_duration_seconds_count{mq="jobs",queue="typed"} 1`)
	assert.Contains(t, text, `tinymq_queue_succeeded_total{mq="jobs",queue="typed"} 1`)
	assert.Contains(t, text, `tinymq_queue_binding_info{exchange="ex",mq="jobs",queue="typed"} 1`)

	assert.Panics(t, func() { tinymq.New(opt) }, "a second New")
	assert.Panics(t, func() { tinymqprom.InstrumentHandler(tinymqprom.WithBuckets()) }, "a bad option")
}

// failingWriter is a ResponseWriter whose writes fail after limit bytes, as
// they do once a client has gone.
type failingWriter struct {
	header  http.Header
	written int
	limit   int
	calls   int
}

func (w *failingWriter) Header() http.Header { return w.header }
func (w *failingWriter) WriteHeader(int)     {}
func (w *failingWriter) Write(b []byte) (int, error) {
	w.calls++
	if w.written+len(b) > w.limit {
		return 0, errors.New("client gone")
	}
	w.written += len(b)
	return len(b), nil
}

// A client that goes away mid-response ends the writing at the first
// failed write, and the next scrape is whole.
func TestHandlerStopsWritingForAClientGone(t *testing.T) {
	mq := tinymq.New()
	defer mq.Stop()
	for i := range 3000 { // about 4 MB of text, many flushes
		require.NoError(t, mq.DeclareQueue(fmt.Sprintf("queue-%06d", i), "ex", tinymq.Fanout))
	}
	c, err := tinymqprom.NewCollector(mq)
	require.NoError(t, err)
	h := c.Handler()
	w := &failingWriter{header: http.Header{}, limit: 100 << 10}
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, 2, w.calls, "one write that worked, one that failed, no more")

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	text := canonical(t, rec.Body.Bytes())
	assert.Contains(t, text, `tinymq_queue_binding_info{exchange="ex",queue="queue-002999"} 1`)
	assert.Contains(t, text, "tinymq_collector_errors_total 0")
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ header http.Header }

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

// A scrape of the handler allocates the same few times whatever the number
// of queues once their names were seen, gzipped or not: no metric object,
// no map, no line of its own.
func TestHandlerAllocatesNothingPerQueue(t *testing.T) {
	allocs := func(queues int, encoding string) float64 {
		opt, h := tinymqprom.InstrumentHandler()
		mq := tinymq.New(opt)
		defer mq.Stop()
		for i := range queues {
			require.NoError(t, mq.DeclareQueue(fmt.Sprintf("q%d", i), fmt.Sprintf("ex%d", i), tinymq.Fanout))
		}
		w := &discardWriter{header: http.Header{}}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if encoding != "" {
			r.Header.Set("Accept-Encoding", encoding)
		}
		h.ServeHTTP(w, r) // the first scrape makes the series
		return testing.AllocsPerRun(5, func() {
			clear(w.header)
			h.ServeHTTP(w, r)
		})
	}
	for _, enc := range []string{"", "gzip"} {
		small, large := allocs(10, enc), allocs(2000, enc)
		assert.Equal(t, small, large, "%q: allocations do not grow with the queues", enc)
		assert.LessOrEqual(t, large, 16.0, enc)
	}
}

// Scrapes of both routes race publishers, consumers and queues coming and
// going: under -race nothing is shared unsafely, and every scrape parses.
func TestHandlerRacingTheMQAndTheRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	opt, c := tinymqprom.InstrumentCollector(reg)
	mq := tinymq.New(opt)
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	for i := range 4 {
		require.NoError(t, mq.RegisterQueue(fmt.Sprintf("ex%d", i), tinymq.Fanout, nop, 1, tinymq.WithQueueName(fmt.Sprintf("q%d", i))))
	}
	require.NoError(t, mq.Start(t.Context()))
	h := c.Handler()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			_ = mq.Publish(fmt.Sprintf("ex%d", i%4), i)
			name := fmt.Sprintf("tmp%d", i%7)
			if i%2 == 0 {
				_ = mq.RegisterQueue("ex0", tinymq.Fanout, nop, 1, tinymq.WithQueueName(name))
			} else {
				_, _ = mq.DeleteQueue(name)
			}
		}
	})
	wg.Go(func() {
		for range 30 {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 30 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(rec.Body)
		require.NoError(t, err)
		assert.Zero(t, mfs["tinymq_collector_errors_total"].GetMetric()[0].GetCounter().GetValue())
	}
	close(done)
	wg.Wait()
	mq.Stop()
}
