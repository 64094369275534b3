package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/webhook"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type UserCreated struct {
	ID    int
	Email string
}

// logRecords returns a logger and a function that decodes what it logged.
func logRecords() (*slog.Logger, func(t *testing.T) []map[string]any) {
	var mu sync.Mutex
	var buf bytes.Buffer
	h := slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, nil)
	return slog.New(h), func(t *testing.T) []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		var out []map[string]any
		dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
		for dec.More() {
			var rec map[string]any
			require.NoError(t, dec.Decode(&rec))
			out = append(out, rec)
		}
		return out
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// endpoint is a test endpoint whose answer the test sets per request.
type endpoint struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	answer   func(n int, w http.ResponseWriter, r *http.Request)
}

func (h *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.requests = append(h.requests, r)
	h.bodies = append(h.bodies, string(body))
	n := len(h.requests)
	h.mu.Unlock()
	h.answer(n, w, r)
}

func TestNew(t *testing.T) {
	hook := &endpoint{answer: func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			http.Error(w, "try later", http.StatusServiceUnavailable)
		case 2:
			<-r.Context().Done() // hangs until the consumer's timeout
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	}}
	srv := httptest.NewServer(hook)
	defer srv.Close()

	consume, err := webhook.New(srv.URL+"/hook", webhook.WithTimeout(200*time.Millisecond),
		webhook.WithHeader("Authorization", "Bearer s3cret"))
	require.NoError(t, err)
	log, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	require.NoError(t, m.RegisterQueue("users", tinymq.Topic, consume, 1, tinymq.WithQueueName("webhook"),
		tinymq.WithBindingKey("user.*"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("users", UserCreated{ID: 7, Email: "a@b.c"}, tinymq.WithRoutingKey("user.created")))
	m.Stop()

	st := m.Stats().Queues["webhook"]
	assert.Equal(t, uint64(1), st.Succeeded, "503, then a timeout, then 202")
	assert.Equal(t, uint64(2), st.Retried)
	require.Len(t, hook.requests, 3)
	r := hook.requests[2]
	assert.Equal(t, http.MethodPost, r.Method)
	assert.Equal(t, "/hook", r.URL.Path)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	assert.Equal(t, "Bearer s3cret", r.Header.Get("Authorization"))
	assert.Equal(t, "1", r.Header.Get("X-TinyMQ-Message-Id"))
	assert.Equal(t, "users", r.Header.Get("X-TinyMQ-Exchange"))
	assert.Equal(t, "webhook", r.Header.Get("X-TinyMQ-Queue"))
	assert.Equal(t, "user.created", r.Header.Get("X-TinyMQ-Routing-Key"))
	assert.Equal(t, "3", r.Header.Get("X-TinyMQ-Attempt"))
	var body UserCreated
	require.NoError(t, json.Unmarshal([]byte(hook.bodies[2]), &body))
	assert.Equal(t, UserCreated{ID: 7, Email: "a@b.c"}, body)

	recs := records(t)
	require.Len(t, recs, 2)
	assert.Contains(t, recs[0]["err"], "status 503: try later")
	assert.Equal(t, "warn", strings.ToLower(recs[0]["level"].(string)))
	assert.Contains(t, recs[1]["err"], "deadline exceeded")
}

func TestRawJSONAndBadPayloads(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL)
	require.NoError(t, err)
	require.NoError(t, consume(context.Background(), &tinymq.Msg{Data: json.RawMessage(`{"a":1}`)}))
	err = consume(context.Background(), &tinymq.Msg{Data: make(chan int)})
	assert.ErrorIs(t, err, tinymq.ErrPermanent, "a payload that cannot be encoded will never succeed")
	assert.Equal(t, []string{`{"a":1}`}, got)

	for _, bad := range []string{"", "ftp://x/y", "/relative", "http://", "::"} {
		_, err := webhook.New(bad)
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "endpoint %q", bad)
	}
	_, err = webhook.New(srv.URL, webhook.WithTimeout(0))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	_, err = webhook.New(srv.URL, webhook.WithClient(nil))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	assert.False(t, errors.Is(err, tinymq.ErrPermanent))
}

func TestStatusErrorAndHeaders(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such user", http.StatusNotFound)
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL)
	require.NoError(t, err)
	err = consume(context.Background(), &tinymq.Msg{Data: 1})
	var se *webhook.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, http.StatusNotFound, se.Code)
	assert.Equal(t, "no such user", se.Body)
	assert.False(t, errors.Is(err, tinymq.ErrPermanent), "the caller decides what is permanent")

	for _, h := range []struct{ name, value string }{
		{"", "x"}, {"Bad Name", "x"}, {"X-Evil\r\n", "x"}, {"X-Ok", "a\r\nX-Injected: 1"}, {"X-Ok", "nul\x00"},
	} {
		t.Run(h.name+"="+h.value, func(t *testing.T) {
			_, err := webhook.New(srv.URL, webhook.WithHeader(h.name, h.value))
			assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
		})
	}
	_, err = webhook.New(srv.URL, webhook.WithHeader("X-Ok", "tab\tis fine"))
	assert.NoError(t, err)
	_, err = webhook.New(srv.URL, nil)
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
}

func TestEncodedPayloadIsSentAsItsBytes(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Header.Get("Content-Type") + " " + string(b)
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL)
	require.NoError(t, err)
	require.NoError(t, consume(context.Background(), &tinymq.Msg{Data: tinymq.Encoded{Body: []byte(`{"ID":1}`)}}))
	assert.Equal(t, `application/json {"ID":1}`, <-got)
}
