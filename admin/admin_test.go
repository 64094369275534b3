package admin_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Overview is the JSON of /api/overview as a client decodes it.
type Overview struct {
	Time          string   `json:"time"`
	RefreshMillis int64    `json:"refresh_ms"`
	RateSeconds   *float64 `json:"rate_seconds"`
	ExchangeCount int      `json:"exchange_count"`
	QueueCount    int      `json:"queue_count"`
	Truncated     bool     `json:"truncated"`
	Totals        struct {
		Published     uint64   `json:"published"`
		PublishedRate *float64 `json:"published_per_sec"`
		Depth         int      `json:"depth"`
		InFlight      int      `json:"in_flight"`
		Failed        uint64   `json:"failed"`
		Consumers     int      `json:"consumers"`
		Paused        int      `json:"paused"`
		DeletedQueues uint64   `json:"deleted_queues"`
		ExpiredQueues uint64   `json:"expired_queues"`
		Removed       uint64   `json:"removed"`
	} `json:"totals"`
	History      History  `json:"history"`
	QueuePage    PageInfo `json:"queue_page"`
	ExchangePage PageInfo `json:"exchange_page"`
	Exchanges    []struct {
		Name              string  `json:"name"`
		Kind              string  `json:"kind"`
		Alternate         string  `json:"alternate"`
		Published         uint64  `json:"published"`
		Unroutable        uint64  `json:"unroutable"`
		DedupWindowMillis float64 `json:"deduplication_window_ms"`
		Duplicates        uint64  `json:"duplicates"`
		Rates             *struct {
			Published  float64 `json:"published_per_sec"`
			Unroutable float64 `json:"unroutable_per_sec"`
		} `json:"rates"`
		BindingCount int       `json:"binding_count"`
		Bindings     []Binding `json:"bindings"`
	} `json:"exchanges"`
	Queues        []Queue `json:"queues"`
	Selected      *Queue  `json:"selected"`
	DeadLetterSum struct {
		Total        uint64 `json:"total"`
		DeadLettered uint64 `json:"dead_lettered"`
		Dropped      uint64 `json:"dropped"`
		Queues       int    `json:"queues"`
	} `json:"dead_letter_totals"`
	DeadGroups []struct {
		Queue        string `json:"queue"`
		Deleted      bool   `json:"deleted"`
		Total        uint64 `json:"total"`
		DeadLettered uint64 `json:"dead_lettered"`
		Dropped      uint64 `json:"dropped"`
		Reasons      []struct {
			Reason      string `json:"reason"`
			Total       uint64 `json:"total"`
			Recent      int    `json:"recent"`
			LastTime    string `json:"last_time"`
			LastError   string `json:"last_error"`
			LastOutcome string `json:"last_outcome"`
		} `json:"reasons"`
	} `json:"dead_letter_groups"`
	DeadLetters []struct {
		Time               string `json:"time"`
		Reason             string `json:"reason"`
		Exchange           string `json:"exchange"`
		Queue              string `json:"queue"`
		RoutingKey         string `json:"routing_key"`
		Attempts           int    `json:"attempts"`
		Count              int    `json:"count"`
		MessageID          uint64 `json:"message_id"`
		LastError          string `json:"last_error"`
		DeadLetterExchange string `json:"dead_letter_exchange"`
		Dropped            bool   `json:"dropped"`
		DropCause          string `json:"drop_cause"`
	} `json:"dead_letters"`
	Actions struct {
		Enabled  bool `json:"enabled"`
		Payloads bool `json:"payloads"`
	} `json:"actions"`
}

// Queue is one queue of the overview.
type Queue struct {
	Name               string             `json:"name"`
	Concurrency        int                `json:"concurrency"`
	Consumers          int                `json:"consumers"`
	Paused             bool               `json:"paused"`
	Durable            bool               `json:"durable"`
	MaxAttempts        int                `json:"max_attempts"`
	MessageTTLMillis   float64            `json:"message_ttl_ms"`
	ExpiryMillis       float64            `json:"expiry_ms"`
	MaxLen             int                `json:"max_len"`
	Overflow           string             `json:"overflow"`
	DeadLetterExchange string             `json:"dead_letter_exchange"`
	DeadLetterKey      string             `json:"dead_letter_key"`
	Filtered           bool               `json:"filtered"`
	DeliveryTimeoutMs  float64            `json:"delivery_timeout_ms"`
	RateLimit          float64            `json:"rate_limit_per_sec"`
	RateBurst          int                `json:"rate_burst"`
	GroupOrdering      bool               `json:"group_ordering"`
	PayloadType        string             `json:"payload_type"`
	Depth              int                `json:"depth"`
	Ready              int                `json:"ready"`
	Scheduled          int                `json:"scheduled"`
	InFlight           int                `json:"in_flight"`
	Abandoned          int                `json:"abandoned"`
	OldestAgeMillis    float64            `json:"oldest_age_ms"`
	Counters           map[string]uint64  `json:"counters"`
	Rates              map[string]float64 `json:"rates"`
	ConsumerTime       map[string]float64 `json:"consumer_time"`
	History            History            `json:"history"`
}

// History is a sparkline's data: null where no request came.
type History struct {
	StepMillis int64      `json:"step_ms"`
	End        string     `json:"end"`
	Depth      []*float64 `json:"depth"`
	Published  []*float64 `json:"published_per_sec"`
	Delivered  []*float64 `json:"delivered_per_sec"`
}

// Binding is one binding of an exchange.
type Binding struct {
	Queue     string              `json:"queue"`
	Keys      []string            `json:"keys"`
	Args      []map[string]string `json:"args"`
	Truncated bool                `json:"truncated"`
}

// PageInfo describes one page of a list.
type PageInfo struct {
	Sort       string `json:"sort"`
	Order      string `json:"order"`
	Filter     string `json:"filter"`
	Offset     int    `json:"offset"`
	Limit      int    `json:"limit"`
	Matched    int    `json:"matched"`
	NextOffset *int   `json:"next_offset"`
}

// newRequest is a request from the local machine: its Host is localhost,
// which the handler answers by default.
func newRequest(method, target string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.Host = "localhost"
	return r
}

// get serves one request to h and returns the response.
func get(t *testing.T, h http.Handler, method, target string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(method, target))
	return rec.Result()
}

func body(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return string(b)
}

// overview fetches and decodes the JSON, checking its status and headers.
func overview(t *testing.T, h http.Handler) (Overview, string) {
	t.Helper()
	return overviewQuery(t, h, "")
}

// overviewQuery is overview with query parameters.
func overviewQuery(t *testing.T, h http.Handler, query string) (Overview, string) {
	t.Helper()
	res := get(t, h, http.MethodGet, "/api/overview?"+query)
	raw := body(t, res)
	require.Equal(t, http.StatusOK, res.StatusCode, raw)
	assert.Equal(t, "application/json; charset=utf-8", res.Header.Get("Content-Type"))
	assert.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
	assert.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	var ov Overview
	require.NoError(t, json.Unmarshal([]byte(raw), &ov), raw)
	return ov, raw
}

func nop(context.Context, *tinymq.Msg) error { return nil }

func TestOverviewShape(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.DeclareExchange("events", tinymq.Headers, tinymq.WithAlternateExchange("unrouted")))
	require.NoError(t, mq.RegisterQueue("unrouted", tinymq.Fanout, nop, 1, tinymq.WithQueueName("lost")))
	require.NoError(t, mq.RegisterQueue("events", tinymq.Headers, nop, 1, tinymq.WithQueueName("pdfs"),
		tinymq.WithBindingArgs(map[string]any{"x-match": "all", "format": "pdf", "pages": int32(3), "raw": []byte("b")})))
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Direct, nop, 3, tinymq.WithQueueName("billing"),
		tinymq.WithBindingKey("created"), tinymq.WithBindingKey("paid"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 4}), tinymq.WithDeadLetter("dlx", "billing.dead"),
		tinymq.WithMessageTTL(1500*time.Millisecond), tinymq.WithMaxLen(100, tinymq.DropHead),
		tinymq.WithFilter(func(*tinymq.Msg) bool { return true })))
	require.NoError(t, mq.RegisterQueue("dlx", tinymq.Fanout, nop, 1, tinymq.WithQueueName("dead")))
	require.NoError(t, mq.Bind("billing", "audit", tinymq.Topic, tinymq.WithBindingKey("order.#")))
	t.Cleanup(mq.Stop)

	ov, _ := overview(t, admin.Handler(mq, admin.WithRefresh(2*time.Second)))
	assert.Equal(t, int64(2000), ov.RefreshMillis)
	assert.Nil(t, ov.RateSeconds, "no rates before a second snapshot")
	assert.False(t, ov.Truncated)
	_, err := time.Parse(time.RFC3339Nano, ov.Time)
	assert.NoError(t, err)

	require.Equal(t, 5, ov.ExchangeCount)
	var names []string
	for _, x := range ov.Exchanges {
		names = append(names, x.Name+":"+x.Kind)
		assert.Nil(t, x.Rates)
	}
	assert.Equal(t, []string{"audit:topic", "dlx:fanout", "events:headers", "orders:direct", "unrouted:fanout"}, names,
		"exchanges sorted by name")
	events := ov.Exchanges[2]
	assert.Equal(t, "unrouted", events.Alternate)
	require.Len(t, events.Bindings, 1)
	assert.Equal(t, "pdfs", events.Bindings[0].Queue)
	assert.Empty(t, events.Bindings[0].Keys)
	assert.Equal(t, []map[string]string{{"x-match": `"all"`, "format": `"pdf"`, "pages": "3", "raw": `"b"`}},
		events.Bindings[0].Args)
	orders := ov.Exchanges[3]
	require.Len(t, orders.Bindings, 1)
	assert.Equal(t, []string{"created", "paid"}, orders.Bindings[0].Keys)
	assert.Equal(t, []string{"order.#"}, ov.Exchanges[0].Bindings[0].Keys, "Bind shows on the other exchange")

	require.Equal(t, 4, ov.QueueCount)
	var queues []string
	for _, q := range ov.Queues {
		queues = append(queues, q.Name)
	}
	assert.Equal(t, []string{"lost", "pdfs", "billing", "dead"}, queues, "queues in registration order")
	b := ov.Queues[2]
	assert.Equal(t, 3, b.Concurrency)
	assert.Equal(t, 4, b.MaxAttempts)
	assert.InDelta(t, 1500, b.MessageTTLMillis, 1e-9)
	assert.Equal(t, 100, b.MaxLen)
	assert.Equal(t, "drop-head", b.Overflow)
	assert.Equal(t, "dlx", b.DeadLetterExchange)
	assert.Equal(t, "billing.dead", b.DeadLetterKey)
	assert.True(t, b.Filtered)
	assert.Nil(t, b.Rates)
	for _, k := range []string{"accepted", "delivered", "succeeded", "failed", "retried", "dead_lettered",
		"expired", "overflowed", "rejected", "dropped", "undelivered", "purged", "replayed", "removed", "timed_out"} {
		assert.Contains(t, b.Counters, k)
	}
	for _, k := range []string{"samples", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms"} {
		assert.Contains(t, b.ConsumerTime, k)
	}
	assert.NotNil(t, ov.DeadLetters, "an empty list, not null")
	assert.Empty(t, ov.DeadLetters)
}

// waitFor polls cond every few milliseconds until it holds or 10s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func TestNumbersChangeAfterPublishing(t *testing.T) {
	mq := tinymq.New()
	release := make(chan struct{})
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, 1, tinymq.WithQueueName("work"),
		// A length limit makes the worker take one message at a time: the
		// core's batching otherwise hides the messages a worker holds from
		// both Depth and InFlight (reported to the lead).
		tinymq.WithMaxLen(1000, tinymq.RejectPublish)))
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return errors.New("<b>boom</b>")
	}, 1, tinymq.WithQueueName("broken")))
	h := admin.Handler(mq)

	before, _ := overview(t, h)
	assert.Zero(t, before.Exchanges[0].Published)
	assert.Zero(t, before.Queues[0].Depth)

	for range 5 {
		require.NoError(t, mq.Publish("jobs", "x"))
	}
	queued, _ := overview(t, h)
	assert.Equal(t, uint64(5), queued.Exchanges[0].Published)
	assert.Equal(t, 5, queued.Queues[0].Depth, "published before Start: waiting")
	assert.Equal(t, 5, queued.Queues[0].Ready)
	assert.Equal(t, uint64(5), queued.Queues[0].Counters["accepted"])

	require.NoError(t, mq.Start(context.Background()))
	waitFor(t, "a message in flight and five dropped", func() bool {
		st := mq.Stats().Queues
		return st["work"].InFlight == 1 && st["broken"].Dropped == 5
	})
	running, _ := overview(t, h)
	assert.Equal(t, 1, running.Queues[0].InFlight)
	assert.Equal(t, 4, running.Queues[0].Depth)
	broken := running.Queues[1]
	assert.Equal(t, uint64(5), broken.Counters["failed"])
	assert.Equal(t, uint64(5), broken.Counters["dropped"])
	assert.GreaterOrEqual(t, broken.ConsumerTime["samples"], 1.0)
	require.Len(t, running.DeadLetters, 5)
	d := running.DeadLetters[0]
	assert.Equal(t, "broken", d.Queue)
	assert.Equal(t, "rejected", d.Reason)
	assert.Equal(t, "<b>boom</b>", d.LastError)
	assert.True(t, d.Dropped)
	assert.Equal(t, uint64(5), d.MessageID, "newest first")

	close(release)
	mq.Stop()
	stopped, _ := overview(t, h)
	assert.Equal(t, uint64(5), stopped.Queues[0].Counters["succeeded"], "served after Stop too")
}

type invoice struct{ ID int }

// The overview shows a queue's job-queue settings (delivery timeout, rate
// limit, group ordering, payload type) and counts (timed-out deliveries,
// abandoned calls), and an exchange's deduplication window and duplicates;
// zeros where they were not asked for. It runs in a synctest bubble for the
// timeout.
func TestJobQueueSettingsAndCounters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		mq := tinymq.New()
		require.NoError(t, mq.DeclareExchange("billing", tinymq.Direct, tinymq.WithDeduplication(90*time.Second)))
		// The consumer ignores its context until release is closed.
		require.NoError(t, tinymq.RegisterHandler(mq, "billing", tinymq.Direct, func(context.Context, invoice) error {
			<-release
			return nil
		}, 2, tinymq.WithQueueName("charge"), tinymq.WithBindingKey("invoice"),
			tinymq.WithDeliveryTimeout(1500*time.Millisecond), tinymq.WithRateLimit(2.5, 3), tinymq.WithGroupOrdering(),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour})))
		require.NoError(t, mq.RegisterQueue("other", tinymq.Fanout, nop, 1, tinymq.WithQueueName("plain")))
		require.NoError(t, mq.Start(context.Background()))
		h := admin.Handler(mq)

		for range 3 {
			require.NoError(t, mq.Publish("billing", invoice{7}, tinymq.WithRoutingKey("invoice"),
				tinymq.WithDeduplicationID("invoice-7"), tinymq.WithMessageGroup("customer-1")))
		}
		time.Sleep(2 * time.Second) // the bubble's clock: the call times out
		synctest.Wait()

		ov, _ := overview(t, h)
		require.Len(t, ov.Queues, 2)
		charge, plain := ov.Queues[0], ov.Queues[1]
		assert.InDelta(t, 1500, charge.DeliveryTimeoutMs, 1e-9)
		assert.InDelta(t, 2.5, charge.RateLimit, 1e-9)
		assert.Equal(t, 3, charge.RateBurst)
		assert.True(t, charge.GroupOrdering)
		assert.Equal(t, "admin_test.invoice", charge.PayloadType)
		assert.Equal(t, 1, charge.Abandoned, "the timed-out call still runs")
		assert.Zero(t, charge.InFlight, "an abandoned call is not in flight")
		assert.Equal(t, uint64(1), charge.Counters["timed_out"])
		assert.Equal(t, uint64(1), charge.Counters["failed"])
		assert.Equal(t, uint64(1), charge.Counters["accepted"], "the duplicates were not routed")

		assert.Zero(t, plain.DeliveryTimeoutMs)
		assert.Zero(t, plain.RateLimit)
		assert.Zero(t, plain.RateBurst)
		assert.False(t, plain.GroupOrdering)
		assert.Empty(t, plain.PayloadType)
		assert.Zero(t, plain.Abandoned)
		assert.Zero(t, plain.Counters["timed_out"])

		require.Len(t, ov.Exchanges, 2)
		billing, other := ov.Exchanges[0], ov.Exchanges[1]
		assert.InDelta(t, 90_000, billing.DedupWindowMillis, 1e-9)
		assert.Equal(t, uint64(2), billing.Duplicates)
		assert.Equal(t, uint64(1), billing.Published)
		assert.Zero(t, other.DedupWindowMillis)
		assert.Zero(t, other.Duplicates)

		close(release)
		synctest.Wait()
		after, _ := overview(t, h)
		assert.Zero(t, after.Queues[0].Abandoned, "the call returned")
		assert.Equal(t, uint64(1), after.Queues[0].Counters["timed_out"])
		// The retry waits an hour: a Shutdown whose deadline has passed
		// drops it.
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, mq.Shutdown(ctx), context.Canceled)
		mq.Stop()
	})
}

func TestRatesFromSnapshots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mq := tinymq.New()
		require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, nop, 1, tinymq.WithQueueName("ok")))
		require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return errors.New("no")
		}, 1, tinymq.WithQueueName("bad"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
		require.NoError(t, mq.Start(context.Background()))
		h := admin.Handler(mq, admin.WithRateWindow(4*time.Second))

		first, _ := overview(t, h)
		assert.Nil(t, first.RateSeconds)
		assert.Nil(t, first.Queues[0].Rates)

		for range 20 {
			require.NoError(t, mq.Publish("ev", 1))
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		second, _ := overview(t, h)
		require.NotNil(t, second.RateSeconds)
		assert.InDelta(t, 2, *second.RateSeconds, 1e-9)
		assert.InDelta(t, 10, second.Exchanges[0].Rates.Published, 1e-9)
		assert.Equal(t, map[string]float64{"published_per_sec": 10, "delivered_per_sec": 10, "succeeded_per_sec": 10,
			"failed_per_sec": 0, "dead_lettered_per_sec": 0, "dropped_per_sec": 0}, second.Queues[0].Rates)
		assert.Equal(t, map[string]float64{"published_per_sec": 10, "delivered_per_sec": 20, "succeeded_per_sec": 0,
			"failed_per_sec": 20, "dead_lettered_per_sec": 0, "dropped_per_sec": 10}, second.Queues[1].Rates)

		// Nothing more happens: the rates decay once the busy snapshot is
		// older than the window.
		for range 3 {
			time.Sleep(2 * time.Second)
			overview(t, h)
		}
		quiet, _ := overview(t, h)
		require.NotNil(t, quiet.RateSeconds)
		assert.GreaterOrEqual(t, *quiet.RateSeconds, 4.0)
		assert.Zero(t, quiet.Queues[0].Rates["published_per_sec"])
		mq.Stop()
	})
}

func TestHostileNamesAreEscaped(t *testing.T) {
	const evil = `<script>alert(1)</script>`
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue(evil+"&ex", tinymq.Direct, nop, 1, tinymq.WithQueueName(evil),
		tinymq.WithBindingKey(`"><img src=x onerror=alert(2)>`)))
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq)

	ov, raw := overview(t, h)
	assert.NotContains(t, raw, "<script>", "JSON escapes <, > and &")
	assert.NotContains(t, raw, "<img")
	assert.Contains(t, raw, `\u003cscript\u003ealert(1)\u003c/script\u003e`)
	assert.Equal(t, evil, ov.Queues[0].Name, "and decodes to the name itself")
	assert.Equal(t, evil+"&ex", ov.Exchanges[0].Name)
	assert.Equal(t, `"><img src=x onerror=alert(2)>`, ov.Exchanges[0].Bindings[0].Keys[0])

	res := get(t, h, http.MethodGet, "/")
	page := body(t, res)
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	assert.NotContains(t, page, "alert", "the page holds no data: the script inserts names as text")
	assert.NotContains(t, page, "innerHTML")
	assert.NotContains(t, page, "insertAdjacentHTML")

	// The policy allows exactly the page's inline script and style.
	csp := res.Header.Get("Content-Security-Policy")
	assert.Contains(t, csp, "default-src 'none'")
	assert.Contains(t, csp, "connect-src 'self'")
	for _, tag := range []string{"script", "style"} {
		_, rest, ok := strings.Cut(page, "<"+tag+">")
		require.True(t, ok, tag)
		inline, _, ok := strings.Cut(rest, "</"+tag+">")
		require.True(t, ok, tag)
		sum := sha256.Sum256([]byte(inline))
		assert.Contains(t, csp, tag+"-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		assert.Equal(t, 1, strings.Count(page, "<"+tag), "one inline %s, no other", tag)
	}

	// Hostile paths are neither served nor echoed.
	res = get(t, h, http.MethodGet, "/%3Cscript%3Ealert(1)%3C/script%3E")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
	assert.NotContains(t, body(t, res), "alert")
}

func TestReadOnlyAndStrictRoutes(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, nop, 1, tinymq.WithQueueName("work")))
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq)

	for _, target := range []string{"/", "/api/overview"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
			http.MethodOptions, "PURGE"} {
			res := get(t, h, method, target)
			assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode, "%s %s", method, target)
			assert.Equal(t, "GET, HEAD", res.Header.Get("Allow"))
			assert.Equal(t, "application/json; charset=utf-8", res.Header.Get("Content-Type"))
		}
		res := get(t, h, http.MethodHead, target)
		assert.Equal(t, http.StatusOK, res.StatusCode, "HEAD %s", target)
	}
	for _, target := range []string{"/api", "/api/", "/api/overview/", "/api/overview.json", "/index.html",
		"/api/purge", "/api/queues/work/purge", "/debug/pprof/", "/favicon.ico", "//api/overview"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			res := get(t, h, method, target)
			assert.Equal(t, http.StatusNotFound, res.StatusCode, "%s %s", method, target)
		}
	}
	st := mq.Stats()
	assert.Zero(t, st.Exchanges["jobs"].Published, "no request changed anything")
	assert.Zero(t, st.Queues["work"].Accepted)
}

func TestMountedUnderAPrefix(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, nop, 1, tinymq.WithQueueName("work")))
	t.Cleanup(mq.Stop)
	mux := http.NewServeMux()
	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", admin.Handler(mq)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	fetch := func(path string) (*http.Response, string) {
		res, err := client.Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		return res, body(t, res)
	}
	res, page := fetch("/debug/tinymq/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, page, `fetch("api/overview?"`, "the page's links are relative")
	assert.Contains(t, page, `href="api/overview"`)
	assert.NotContains(t, page, `"/api`)

	res, raw := fetch("/debug/tinymq/api/overview")
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, raw, `"name":"work"`)

	res, _ = fetch("/debug/tinymq/nope")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)

	// Without a mux, the mount point without its slash redirects to it,
	// relatively.
	bare := http.StripPrefix("/ops/mq", admin.Handler(mq))
	rec := httptest.NewRecorder()
	bare.ServeHTTP(rec, newRequest(http.MethodGet, "/ops/mq"))
	assert.Equal(t, http.StatusMovedPermanently, rec.Code)
	assert.Equal(t, "./mq/", rec.Header().Get("Location"))
}

func TestResponsesAreBounded(t *testing.T) {
	// Names of 300 bytes that JSON escapes to six bytes each, on 2000
	// queues bound to one exchange: far more than a page's budget
	// unbounded.
	mq := tinymq.New()
	long := strings.Repeat("<", 300)
	for i := range 2000 {
		name := fmt.Sprintf("%04d", i) + long
		require.NoError(t, mq.RegisterQueue(long, tinymq.Direct, nop, 1, tinymq.WithQueueName(name),
			tinymq.WithBindingKey(strings.Repeat("&", 200)), tinymq.WithBindingKey(strings.Repeat(">", 200))))
	}
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq)
	ov, raw := overviewQuery(t, h, "limit=1000")
	assert.LessOrEqual(t, len(raw), 5<<20, "every list within its budget")
	assert.Greater(t, len(raw), 1<<20, "the budget is used, not wasted")
	assert.True(t, ov.Truncated)
	assert.Equal(t, 2000, ov.QueueCount)
	assert.Less(t, len(ov.Queues), 1000, "the page ended before its limit")
	assert.NotEmpty(t, ov.Queues)
	require.NotNil(t, ov.QueuePage.NextOffset)
	assert.Equal(t, len(ov.Queues), *ov.QueuePage.NextOffset, "and says where the next one begins")
	q := ov.Queues[0].Name
	assert.LessOrEqual(t, len(q), 256)
	assert.True(t, strings.HasSuffix(q, "…"), "a cut name says so")

	// What does not fit is on the next pages: every queue is reached.
	seen := map[string]bool{}
	for offset, pages := 0, 0; ; pages++ {
		require.Less(t, pages, 20, "paging gets somewhere")
		page, raw := overviewQuery(t, h, fmt.Sprintf("limit=1000&offset=%d", offset))
		assert.LessOrEqual(t, len(raw), 5<<20)
		require.NotEmpty(t, page.Queues)
		for _, q := range page.Queues {
			assert.False(t, seen[q.Name], "%.8s twice", q.Name)
			seen[q.Name] = true
		}
		if page.QueuePage.NextOffset == nil {
			break
		}
		offset = *page.QueuePage.NextOffset
	}
	assert.Len(t, seen, 2000)

	// The exchange is listed, with its binding count and the first
	// bindings; api/bindings lists them all, paged likewise.
	require.Len(t, ov.Exchanges, 1)
	x := ov.Exchanges[0]
	assert.Equal(t, 2000, x.BindingCount)
	assert.NotEmpty(t, x.Bindings)
	assert.LessOrEqual(t, len(x.Bindings), 32)
	bound := 0
	for offset, pages := 0, 0; ; pages++ {
		require.Less(t, pages, 20, "paging gets somewhere")
		res := get(t, h, http.MethodGet, "/api/bindings?limit=1000&offset="+fmt.Sprint(offset)+
			"&exchange="+url.QueryEscape(long))
		raw := body(t, res)
		require.Equal(t, http.StatusOK, res.StatusCode, raw)
		assert.LessOrEqual(t, len(raw), 1<<20+4096)
		var page struct {
			Exchange string    `json:"exchange"`
			Page     PageInfo  `json:"page"`
			Bindings []Binding `json:"bindings"`
		}
		require.NoError(t, json.Unmarshal([]byte(raw), &page))
		assert.Equal(t, 2000, page.Page.Matched)
		require.NotEmpty(t, page.Bindings)
		bound += len(page.Bindings)
		if page.Page.NextOffset == nil {
			break
		}
		offset = *page.Page.NextOffset
	}
	assert.Equal(t, 2000, bound)
	res := get(t, h, http.MethodGet, "/api/bindings?exchange=nope")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
}

func TestLongErrorsAreCut(t *testing.T) {
	mq := tinymq.New()
	huge := strings.Repeat("é", 10_000) // two bytes each: cut on a rune boundary
	done := make(chan struct{})
	var once sync.Once
	require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		once.Do(func() { close(done) })
		return errors.New(huge)
	}, 1, tinymq.WithQueueName("q")))
	require.NoError(t, mq.Start(context.Background()))
	require.NoError(t, mq.Publish("ev", 1))
	<-done
	mq.Stop()
	ov, raw := overview(t, admin.Handler(mq))
	assert.Less(t, len(raw), 8192, "the 20 kB error is in it twice (recent, and its group), cut")
	require.Len(t, ov.DeadLetters, 1)
	msg := ov.DeadLetters[0].LastError
	assert.LessOrEqual(t, len(msg), 256)
	assert.Equal(t, strings.Repeat("é", 126)+"…", msg)
	require.Len(t, ov.DeadGroups, 1)
	assert.Equal(t, msg, ov.DeadGroups[0].Reasons[0].LastError)
}

// panicky is an engine whose Stats panics while armed, and otherwise
// reports counters that go down: hostile user code behind the MQ.
type panicky struct {
	mu    sync.Mutex
	armed bool
	calls uint64
}

func (*panicky) Init(tinymq.EngineConfig)                         {}
func (*panicky) DeclareExchange(tinymq.ExchangeSpec) error        { return nil }
func (*panicky) DeclareQueue(tinymq.QueueSpec) error              { return nil }
func (*panicky) Bind(tinymq.BindingSpec) error                    { return nil }
func (*panicky) Publish(context.Context, tinymq.Publishing) error { return nil }
func (*panicky) Start(context.Context) error                      { return nil }
func (*panicky) Unbind(tinymq.BindingSpec) error                  { return nil }
func (*panicky) Consume(string, tinymq.ConsumerFunc, int) (tinymq.EngineSubscription, error) {
	return nil, tinymq.ErrUnsupported
}
func (*panicky) DeleteQueue(string, bool, bool) (int, error) { return 0, tinymq.ErrUnsupported }
func (*panicky) PurgeQueue(string) (int, error)              { return 0, tinymq.ErrUnsupported }
func (*panicky) DeleteExchange(string, bool) error           { return tinymq.ErrUnsupported }
func (*panicky) PauseQueue(string) error                     { return tinymq.ErrUnsupported }
func (*panicky) ResumeQueue(string) error                    { return tinymq.ErrUnsupported }
func (*panicky) Shutdown(context.Context) error              { return nil }
func (e *panicky) Stats() tinymq.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.armed {
		panic("engine exploded")
	}
	e.calls++
	return tinymq.Stats{Queues: map[string]tinymq.QueueStats{"q": {Accepted: 1000 - e.calls}}}
}

func TestHostileEngine(t *testing.T) {
	e := &panicky{armed: true}
	mq := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q")))
	h := admin.Handler(mq, admin.WithRateWindow(time.Second))

	res := get(t, h, http.MethodGet, "/api/overview")
	assert.Equal(t, http.StatusInternalServerError, res.StatusCode)
	assert.NotContains(t, body(t, res), "exploded", "the panic value is not echoed")

	e.mu.Lock()
	e.armed = false
	e.mu.Unlock()
	first, _ := overview(t, h)
	assert.Equal(t, uint64(999), first.Queues[0].Counters["accepted"])
	waitFor(t, "rates", func() bool {
		ov, _ := overview(t, h)
		return ov.RateSeconds != nil
	})
	ov, _ := overview(t, h)
	assert.Zero(t, ov.Queues[0].Rates["published_per_sec"], "a counter that went down is no negative rate")
	assert.Empty(t, ov.DeadLetters, "an engine keeps no dead letters")
	require.NoError(t, mq.Shutdown(context.Background()))
}

func TestHandlerArguments(t *testing.T) {
	assert.PanicsWithValue(t, "admin: Handler called with a nil *tinymq.MQ", func() { admin.Handler(nil) })

	mq := tinymq.New()
	t.Cleanup(mq.Stop)
	for _, tc := range []struct {
		opt  admin.Option
		want int64
	}{
		{nil, 1000},
		{admin.WithRefresh(0), 1000},
		{admin.WithRefresh(-time.Second), 1000},
		{admin.WithRefresh(time.Millisecond), 100},
		{admin.WithRefresh(5 * time.Second), 5000},
	} {
		ov, _ := overview(t, admin.Handler(mq, tc.opt, admin.WithRateWindow(-1)))
		assert.Equal(t, tc.want, ov.RefreshMillis)
	}
}

// The page shows how long the oldest ready message of each queue has waited.
func TestOverviewShowsTheOldestMessagesAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mq := tinymq.New()
		require.NoError(t, mq.DeclareQueue("idle", "a", tinymq.Fanout))
		require.NoError(t, mq.DeclareQueue("waiting", "b", tinymq.Fanout))
		require.NoError(t, mq.Start(context.Background()))
		defer mq.Stop()
		require.NoError(t, mq.Publish("b", "job"))
		time.Sleep(42 * time.Second)
		ov, _ := overview(t, admin.Handler(mq))
		require.Len(t, ov.Queues, 2)
		assert.Zero(t, ov.Queues[0].OldestAgeMillis, "idle")
		assert.InDelta(t, 42000, ov.Queues[1].OldestAgeMillis, 10, "the job waited 42s")
	})
}
