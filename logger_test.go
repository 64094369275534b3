package tinymq_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// Without WithLogger, a lost message is not silent: warnings and errors go
// to slog.Default (as it is when the line is logged, not when the MQ was
// made), and the lines below a warning do not.
func TestDefaultLoggerShowsLossesOnSlogDefault(t *testing.T) {
	m := tinymq.New()
	logger, lines := logRecords()
	old := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(old) })

	failed := make(chan struct{}, 10)
	require.NoError(t, m.DeclareQueue("dlq", "dlx", tinymq.Fanout))
	require.NoError(t, m.RegisterQueue("jobs", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		failed <- struct{}{}
		return tinymq.Permanent(errors.New("bug"))
	}, 1, tinymq.WithQueueName("work"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.RegisterQueue("orphans", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return tinymq.Permanent(errors.New("bug"))
	}, 1, tinymq.WithQueueName("lost"))) // no dead-letter exchange: a failure drops the message
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("orphans", "dropped"))
	require.NoError(t, m.Publish("jobs", "parked"))
	require.Eventually(t, func() bool { return m.Stats().Queues["dlq"].Depth == 1 && m.Stats().Queues["lost"].Dropped == 1 },
		wait, time.Millisecond)
	n, err := m.ReplayDeadLetters("dlq", 1) // logged at info
	require.NoError(t, err)
	require.Equal(t, 1, n)
	<-failed
	<-failed
	stopWithin(t, m)

	msgs := map[string]string{}
	for _, l := range lines(t) {
		msgs[l["msg"].(string)] = l["level"].(string)
	}
	assert.Equal(t, "ERROR", msgs["tinymq: message dropped"], "a dropped message is logged by default")
	assert.Equal(t, "WARN", msgs["tinymq: message dead-lettered"])
	assert.NotContains(t, msgs, "tinymq: dead letters replayed", "info lines are not")
}

// WithLogger of a logger that discards silences the MQ, and a nil logger is
// the default.
func TestWithLoggerDiscardSilencesAndNilIsTheDefault(t *testing.T) {
	logger, lines := logRecords()
	old := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(old) })
	for _, tc := range []struct {
		name   string
		logger *slog.Logger
		want   bool
	}{{"discard", slog.New(slog.DiscardHandler), false}, {"nil", nil, true}} {
		m := tinymq.New(tinymq.WithLogger(tc.logger))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return tinymq.Permanent(errors.New(tc.name))
		}, 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		stopWithin(t, m)
		found := false
		for _, l := range lines(t) {
			found = found || l["err"] == tc.name
		}
		assert.Equal(t, tc.want, found, "%s logger", tc.name)
	}
}
