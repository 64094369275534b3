package amqp_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// records is a log handler that keeps every line's level, message and
// attributes.
type records struct {
	mu    *sync.Mutex
	lines *[]slog.Record
}

func newRecords() records { return records{mu: new(sync.Mutex), lines: new([]slog.Record)} }

func (r records) Enabled(context.Context, slog.Level) bool { return true }
func (r records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r records) WithGroup(string) slog.Handler            { return r }
func (r records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.lines = append(*r.lines, rec.Clone())
	return nil
}

// find returns the first line with message msg, and whether there is one.
func (r records) find(msg string) (slog.Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range *r.lines {
		if rec.Message == msg {
			return rec, true
		}
	}
	return slog.Record{}, false
}

func attr(rec slog.Record, key string) string {
	v := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestBrokerBlockIsReportedAndPublishesStayBounded: during a resource alarm
// the broker sends connection.blocked and stops reading publishes. The
// engine says so in Stats().Blocked and with a warning carrying the broker's
// reason; a Publish behind the block returns at its timeout, ErrUnconfirmed,
// saying that the broker blocks publishes; when the alarm clears, Blocked is
// empty again, an info line says so, and publishing works.
func TestBrokerBlockIsReportedAndPublishesStayBounded(t *testing.T) {
	n := uniq(t)
	b := broker(t)
	logs := newRecords()
	m := tinymq.New(amqp.Engine(b.URL(), amqp.WithPublishTimeout(2*time.Second),
		amqp.WithReconnectBackoff(20*time.Millisecond, 200*time.Millisecond)), tinymq.WithLogger(slog.New(logs)))
	defer m.Stop()
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	require.NoError(t, m.Publish(n("ex"), "before the alarm"))
	assert.Empty(t, m.Stats().Blocked)

	out, err := b.Ctl(context.Background(), "set_vm_memory_high_watermark", "0.0000001")
	require.NoError(t, err, out)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			out, err := b.Ctl(context.Background(), "set_vm_memory_high_watermark", "0.4")
			require.NoError(t, err, out)
		}
	}
	defer restore()

	start := time.Now()
	err = m.Publish(n("ex"), "behind the block")
	took := time.Since(start)
	require.Error(t, err, "a publish the broker does not read")
	assert.ErrorIs(t, err, amqp.ErrUnconfirmed)
	assert.Less(t, took, 10*time.Second, "the publish timeout bounds it")
	waitFor(t, "Stats says the broker blocks publishes", func() bool { return m.Stats().Blocked != "" })
	assert.ErrorContains(t, err, "the broker blocks this MQ's publishes")
	t.Logf("blocked: %q; publish: %v after %v", m.Stats().Blocked, err, took.Round(time.Millisecond))
	warn, ok := logs.find("tinymq/amqp: the broker blocked the publishing connection (a resource alarm); publishes wait until it unblocks, at most their timeout")
	require.True(t, ok, "a warning")
	assert.Equal(t, slog.LevelWarn, warn.Level)
	assert.Equal(t, m.Stats().Blocked, attr(warn, "reason"))

	restore()
	waitFor(t, "Stats says the block is over", func() bool { return m.Stats().Blocked == "" })
	info, ok := logs.find("tinymq/amqp: the broker unblocked the publishing connection")
	require.True(t, ok, "an info line")
	assert.Equal(t, slog.LevelInfo, info.Level)
	require.NoError(t, m.Publish(n("ex"), "after the alarm"))
}
