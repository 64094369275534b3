package tinymq_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

func TestHandlerIsTyped(t *testing.T) {
	got := make(chan UserCreated, 1)
	m := tinymq.New()
	dead := deadLetters(t, m)
	require.NoError(t, m.RegisterQueue("users", tinymq.Fanout, tinymq.Handler(func(_ context.Context, u UserCreated) error {
		got <- u
		return nil
	}), 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond}), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("users", UserCreated{ID: 7, Email: "a@b.c"}))
	require.NoError(t, m.Publish("users", "not a user"))
	m.Stop()
	require.Len(t, got, 1)
	require.Len(t, dead, 1)
	assert.Equal(t, UserCreated{ID: 7, Email: "a@b.c"}, <-got)
	d := <-dead
	assert.Equal(t, "not a user", d.Data)
	assert.Equal(t, 1, d.Deaths[0].Attempts, "a payload of the wrong type is not retried")
	assert.Contains(t, d.Deaths[0].LastError, "got string, want tinymq_test.UserCreated")

	var nilFn func(context.Context, int) error
	assert.ErrorIs(t, tinymq.New().RegisterQueue("x", tinymq.Fanout, tinymq.Handler(nilFn), 1), tinymq.ErrNilConsumer)

	err := tinymq.Handler(func(context.Context, int) error { return nil })(context.Background(), &tinymq.Msg{Data: "x"})
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)
}

// webhook is a test endpoint whose answer the test sets per request.
type webhook struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	answer   func(n int, w http.ResponseWriter, r *http.Request)
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.requests = append(h.requests, r)
	h.bodies = append(h.bodies, string(body))
	n := len(h.requests)
	h.mu.Unlock()
	h.answer(n, w, r)
}

func TestHTTPConsumer(t *testing.T) {
	hook := &webhook{answer: func(n int, w http.ResponseWriter, r *http.Request) {
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

	consume, err := tinymq.HTTPConsumer(srv.URL+"/hook", tinymq.WithHTTPTimeout(200*time.Millisecond),
		tinymq.WithHTTPHeader("Authorization", "Bearer s3cret"))
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
	assert.Contains(t, recs[1]["err"], "deadline exceeded")
}

func TestHTTPConsumerRawJSONAndBadPayloads(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	}))
	defer srv.Close()
	consume, err := tinymq.HTTPConsumer(srv.URL)
	require.NoError(t, err)
	require.NoError(t, consume(context.Background(), &tinymq.Msg{Data: json.RawMessage(`{"a":1}`)}))
	err = consume(context.Background(), &tinymq.Msg{Data: make(chan int)})
	assert.ErrorIs(t, err, tinymq.ErrPermanent, "a payload that cannot be encoded will never succeed")
	assert.Equal(t, []string{`{"a":1}`}, got)

	for _, bad := range []string{"", "ftp://x/y", "/relative", "http://", "::"} {
		_, err := tinymq.HTTPConsumer(bad)
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "endpoint %q", bad)
	}
	_, err = tinymq.HTTPConsumer(srv.URL, tinymq.WithHTTPTimeout(0))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	_, err = tinymq.HTTPConsumer(srv.URL, tinymq.WithHTTPClient(nil))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	assert.False(t, errors.Is(err, tinymq.ErrPermanent))
}
