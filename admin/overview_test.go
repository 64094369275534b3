package admin_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

func names(qs []Queue) []string {
	out := make([]string, 0, len(qs))
	for _, q := range qs {
		out = append(out, q.Name)
	}
	return out
}

func TestQueuesArePagedSortedAndFiltered(t *testing.T) {
	mq := tinymq.New()
	animals := []string{"Cat", "dog", "eel"}
	var registered []string
	for i := range 30 {
		// Registered out of name order, with depth i%7.
		name := fmt.Sprintf("%s-%02d", animals[i%3], 29-i)
		registered = append(registered, name)
		require.NoError(t, mq.DeclareQueue(name, "x"+name, tinymq.Fanout))
		for range i % 7 {
			require.NoError(t, mq.Publish("x"+name, i))
		}
	}
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq)

	ov, _ := overviewQuery(t, h, "limit=10")
	assert.Equal(t, registered[:10], names(ov.Queues), "registration order by default")
	assert.Equal(t, PageInfo{Offset: 0, Limit: 10, Matched: 30, NextOffset: ptr(10)}, ov.QueuePage)
	ov, _ = overviewQuery(t, h, "limit=10&offset=25")
	assert.Equal(t, registered[25:], names(ov.Queues))
	assert.Nil(t, ov.QueuePage.NextOffset, "the last page")
	ov, _ = overviewQuery(t, h, "offset=40")
	assert.Empty(t, ov.Queues, "past the end")
	assert.Equal(t, 30, ov.QueuePage.Matched)
	ov, _ = overview(t, h)
	assert.Len(t, ov.Queues, 30, "a default page holds 100")
	assert.Equal(t, 100, ov.QueuePage.Limit)

	byName := slices.Clone(registered)
	slices.Sort(byName)
	ov, _ = overviewQuery(t, h, "sort=name&limit=30")
	assert.Equal(t, byName, names(ov.Queues))
	assert.Equal(t, "asc", ov.QueuePage.Order)
	ov, _ = overviewQuery(t, h, "sort=name&order=desc&limit=5")
	assert.Equal(t, []string{byName[29], byName[28], byName[27], byName[26], byName[25]}, names(ov.Queues))

	ov, _ = overviewQuery(t, h, "sort=depth&limit=30")
	assert.Equal(t, "desc", ov.QueuePage.Order, "the deepest first by default")
	for i := 1; i < len(ov.Queues); i++ {
		a, b := ov.Queues[i-1], ov.Queues[i]
		assert.True(t, a.Depth > b.Depth || a.Depth == b.Depth && a.Name < b.Name, "%s then %s", a.Name, b.Name)
	}
	assert.Equal(t, 6, ov.Queues[0].Depth)
	ov, _ = overviewQuery(t, h, "sort=depth&order=asc&limit=1")
	assert.Zero(t, ov.Queues[0].Depth)

	ov, _ = overviewQuery(t, h, "filter=cAt&sort=name")
	assert.Equal(t, 10, ov.QueuePage.Matched, "a substring, without regard to case")
	assert.Equal(t, "cAt", ov.QueuePage.Filter)
	for _, q := range ov.Queues {
		assert.True(t, strings.HasPrefix(q.Name, "Cat-"), q.Name)
	}
	assert.Equal(t, 30, ov.QueueCount, "the count is of every queue")
	assert.Equal(t, 85, ov.Totals.Depth, "and so are the totals")
	ov, _ = overviewQuery(t, h, "filter=zebra")
	assert.Empty(t, ov.Queues)
	assert.Zero(t, ov.QueuePage.Matched)

	ov, _ = overviewQuery(t, h, "limit=1&queue="+registered[20])
	require.NotNil(t, ov.Selected, "the selected queue, wherever it is")
	assert.Equal(t, registered[20], ov.Selected.Name)
	ov, _ = overviewQuery(t, h, "queue=nope")
	assert.Nil(t, ov.Selected)

	ov, _ = overviewQuery(t, h, "exchange_limit=4&exchange_offset=2&exchange_filter=DOG")
	assert.Equal(t, 10, ov.ExchangePage.Matched)
	require.Len(t, ov.Exchanges, 4)
	assert.Equal(t, "xdog-07", ov.Exchanges[0].Name, "sorted by name, from the third")
	assert.Equal(t, ptr(6), ov.ExchangePage.NextOffset)
	assert.Equal(t, 30, ov.ExchangeCount)

	for _, bad := range []string{"sort=bogus", "order=up", "limit=0", "limit=1001", "offset=-1", "offset=x",
		"exchange_limit=0", "exchange_offset=-2"} {
		res := get(t, h, http.MethodGet, "/api/overview?"+bad)
		assert.Equal(t, http.StatusBadRequest, res.StatusCode, bad)
		assert.Contains(t, body(t, res), "bad request", bad)
	}
}

func ptr[T any](v T) *T { return &v }

func TestQueuesSortByRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mq := tinymq.New()
		for _, name := range []string{"slow", "busy", "idle"} {
			require.NoError(t, mq.DeclareQueue(name, name, tinymq.Fanout))
		}
		t.Cleanup(mq.Stop)
		h := admin.Handler(mq, admin.WithRateWindow(time.Second))
		overview(t, h)
		for i := range 30 {
			require.NoError(t, mq.Publish("busy", i))
			if i%3 == 0 {
				require.NoError(t, mq.Publish("slow", i))
			}
		}
		time.Sleep(2 * time.Second)
		ov, _ := overviewQuery(t, h, "sort=rate")
		assert.Equal(t, []string{"busy", "slow", "idle"}, names(ov.Queues))
		assert.InDelta(t, 15, ov.Queues[0].Rates["published_per_sec"], 1e-9)
		require.NotNil(t, ov.Totals.PublishedRate)
		assert.InDelta(t, 20, *ov.Totals.PublishedRate, 1e-9)
	})
}

func TestHistoryFeedsTheSparklines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mq := tinymq.New()
		require.NoError(t, mq.DeclareQueue("q", "in", tinymq.Fanout))
		t.Cleanup(mq.Stop)
		h := admin.Handler(mq)

		// One request per 5-second step, publishing 10 messages before
		// each; then a minute with no request.
		var last Overview
		for step := range 4 {
			for range 10 {
				require.NoError(t, mq.Publish("in", step))
			}
			last, _ = overview(t, h)
			// Several requests in one step write one point.
			overview(t, h)
			time.Sleep(5 * time.Second)
		}
		hist := last.Queues[0].History
		require.Len(t, hist.Depth, 60)
		require.Len(t, hist.Published, 60)
		require.Len(t, hist.Delivered, 60)
		val := func(s []*float64, i int) any {
			if s[i] == nil {
				return nil
			}
			return *s[i]
		}
		for i, want := range []any{10.0, 20.0, 30.0, 40.0} {
			assert.Equal(t, want, val(hist.Depth, 56+i), "depth at step %d", i)
		}
		assert.Nil(t, hist.Depth[55], "before the first request: no data")
		assert.Nil(t, hist.Published[56], "no rate at the first point")
		assert.Equal(t, 2.0, val(hist.Published, 57), "10 messages in 5 s")
		assert.Equal(t, 0.0, val(hist.Delivered, 57))
		assert.Equal(t, int64(5000), last.History.StepMillis)
		assert.NotEmpty(t, last.History.End)
		assert.Equal(t, 40.0, val(last.History.Depth, 59), "the totals have a history too")
		assert.Equal(t, 2.0, val(last.History.Published, 59))

		time.Sleep(time.Minute)
		ov, _ := overview(t, h)
		hist = ov.Queues[0].History
		assert.Equal(t, 40.0, val(hist.Depth, 59))
		assert.Nil(t, hist.Depth[58], "a step with no request stays empty")
		assert.Equal(t, 40.0, val(hist.Depth, 46), "the old points moved left")
		assert.Equal(t, 0.0, val(hist.Published, 59), "nothing was published since")

		time.Sleep(10 * time.Minute)
		ov, _ = overview(t, h)
		hist = ov.Queues[0].History
		assert.Equal(t, 40.0, val(hist.Depth, 59))
		for i := range 59 {
			assert.Nil(t, hist.Depth[i], "older than the history: gone")
		}
	})
}

func TestDeadLettersGroupedWithTheirTotals(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return errors.New("<b>nope</b>")
	}, 1, tinymq.WithQueueName("failing")))
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return errors.New("again")
	}, 1, tinymq.WithQueueName("to-dlx"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, mq.DeclareQueue("parking", "dlx", tinymq.Fanout))
	require.NoError(t, mq.DeclareQueue("short", "tiny", tinymq.Fanout, tinymq.WithMaxLen(2, tinymq.DropHead)))
	require.NoError(t, mq.DeclareQueue("doomed", "gone", tinymq.Fanout))
	require.NoError(t, mq.DeclareQueue("doomed-dlx", "gone", tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.DropHead)))
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(mq.Stop)

	// 100 dead letters: more than the ring's 64.
	for i := range 50 {
		require.NoError(t, mq.Publish("jobs", i))
	}
	for i := range 5 {
		require.NoError(t, mq.Publish("tiny", i))
	}
	for i := range 3 {
		require.NoError(t, mq.Publish("gone", i))
	}
	waitFor(t, "every dead letter", func() bool {
		st := mq.Stats().Queues
		return st["failing"].Dropped == 50 && st["to-dlx"].DeadLettered == 50
	})
	_, err := mq.DeleteQueue("doomed-dlx")
	require.NoError(t, err)

	ov, _ := overview(t, admin.Handler(mq))
	st := mq.Stats()
	var want uint64
	for _, qs := range st.Queues {
		want += qs.DeadLettered + qs.Dropped
	}
	want += st.Deleted.DeadLettered + st.Deleted.Dropped
	assert.Equal(t, uint64(50+50+3+2), want)
	assert.Equal(t, want, ov.DeadLetterSum.Total, "the real total, not the ring's 64")
	assert.Equal(t, uint64(50), ov.DeadLetterSum.DeadLettered)
	assert.Equal(t, 4, ov.DeadLetterSum.Queues)
	assert.Len(t, ov.DeadLetters, 64)

	require.Len(t, ov.DeadGroups, 4)
	byQueue := map[string]int{}
	for i, g := range ov.DeadGroups {
		byQueue[g.Queue] = i
	}
	failing := ov.DeadGroups[byQueue["failing"]]
	assert.Equal(t, uint64(50), failing.Total)
	assert.Equal(t, uint64(50), failing.Dropped)
	require.Len(t, failing.Reasons, 1)
	r := failing.Reasons[0]
	assert.Equal(t, "rejected", r.Reason)
	assert.Equal(t, uint64(50), r.Total)
	assert.Positive(t, r.Recent)
	assert.Equal(t, "<b>nope</b>", r.LastError)
	assert.True(t, strings.HasPrefix(r.LastOutcome, "dropped: "), r.LastOutcome)

	dlx := ov.DeadGroups[byQueue["to-dlx"]]
	assert.Equal(t, uint64(50), dlx.DeadLettered)
	assert.Equal(t, "dead-lettered to dlx", dlx.Reasons[0].LastOutcome)

	short := ov.DeadGroups[byQueue["short"]]
	assert.Equal(t, uint64(3), short.Total)
	require.Len(t, short.Reasons, 1)
	assert.Equal(t, "maxlen", short.Reasons[0].Reason)

	deleted := ov.DeadGroups[byQueue[""]]
	assert.True(t, deleted.Deleted, "the deleted queues' dead letters stay in the total")
	assert.Equal(t, uint64(2), deleted.Total)
	assert.Equal(t, uint64(1), ov.Totals.DeletedQueues)
}

// manyQueues is an MQ with n queues, each bound to one of 100 exchanges, a
// few messages in each.
func manyQueues(tb testing.TB, n int) *tinymq.MQ {
	tb.Helper()
	mq := tinymq.New()
	for i := range n {
		name := fmt.Sprintf("tenant-%05d.events", i)
		ex := fmt.Sprintf("events-%02d", i%100)
		require.NoError(tb, mq.DeclareQueue(name, ex, tinymq.Topic, tinymq.WithBindingKey(fmt.Sprintf("t%d.#", i))))
		for j := range i % 4 {
			require.NoError(tb, mq.Publish(ex, j, tinymq.WithRoutingKey(fmt.Sprintf("t%d.created", i))))
		}
	}
	tb.Cleanup(mq.Stop)
	return mq
}

// TestTenThousandQueues lists every queue and every exchange of an MQ with
// 10,000 queues, page by page, and logs what a request costs (no timing
// is asserted: the machine may be busy).
func TestTenThousandQueues(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 queues: not in -short")
	}
	const n = 10_000
	mq := manyQueues(t, n)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	h := admin.Handler(mq)
	for _, query := range []string{"limit=50", "limit=50&sort=depth", "limit=50&sort=name&filter=0042", "limit=1000"} {
		start := time.Now()
		ov, raw := overviewQuery(t, h, query)
		t.Logf("10,000 queues, GET api/overview?%s: %v, %d bytes, %d queues", query, time.Since(start).Round(time.Millisecond),
			len(raw), len(ov.Queues))
		assert.Equal(t, n, ov.QueueCount)
		assert.Equal(t, 100, ov.ExchangeCount)
	}
	kept := int64(heap()) - int64(before)
	t.Logf("10,000 queues: the handler keeps %d kB (one rate snapshot and one step of history), %d bytes a queue",
		kept>>10, kept/n)
	runtime.KeepAlive(h)
	seen := 0
	for offset := 0; ; {
		ov, _ := overviewQuery(t, h, fmt.Sprintf("limit=1000&offset=%d&exchange_limit=1000", offset))
		seen += len(ov.Queues)
		assert.Len(t, ov.Exchanges, 100, "every exchange on every page")
		if ov.QueuePage.NextOffset == nil {
			break
		}
		offset = *ov.QueuePage.NextOffset
	}
	assert.Equal(t, n, seen, "every queue is listed")
	ov, _ := overviewQuery(t, h, "sort=depth&limit=1")
	assert.Equal(t, 3, ov.Queues[0].Depth)
	assert.Equal(t, n/4*6, ov.Totals.Depth)
}

// BenchmarkOverview measures one request of the page's (a page of 50
// queues, and one of 1000) at 1000 and 10,000 queues. Run it short:
//
//	go test -run '^$' -bench Overview -benchtime 20x ./admin
func BenchmarkOverview(b *testing.B) {
	for _, n := range []int{1000, 10_000} {
		mq := manyQueues(b, n)
		h := admin.Handler(mq)
		for _, query := range []string{"limit=50", "limit=50&sort=rate", "limit=1000"} {
			b.Run(fmt.Sprintf("queues=%d/%s", n, query), func(b *testing.B) {
				b.ReportAllocs()
				var size int
				for b.Loop() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, newRequest(http.MethodGet, "/api/overview?"+query))
					size = rec.Body.Len()
					if rec.Code != http.StatusOK {
						b.Fatal(rec.Code)
					}
				}
				b.ReportMetric(float64(size), "bytes/op-response")
			})
		}
	}
}
