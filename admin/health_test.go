package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

// Health is the JSON of /healthz.
type Health struct {
	Status   string `json:"status"`
	Stopping bool   `json:"stopping"`
	Started  bool   `json:"started"`
	Log      string `json:"log"`
	Queues   int    `json:"queues"`
}

func health(t *testing.T, h http.Handler) (int, Health) {
	t.Helper()
	res := get(t, h, http.MethodGet, "/healthz")
	raw := body(t, res)
	assert.Equal(t, "application/json; charset=utf-8", res.Header.Get("Content-Type"))
	assert.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	var v Health
	require.NoError(t, json.Unmarshal([]byte(raw), &v), raw)
	return res.StatusCode, v
}

func TestHealthzIsReadyOnlyWhileRunning(t *testing.T) {
	mq := tinymq.New(tinymq.WithDataDir(t.TempDir()))
	require.NoError(t, mq.RegisterQueue("in", tinymq.Fanout, nop, 1, tinymq.WithQueueName("mem")))
	h := admin.Handler(mq)

	code, v := health(t, h)
	assert.Equal(t, http.StatusServiceUnavailable, code, "not started yet")
	assert.Equal(t, Health{Status: tinymq.ErrNotStarted.Error(), Log: "none", Queues: 1}, v)

	require.NoError(t, mq.RegisterQueue("in", tinymq.Fanout, nop, 1, tinymq.WithQueueName("disk"), tinymq.WithDurable()))
	require.NoError(t, mq.Start(context.Background()))
	code, v = health(t, h)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, Health{Status: "ok", Started: true, Log: "ok", Queues: 2}, v, "a durable queue: its log is healthy")

	res := get(t, h, http.MethodHead, "/healthz")
	assert.Equal(t, http.StatusOK, res.StatusCode)
	res = get(t, h, http.MethodPost, "/healthz")
	assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)

	mq.Stop()
	code, v = health(t, h)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, tinymq.ErrStopped.Error(), v.Status)
	assert.True(t, v.Stopping)
	assert.Empty(t, mq.Stats().Queues["mem"].Undelivered, "asking changed nothing")
}

func TestHealthzOfAHostileEngine(t *testing.T) {
	mq := tinymq.New(tinymq.WithEngine(&panicky{armed: true}))
	require.NoError(t, mq.RegisterQueue("ev", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q")))
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, mq.Shutdown(context.Background())) })
	code, v := health(t, admin.Handler(mq))
	assert.Equal(t, http.StatusOK, code, "health does not need the engine's Stats")
	assert.Equal(t, "ok", v.Status)
}
