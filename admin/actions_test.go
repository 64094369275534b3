package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

// ActionResult is the JSON of an action as a client decodes it.
type ActionResult struct {
	Action    string `json:"action"`
	Queue     string `json:"queue"`
	Count     int    `json:"count"`
	Paused    *bool  `json:"paused"`
	Error     string `json:"error"`
	Payloads  *bool  `json:"payloads"`
	Truncated bool   `json:"truncated"`
	Messages  []struct {
		ID          uint64            `json:"id"`
		Exchange    string            `json:"exchange"`
		RoutingKey  string            `json:"routing_key"`
		Headers     map[string]string `json:"headers"`
		Attempt     int               `json:"attempt"`
		Redelivered bool              `json:"redelivered"`
		Size        *int              `json:"size"`
		Type        string            `json:"type"`
		DeathCount  int               `json:"death_count"`
		Deaths      []struct {
			Reason    string `json:"reason"`
			Queue     string `json:"queue"`
			Exchange  string `json:"exchange"`
			Count     int    `json:"count"`
			LastError string `json:"last_error"`
		} `json:"deaths"`
		Payload          *string `json:"payload"`
		PayloadEncoding  string  `json:"payload_encoding"`
		PayloadTruncated bool    `json:"payload_truncated"`
		PayloadError     string  `json:"payload_error"`
	} `json:"messages"`
}

var tokenRE = regexp.MustCompile(`<meta name="tinymq-token" content="([A-Za-z0-9_-]+)">`)

// tokenOf reads the actions' token from the page, as its script does.
func tokenOf(t *testing.T, h http.Handler) string {
	t.Helper()
	res := get(t, h, http.MethodGet, "/")
	m := tokenRE.FindStringSubmatch(body(t, res))
	require.NotNil(t, m, "the page holds the token")
	return m[1]
}

// post makes the request that the page's script makes for an action: a
// same-origin POST with the token.
func post(t *testing.T, h http.Handler, token, action string, params url.Values) (*http.Response, ActionResult) {
	t.Helper()
	r := newRequest(http.MethodPost, "/api/"+action+"?"+params.Encode())
	r.Header.Set("X-TinyMQ-Token", token)
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	r.Header.Set("Origin", "http://localhost")
	return serveAction(t, h, r)
}

func serveAction(t *testing.T, h http.Handler, r *http.Request) (*http.Response, ActionResult) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	res := rec.Result()
	raw := body(t, res)
	assert.Equal(t, "application/json; charset=utf-8", res.Header.Get("Content-Type"), raw)
	var ar ActionResult
	require.NoError(t, json.Unmarshal([]byte(raw), &ar), raw)
	return res, ar
}

func q(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// parked is an MQ with a queue "parked" that no one consumes, holding n
// messages.
func parked(t *testing.T, n int) *tinymq.MQ {
	t.Helper()
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue("parked", "in", tinymq.Fanout))
	for i := range n {
		require.NoError(t, mq.Publish("in", fmt.Sprintf("message %d", i)))
	}
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(mq.Stop)
	return mq
}

func TestActionsAreOffByDefault(t *testing.T) {
	mq := parked(t, 3)
	h := admin.Handler(mq)
	page := body(t, get(t, h, http.MethodGet, "/"))
	assert.NotContains(t, page, `<meta name="tinymq-token"`, "no token without actions")
	ov, _ := overview(t, h)
	assert.False(t, ov.Actions.Enabled)
	for _, a := range []string{"purge", "delete", "pause", "resume", "replay", "peek"} {
		r := newRequest(http.MethodPost, "/api/"+a+"?queue=parked&n=1")
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		assert.Equal(t, http.StatusNotFound, rec.Code, a)
	}
	// WithPayloads alone turns nothing on.
	h = admin.Handler(mq, admin.WithPayloads())
	res := get(t, h, http.MethodPost, "/api/peek?queue=parked")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)
	ov, _ = overview(t, h)
	assert.False(t, ov.Actions.Payloads)
	assert.Equal(t, 3, mq.Stats().Queues["parked"].Depth, "nothing changed")
}

func TestPurgeRemovesTheWaitingMessages(t *testing.T) {
	mq := parked(t, 7)
	h := admin.Handler(mq, admin.WithActions())
	ov, _ := overview(t, h)
	assert.True(t, ov.Actions.Enabled)
	res, ar := post(t, h, tokenOf(t, h), "purge", q("queue", "parked"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	assert.Equal(t, ActionResult{Action: "purge", Queue: "parked", Count: 7}, ar)
	st := mq.Stats().Queues["parked"]
	assert.Zero(t, st.Depth)
	assert.Equal(t, uint64(7), st.Purged)
}

func TestDeleteRemovesTheQueue(t *testing.T) {
	mq := parked(t, 2)
	require.NoError(t, mq.PauseQueue("parked")) // before the consumer, which would take the messages
	_, err := mq.Consume("parked", func(context.Context, *tinymq.Msg) error { return nil }, 1)
	require.NoError(t, err)
	require.NoError(t, mq.DeclareQueue("spare", "in", tinymq.Fanout))
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)

	res, ar := post(t, h, token, "delete", q("queue", "parked", "if_unused", "1"))
	assert.Equal(t, http.StatusConflict, res.StatusCode, "ErrInUse")
	assert.Contains(t, ar.Error, "in use")
	res, ar = post(t, h, token, "delete", q("queue", "parked", "if_empty", "true"))
	assert.Equal(t, http.StatusConflict, res.StatusCode, "ErrNotEmpty")
	assert.Contains(t, ar.Error, "not empty")
	assert.Len(t, mq.Topology().Queues, 2, "nothing was deleted")

	res, ar = post(t, h, token, "delete", q("queue", "spare", "if_unused", "1", "if_empty", "1"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	assert.Zero(t, ar.Count)

	res, ar = post(t, h, token, "delete", q("queue", "parked"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	assert.Equal(t, "delete", ar.Action)
	assert.Equal(t, 2, ar.Count)
	st := mq.Stats()
	assert.NotContains(t, st.Queues, "parked")
	assert.Equal(t, uint64(2), st.DeletedQueues)
	assert.Equal(t, uint64(2), st.Deleted.Removed)
	ov, _ := overview(t, h)
	assert.Equal(t, uint64(2), ov.Totals.DeletedQueues)
	assert.Equal(t, uint64(2), ov.Totals.Removed)

	res, ar = post(t, h, token, "delete", q("queue", "parked"))
	assert.Equal(t, http.StatusNotFound, res.StatusCode, "ErrUnknownQueue")
	assert.Contains(t, ar.Error, "unknown queue")
}

func TestPauseAndResume(t *testing.T) {
	mq := tinymq.New()
	release := make(chan struct{})
	require.NoError(t, mq.RegisterQueue("in", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, 1, tinymq.WithQueueName("work")))
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(func() { close(release); mq.Stop() })
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)

	res, ar := post(t, h, token, "pause", q("queue", "work"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	require.NotNil(t, ar.Paused)
	assert.True(t, *ar.Paused)
	ov, _ := overview(t, h)
	assert.True(t, ov.Queues[0].Paused)
	assert.Equal(t, 1, ov.Totals.Paused)

	res, ar = post(t, h, token, "resume", q("queue", "work"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	assert.False(t, *ar.Paused)
	ov, _ = overview(t, h)
	assert.False(t, ov.Queues[0].Paused)
}

// deadLettering is an MQ whose queue "work" fails every message while fail
// is set and dead-letters it, through exchange "dlx", to "parking", which
// no one consumes.
func deadLettering(t *testing.T, fail *atomic.Bool) *tinymq.MQ {
	t.Helper()
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Direct, func(context.Context, *tinymq.Msg) error {
		if fail.Load() {
			return errors.New("<b>card declined</b>")
		}
		return nil
	}, 1, tinymq.WithQueueName("work"), tinymq.WithBindingKey("job"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, mq.DeclareQueue("parking", "dlx", tinymq.Fanout))
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(mq.Stop)
	return mq
}

func TestReplayMovesDeadLettersBack(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	mq := deadLettering(t, &fail)
	for i := range 4 {
		require.NoError(t, mq.Publish("jobs", i, tinymq.WithRoutingKey("job")))
	}
	waitFor(t, "four dead letters parked", func() bool { return mq.Stats().Queues["parking"].Depth == 4 })
	require.NoError(t, mq.PauseQueue("work"))
	fail.Store(false)
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)

	res, ar := post(t, h, token, "replay", q("queue", "parking", "n", "3"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	assert.Equal(t, 3, ar.Count)
	st := mq.Stats().Queues
	assert.Equal(t, 1, st["parking"].Depth)
	assert.Equal(t, uint64(3), st["parking"].Replayed)
	assert.Equal(t, 3, st["work"].Depth, "back in the queue they died in")

	// A message with no death record stays, and says so.
	require.NoError(t, mq.Publish("dlx", "never died"))
	res, ar = post(t, h, token, "replay", q("queue", "parking", "n", "10"))
	assert.Equal(t, http.StatusConflict, res.StatusCode, "ErrNoDeath")
	assert.Equal(t, 1, ar.Count, "the one with a death moved")
	assert.Contains(t, ar.Error, "no death record")
	assert.Equal(t, 1, mq.Stats().Queues["parking"].Depth)

	require.NoError(t, mq.ResumeQueue("work"))
	waitFor(t, "the replayed messages succeeded", func() bool { return mq.Stats().Queues["work"].Succeeded == 4 })
}

func TestPeekShowsMetadataNotPayloads(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	mq := deadLettering(t, &fail)
	require.NoError(t, mq.Publish("jobs", "alice@example.com", tinymq.WithRoutingKey("job"),
		tinymq.WithHeaders(map[string]any{"tenant": "<i>acme</i>", "n": int32(3)})))
	waitFor(t, "a dead letter parked", func() bool { return mq.Stats().Queues["parking"].Depth == 1 })
	h := admin.Handler(mq, admin.WithActions())

	res, ar := post(t, h, tokenOf(t, h), "peek", q("queue", "parking"))
	require.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	require.NotNil(t, ar.Payloads)
	assert.False(t, *ar.Payloads)
	require.Len(t, ar.Messages, 1)
	m := ar.Messages[0]
	assert.Equal(t, uint64(1), m.ID)
	assert.Equal(t, "job", m.RoutingKey)
	assert.Equal(t, map[string]string{"tenant": `"<i>acme</i>"`, "n": "3"}, m.Headers)
	require.NotNil(t, m.Size)
	assert.Equal(t, len("alice@example.com"), *m.Size)
	assert.Equal(t, "string", m.Type)
	require.Len(t, m.Deaths, 1)
	assert.Equal(t, "rejected", m.Deaths[0].Reason)
	assert.Equal(t, "work", m.Deaths[0].Queue)
	assert.Equal(t, "<b>card declined</b>", m.Deaths[0].LastError)
	assert.Nil(t, m.Payload, "no payload without WithPayloads")
	assert.Equal(t, 1, mq.Stats().Queues["parking"].Depth, "peek changes nothing")

	raw := body(t, peekRaw(t, h, "parking"))
	assert.NotContains(t, raw, "alice", "the payload is nowhere in the response")
	assert.NotContains(t, raw, "<i>", "names and headers are escaped")
}

func peekRaw(t *testing.T, h http.Handler, queue string) *http.Response {
	t.Helper()
	r := newRequest(http.MethodPost, "/api/peek?queue="+url.QueryEscape(queue))
	r.Header.Set("X-TinyMQ-Token", tokenOf(t, h))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Result()
}

func TestPeekShowsPayloadsWhenAsked(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue("parked", "in", tinymq.Fanout))
	hostile := `</script><script>alert(1)</script>`
	require.NoError(t, mq.Publish("in", hostile))
	require.NoError(t, mq.Publish("in", []byte{0xff, 0x00, 0x01}))
	require.NoError(t, mq.Publish("in", map[string]int{"<n>": 1}))
	require.NoError(t, mq.Publish("in", strings.Repeat("x", 10_000)))
	require.NoError(t, mq.Publish("in", json.RawMessage(`{"a":1}`)))
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq, admin.WithActions(), admin.WithPayloads())
	ov, _ := overview(t, h)
	assert.True(t, ov.Actions.Payloads)

	raw := body(t, peekRaw(t, h, "parked"))
	assert.NotContains(t, raw, "<script>", "payloads are escaped in the JSON")
	var ar ActionResult
	require.NoError(t, json.Unmarshal([]byte(raw), &ar))
	require.True(t, *ar.Payloads)
	require.Len(t, ar.Messages, 5)
	for i, want := range []struct{ payload, encoding string }{
		{hostile, "text"},
		{"/wAB", "base64"},
		{`{"\u003cn\u003e":1}`, "json"},
		{"", "text"},
		{`{"a":1}`, "text"},
	} {
		m := ar.Messages[i]
		require.NotNil(t, m.Payload, "message %d", i)
		assert.Equal(t, want.encoding, m.PayloadEncoding, "message %d", i)
		if want.payload != "" {
			assert.Equal(t, want.payload, *m.Payload, "message %d", i)
		}
	}
	long := ar.Messages[3]
	assert.True(t, long.PayloadTruncated)
	assert.LessOrEqual(t, len(*long.Payload), 4096)
	assert.Equal(t, 10_000, *long.Size)
	assert.Nil(t, ar.Messages[2].Size, "a value of another type has no size without encoding it")

	res, ar := post(t, h, tokenOf(t, h), "peek", q("queue", "parked", "n", "2"))
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, 2, ar.Count)
	assert.Len(t, ar.Messages, 2)
}

// panicJSON panics when encoded: a payload's MarshalJSON is user code.
type panicJSON struct{}

func (panicJSON) MarshalJSON() ([]byte, error) { panic("boom") }

func TestPeekSurvivesHostilePayloads(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue("parked", "in", tinymq.Fanout))
	require.NoError(t, mq.Publish("in", panicJSON{}))
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq, admin.WithActions(), admin.WithPayloads())
	res, ar := post(t, h, tokenOf(t, h), "peek", q("queue", "parked"))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Len(t, ar.Messages, 1)
	assert.Contains(t, ar.Messages[0].PayloadError, "cannot encode")
	assert.Nil(t, ar.Messages[0].Payload)
}

func TestActionErrorsMapToStatusCodes(t *testing.T) {
	mq := parked(t, 1)
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)
	for _, tc := range []struct {
		action string
		params url.Values
		code   int
		text   string
	}{
		{"purge", q("queue", "nope"), http.StatusNotFound, "unknown queue"},
		{"pause", q("queue", "nope"), http.StatusNotFound, "unknown queue"},
		{"resume", q("queue", "nope"), http.StatusNotFound, "unknown queue"},
		{"replay", q("queue", "nope", "n", "1"), http.StatusNotFound, "unknown queue"},
		{"peek", q("queue", "nope"), http.StatusNotFound, "unknown queue"},
		{"purge", q(), http.StatusBadRequest, "queue parameter is required"},
		{"replay", q("queue", "parked"), http.StatusBadRequest, "n parameter is required"},
		{"replay", q("queue", "parked", "n", "0"), http.StatusBadRequest, "n must be"},
		{"replay", q("queue", "parked", "n", "10001"), http.StatusBadRequest, "n must be"},
		{"peek", q("queue", "parked", "n", "-1"), http.StatusBadRequest, "n must be"},
		{"peek", q("queue", "parked", "n", "x"), http.StatusBadRequest, "n must be"},
	} {
		res, ar := post(t, h, token, tc.action, tc.params)
		assert.Equal(t, tc.code, res.StatusCode, "%s %v", tc.action, tc.params)
		assert.Contains(t, ar.Error, tc.text, "%s %v", tc.action, tc.params)
	}
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(method, "/api/purge?queue=parked"))
		assert.Equal(t, http.StatusMethodNotAllowed, rec.Code, method)
		assert.Equal(t, "POST", rec.Header().Get("Allow"))
	}
	assert.Equal(t, 1, mq.Stats().Queues["parked"].Depth, "nothing changed")

	mq.Stop()
	for _, a := range []string{"purge", "delete", "pause", "resume", "replay"} {
		res, ar := post(t, h, token, a, q("queue", "parked", "n", "1"))
		assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "%s after Stop: ErrStopped", a)
		assert.Contains(t, ar.Error, "stopped", a)
	}
	res, ar := post(t, h, token, "peek", q("queue", "parked"))
	assert.Equal(t, http.StatusOK, res.StatusCode, "peek works after Stop: it shows what Stop left")
	assert.Len(t, ar.Messages, ar.Count)
}

func TestActionsOnAnEngineAreUnsupported(t *testing.T) {
	mq := tinymq.New(tinymq.WithEngine(&panicky{}))
	require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q")))
	t.Cleanup(func() { require.NoError(t, mq.Shutdown(context.Background())) })
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)
	for _, a := range []string{"purge", "pause", "replay", "peek"} {
		res, ar := post(t, h, token, a, q("queue", "q", "n", "1"))
		assert.Equal(t, http.StatusNotImplemented, res.StatusCode, a)
		assert.Contains(t, ar.Error, "not supported", a)
	}
}

func TestForgedCrossSitePostIsRefused(t *testing.T) {
	mq := parked(t, 5)
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)
	other := admin.Handler(mq, admin.WithActions())
	otherToken := tokenOf(t, other)
	require.NotEqual(t, token, otherToken, "a token per handler")

	for _, tc := range []struct {
		name    string
		headers map[string]string
	}{
		{"a form from another site", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example",
			"X-TinyMQ-Token": token}},
		{"a fetch from a sibling site", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://localhost:9999",
			"X-TinyMQ-Token": token}},
		{"an old browser from another origin", map[string]string{"Origin": "http://evil.example", "X-TinyMQ-Token": token}},
		{"an opaque origin", map[string]string{"Origin": "null", "X-TinyMQ-Token": token}},
		{"no token", map[string]string{"Sec-Fetch-Site": "same-origin"}},
		{"a wrong token", map[string]string{"Sec-Fetch-Site": "same-origin", "X-TinyMQ-Token": token + "x"}},
		{"another handler's token", map[string]string{"Sec-Fetch-Site": "same-origin", "X-TinyMQ-Token": otherToken}},
	} {
		r := newRequest(http.MethodPost, "/api/purge?queue=parked")
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		res, ar := serveAction(t, h, r)
		assert.Equal(t, http.StatusForbidden, res.StatusCode, tc.name)
		assert.Contains(t, ar.Error, "forbidden", tc.name)
	}
	assert.Equal(t, 5, mq.Stats().Queues["parked"].Depth, "nothing was purged")

	// A client that is no browser (no Origin, no Sec-Fetch-Site) with the
	// token is let through, as the page is.
	r := newRequest(http.MethodPost, "/api/purge?queue=parked")
	r.Header.Set("X-TinyMQ-Token", token)
	res, ar := serveAction(t, h, r)
	assert.Equal(t, http.StatusOK, res.StatusCode, ar.Error)
	assert.Equal(t, 5, ar.Count)
}

func TestForeignHostIsRefused(t *testing.T) {
	mq := parked(t, 2)
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)
	for _, host := range []string{"evil.example", "evil.example:80", "localhost.evil.example", "127.0.0.2",
		"10.0.0.1:8080", "", "[::2]", "localhost:80:80", "LOCALHOST.", "[::1]x"} {
		for _, target := range []string{"/", "/api/overview", "/api/bindings?exchange=in", "/healthz", "/nope"} {
			r := newRequest(http.MethodGet, target)
			r.Host = host
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			assert.Equal(t, http.StatusForbidden, rec.Code, "GET %s Host %q", target, host)
			assert.NotContains(t, rec.Body.String(), "parked", "nothing of the MQ")
			assert.NotContains(t, rec.Body.String(), token)
		}
		r := newRequest(http.MethodPost, "/api/purge?queue=parked")
		r.Host = host
		r.Header.Set("X-TinyMQ-Token", token)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		res, ar := serveAction(t, h, r)
		assert.Equal(t, http.StatusForbidden, res.StatusCode, "POST Host %q", host)
		assert.Contains(t, ar.Error, "Host")
	}
	assert.Equal(t, 2, mq.Stats().Queues["parked"].Depth, "nothing was purged")

	for _, host := range []string{"localhost", "localhost:8080", "LocalHost:1", "127.0.0.1", "127.0.0.1:6060",
		"[::1]", "[::1]:6060"} {
		r := newRequest(http.MethodGet, "/api/overview")
		r.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		assert.Equal(t, http.StatusOK, rec.Code, "Host %q", host)
	}

	// The list can be set; it replaces the loopback names.
	h = admin.Handler(mq, admin.WithAllowedHosts("mq.example.com", "ops.example.com:8443", "[fd00::1]"))
	for host, want := range map[string]int{
		"mq.example.com": 200, "MQ.example.com:443": 200, "ops.example.com:8443": 200, "ops.example.com": 403,
		"ops.example.com:8444": 403, "[fd00::1]:80": 200, "localhost": 403, "127.0.0.1:80": 403,
	} {
		r := newRequest(http.MethodGet, "/api/overview")
		r.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		assert.Equal(t, want, rec.Code, "Host %q", host)
	}
	h = admin.Handler(mq, admin.WithAllowedHosts("*"))
	r := newRequest(http.MethodGet, "/api/overview")
	r.Host = "anything.example"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	assert.Equal(t, http.StatusOK, rec.Code, "* allows any host")
	h = admin.Handler(mq, admin.WithAllowedHosts())
	r.Host = "anything.example"
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	assert.Equal(t, http.StatusForbidden, rec.Code, "no hosts: the default")
}

func TestAuthorizeHookDecidesPerRequest(t *testing.T) {
	mq := parked(t, 4)
	type call struct{ user, action, queue string }
	calls := make(chan call, 10)
	h := admin.Handler(mq, admin.WithActions(), admin.WithAuthorize(func(r *http.Request, action, queue string) error {
		user := r.Header.Get("X-User")
		calls <- call{user, action, queue}
		switch {
		case user == "root":
			return nil
		case user == "boom":
			panic("hook exploded")
		case action == "peek":
			return nil
		}
		return fmt.Errorf("<b>%s</b> may not %s %s", user, action, queue)
	}))
	token := tokenOf(t, h)
	as := func(user, action string, params url.Values) (*http.Response, ActionResult) {
		r := newRequest(http.MethodPost, "/api/"+action+"?"+params.Encode())
		r.Header.Set("X-TinyMQ-Token", token)
		r.Header.Set("X-User", user)
		return serveAction(t, h, r)
	}

	res, ar := as("bob", "purge", q("queue", "parked"))
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	assert.Equal(t, "<b>bob</b> may not purge parked", ar.Error, "the hook's message, as data")
	assert.Equal(t, call{"bob", "purge", "parked"}, <-calls)
	res, _ = as("bob", "peek", q("queue", "parked"))
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, call{"bob", "peek", "parked"}, <-calls)
	res, ar = as("boom", "purge", q("queue", "parked"))
	assert.Equal(t, http.StatusInternalServerError, res.StatusCode)
	assert.NotContains(t, ar.Error, "exploded", "the panic value is not echoed")
	<-calls
	assert.Equal(t, 4, mq.Stats().Queues["parked"].Depth, "nothing refused was done")

	res, ar = as("root", "purge", q("queue", "parked"))
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, 4, ar.Count)
	<-calls

	// The hook runs after the handler's own checks: a forged request never
	// reaches it.
	r := newRequest(http.MethodPost, "/api/purge?queue=parked")
	r.Header.Set("X-User", "root")
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	r.Header.Set("X-TinyMQ-Token", token)
	res, _ = serveAction(t, h, r)
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	select {
	case c := <-calls:
		t.Errorf("the hook ran for a forged request: %v", c)
	default:
	}
}

func TestHostileNamesInActionsAreEscaped(t *testing.T) {
	const evil = `<script>alert(1)</script>"&'`
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue(evil, evil, tinymq.Fanout))
	require.NoError(t, mq.Publish(evil, evil, tinymq.WithHeaders(map[string]any{evil: evil})))
	t.Cleanup(mq.Stop)
	h := admin.Handler(mq, admin.WithActions(), admin.WithPayloads(),
		admin.WithAuthorize(func(_ *http.Request, action, queue string) error {
			if action == "pause" {
				return errors.New("refused: " + queue)
			}
			return nil
		}))
	token := tokenOf(t, h)
	for _, a := range []string{"peek", "pause", "purge", "purge"} {
		r := newRequest(http.MethodPost, "/api/"+a+"?queue="+url.QueryEscape(evil))
		r.Header.Set("X-TinyMQ-Token", token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		raw := rec.Body.String()
		assert.NotContains(t, raw, "<script>", a)
		assert.NotContains(t, raw, "<", a)
		var ar ActionResult
		require.NoError(t, json.Unmarshal([]byte(raw), &ar), raw)
		if a == "pause" {
			assert.Equal(t, "refused: "+evil, ar.Error, "the hook's message decodes to itself")
			continue
		}
		assert.Equal(t, evil, ar.Queue, a)
	}
	// An unknown hostile name comes back in the error, escaped.
	r := newRequest(http.MethodPost, "/api/purge?queue="+url.QueryEscape(evil+"x"))
	r.Header.Set("X-TinyMQ-Token", token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	assert.Equal(t, http.StatusNotFound, rec.Code)
	assert.NotContains(t, rec.Body.String(), "<")
	page := body(t, get(t, h, http.MethodGet, "/"))
	assert.NotContains(t, page, "alert", "the page holds no data")
}

// TestActionsRacingPublishersAndStopLoseNothing runs every action through
// the handler while publishers publish, consumers fail and dead-letter,
// and Stop comes in the middle: at the end every message accepted has
// ended in exactly one counter.
func TestActionsRacingPublishersAndStopLoseNothing(t *testing.T) {
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue("jobs", tinymq.Direct, func(_ context.Context, m *tinymq.Msg) error {
		if m.ID%5 == 0 {
			return errors.New("declined")
		}
		return nil
	}, 2, tinymq.WithQueueName("work"), tinymq.WithBindingKey("job"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, mq.DeclareQueue("parking", "dlx", tinymq.Fanout))
	require.NoError(t, mq.Start(context.Background()))
	h := admin.Handler(mq, admin.WithActions())
	token := tokenOf(t, h)

	var statuses sync.Map // "action status" -> *atomic.Int64
	do := func(action string, params url.Values) int {
		r := newRequest(http.MethodPost, "/api/"+action+"?"+params.Encode())
		r.Header.Set("X-TinyMQ-Token", token)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var ar ActionResult
		if err := json.Unmarshal(rec.Body.Bytes(), &ar); err != nil {
			t.Errorf("%s: %v: %s", action, err, rec.Body)
		}
		switch rec.Code {
		case http.StatusOK, http.StatusNotFound, http.StatusConflict, http.StatusServiceUnavailable:
		default:
			t.Errorf("%s %v: %d %s", action, params, rec.Code, ar.Error)
		}
		n, _ := statuses.LoadOrStore(fmt.Sprintf("%s %d", action, rec.Code), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return rec.Code
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				err := mq.Publish("jobs", i, tinymq.WithRoutingKey("job"))
				if errors.Is(err, tinymq.ErrStopped) {
					return
				}
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	loop := func(fn func(i int)) {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fn(i)
			}
		})
	}
	loop(func(i int) {
		if i%2 == 0 {
			do("pause", q("queue", "work"))
		} else {
			do("resume", q("queue", "work"))
		}
	})
	loop(func(int) { do("replay", q("queue", "parking", "n", "7")) })
	loop(func(int) { do("peek", q("queue", "parking", "n", "3")) })
	loop(func(i int) {
		if i%3 == 0 {
			do("purge", q("queue", "work"))
		} else {
			do("purge", q("queue", "parking"))
		}
	})
	loop(func(i int) {
		// A queue that lives briefly next to work, deleted with what it
		// holds.
		name := fmt.Sprintf("temp-%d", i)
		if err := mq.DeclareQueue(name, "jobs", tinymq.Direct, tinymq.WithBindingKey("job")); err != nil {
			if !errors.Is(err, tinymq.ErrStopped) {
				t.Errorf("declare: %v", err)
			}
			return
		}
		do("delete", q("queue", name))
	})

	// Let every action happen a few times, then stop in the middle of
	// them.
	count := func(key string) int64 {
		if n, ok := statuses.Load(key); ok {
			return n.(*atomic.Int64).Load()
		}
		return 0
	}
	waitFor(t, "every action done while running", func() bool {
		st := mq.Stats()
		return st.Queues["work"].Accepted >= 2000 && st.Queues["parking"].Replayed >= 20 &&
			st.Queues["work"].Purged+st.Queues["parking"].Purged > 0 && st.DeletedQueues >= 20 &&
			st.Deleted.Accepted > 0 && count("peek 200") > 0 && count("pause 200") > 0
	})
	stopped := make(chan struct{})
	go func() {
		mq.Stop()
		close(stopped)
	}()
	waitFor(t, "actions refused after Stop", func() bool { return count("purge 503") > 0 && count("replay 503") > 0 })
	close(stop)
	wg.Wait()
	<-stopped

	st := mq.Stats()
	var accepted, ended uint64
	check := func(name string, qs tinymq.QueueStats) {
		end := qs.Succeeded + qs.DeadLettered + qs.Dropped + qs.Undelivered + qs.Purged + qs.Replayed + qs.Removed
		assert.Equal(t, qs.Accepted, end, "queue %s: accepted, and ended (%+v)", name, qs)
		assert.Zero(t, qs.Depth, name)
		assert.Zero(t, qs.InFlight, name)
		accepted += qs.Accepted
		ended += end
	}
	for name, qs := range st.Queues {
		check(name, qs)
	}
	check("(deleted)", st.Deleted)
	assert.Equal(t, accepted, ended, "nothing lost")
	assert.Positive(t, st.Queues["parking"].Replayed)
	assert.Positive(t, st.Deleted.Accepted, "the deleted queues had messages")
	statuses.Range(func(k, v any) bool {
		t.Logf("%s: %d", k, v.(*atomic.Int64).Load())
		return true
	})
	t.Logf("accepted %d: %+v; deleted %d queues: %+v", accepted, st.Queues["work"], st.DeletedQueues, st.Deleted)
}
