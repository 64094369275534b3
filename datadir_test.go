package tinymq_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// writeDataDir writes a data directory with a real MQ: on exchange "shop",
// durable queue "orders" with three waiting messages (headers, routing keys),
// "audit", whose consumer acknowledged all of them, "retry", whose consumer
// failed the first and waits an hour to retry it, and "gone", deleted with
// a message in it. The MQ is shut down before it returns.
func writeDataDir(t *testing.T, dir string) {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.DeclareQueue("orders", "shop", tinymq.Topic, tinymq.WithDurable(), tinymq.WithBindingKey("#")))
	require.NoError(t, m.DeclareQueue("gone", "shop", tinymq.Topic, tinymq.WithDurable(), tinymq.WithBindingKey("#")))
	require.NoError(t, m.RegisterQueue("shop", tinymq.Topic, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("audit"), tinymq.WithDurable(), tinymq.WithBindingKey("#")))
	failed := make(chan struct{}, 3)
	require.NoError(t, m.RegisterQueue("shop", tinymq.Topic, func(context.Context, *tinymq.Msg) error {
		failed <- struct{}{}
		return errors.New("not now")
	}, 1, tinymq.WithQueueName("retry"), tinymq.WithDurable(), tinymq.WithBindingKey("eu.#"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("shop", map[string]any{"id": 1}, tinymq.WithRoutingKey("eu.fr"), tinymq.WithHeaders(map[string]any{"n": int32(1)})))
	require.NoError(t, m.Publish("shop", "two", tinymq.WithRoutingKey("us.ny")))
	require.NoError(t, m.Publish("shop", []byte{0xff, 0x00}, tinymq.WithRoutingKey("us.ca")))
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry queue's consumer never ran")
	}
	require.Eventually(t, func() bool {
		st := m.Stats().Queues
		return st["audit"].Succeeded == 3 && st["retry"].Scheduled == 1
	}, 10*time.Second, time.Millisecond)
	n, err := m.DeleteQueue("gone")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.Shutdown(ctx)
	m.Stop()
}

// A DataDir lists each durable queue the log knows with the messages still
// pending for it, its deleted queues, and reads a queue's messages in order.
func TestDataDirShowsWhatTheLogHolds(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	before := snapshotDir(t, dir)

	d, err := tinymq.OpenDataDir(dir)
	require.NoError(t, err)
	defer d.Close()
	_, inUse := d.InUse()
	assert.False(t, inUse)

	byName := make(map[string]tinymq.DataDirQueue)
	for _, q := range d.Queues() {
		byName[q.Name] = q
	}
	assert.Equal(t, 3, byName["orders"].Depth)
	assert.True(t, byName["orders"].Declared)
	assert.WithinDuration(t, time.Now(), byName["orders"].Oldest, time.Minute)
	assert.Equal(t, 1, byName["retry"].Depth, "the retried message is pending")
	assert.Zero(t, byName["audit"].Depth, "acknowledged messages are not pending")
	if g, ok := byName["gone"]; assert.True(t, ok, "the deleted queue is known by its tombstone") {
		assert.True(t, g.Deleted)
		assert.Zero(t, g.Depth)
	}

	var msgs []*tinymq.Msg
	require.NoError(t, d.Messages("orders", func(m *tinymq.Msg) bool { msgs = append(msgs, m); return true }))
	require.Len(t, msgs, 3)
	for i, m := range msgs {
		assert.Equal(t, uint64(i+1), m.ID, "in publish order")
		assert.Equal(t, "shop", m.Exchange)
		assert.Equal(t, "orders", m.Queue)
		assert.IsType(t, tinymq.Encoded{}, m.Data)
	}
	assert.Equal(t, "eu.fr", msgs[0].RoutingKey)
	assert.Equal(t, int32(1), msgs[0].Headers["n"], "headers keep their Go types")
	var got map[string]int
	require.NoError(t, msgs[0].Data.(tinymq.Encoded).Decode(&got))
	assert.Equal(t, map[string]int{"id": 1}, got)

	var retried []*tinymq.Msg
	require.NoError(t, d.Messages("retry", func(m *tinymq.Msg) bool { retried = append(retried, m); return true }))
	require.Len(t, retried, 1)
	assert.Equal(t, 1, retried[0].Attempt, "the attempt the queue saved")

	n := 0
	require.NoError(t, d.Messages("orders", func(*tinymq.Msg) bool { n++; return false }))
	assert.Equal(t, 1, n, "fn returning false stops")
	require.ErrorIs(t, d.Messages("nope", func(*tinymq.Msg) bool { return true }), tinymq.ErrUnknownQueue)

	segs := d.Segments()
	require.NotEmpty(t, segs)
	assert.Positive(t, segs[0].Size)
	c := d.Check()
	assert.Positive(t, c.Records)
	assert.Empty(t, c.Damage)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "Close is idempotent")
	assert.Equal(t, before, snapshotDir(t, dir), "the directory is unchanged")
}

// OpenDataDir reads a directory that a running MQ holds, and says so.
func TestDataDirReadsADirectoryInUseAndSaysSo(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.DeclareQueue("orders", "shop", tinymq.Topic, tinymq.WithDurable(), tinymq.WithBindingKey("#")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()

	d, err := tinymq.OpenDataDir(dir)
	require.NoError(t, err)
	pid, inUse := d.InUse()
	assert.True(t, inUse)
	assert.Equal(t, os.Getpid(), pid)
	found := false
	for _, q := range d.Queues() {
		if q.Name == "orders" {
			found = true
			assert.Equal(t, 3, q.Depth)
		}
	}
	assert.True(t, found)
	require.NoError(t, d.Close())
	require.NoError(t, m.Publish("shop", "after", tinymq.WithRoutingKey("x")), "the holder is undisturbed")
}

// A damaged log is shown up to the damage, and the damage is reported; the
// directory is not repaired.
func TestDataDirReportsDamageWithoutRepairing(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	b, err := os.ReadFile(segs[0])
	require.NoError(t, err)
	b[40] ^= 0xff // inside the first record
	require.NoError(t, os.WriteFile(segs[0], b, 0o600))
	before := snapshotDir(t, dir)

	d, err := tinymq.OpenDataDir(dir)
	require.NoError(t, err)
	assert.NotEmpty(t, d.Check().Damage)
	require.NoError(t, d.Close())
	assert.Equal(t, before, snapshotDir(t, dir))
}

func TestDataDirOfAMissingDirectoryFails(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "none")
	_, err := tinymq.OpenDataDir(dir)
	require.ErrorIs(t, err, tinymq.ErrLog)
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "OpenDataDir creates nothing")
}

// snapshotDir is each file of dir with its content.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		info, err := e.Info()
		require.NoError(t, err)
		out[e.Name()] = string(b) + "|" + info.ModTime().String()
	}
	return out
}
