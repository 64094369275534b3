package wal

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logged is an Options.Log that keeps what it is told.
type logged struct {
	mu    sync.Mutex
	lines []loggedLine
}

type loggedLine struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

func (lg *logged) log(level slog.Level, msg string, attrs ...slog.Attr) {
	m := map[string]slog.Value{}
	for _, a := range attrs {
		m[a.Key] = a.Value
	}
	lg.mu.Lock()
	defer lg.mu.Unlock()
	lg.lines = append(lg.lines, loggedLine{level, msg, m})
}

func (lg *logged) all() []loggedLine {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return append([]loggedLine(nil), lg.lines...)
}

// TestLogReportsCutsAndFailure: Options.Log is told, with stable keys, what
// Open cut (Warn) and the error that failed the log (Error, from the writer).
func TestLogReportsCutsAndFailure(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	commit(t, l, "a=1")
	require.NoError(t, l.Close())
	f, err := os.OpenFile(filepath.Join(dir, segName(1)), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte("torn"))
	require.NoError(t, err)
	require.NoError(t, f.Close())

	var lg logged
	fs := &faultFS{noSync: true}
	l = openT(t, dir, Options{Log: lg.log}, fs)
	lines := lg.all()
	require.Len(t, lines, 1, "the cut")
	assert.Equal(t, slog.LevelWarn, lines[0].level)
	assert.Equal(t, "wal: cut log", lines[0].msg)
	assert.Equal(t, filepath.Join(dir, segName(1)), lines[0].attrs["file"].String())
	assert.True(t, lines[0].attrs["torn"].Bool())
	assert.Equal(t, int64(4), lines[0].attrs["bytes"].Int64())

	fs.failSyncs(errIO, 0)
	var b Batch
	b.Put([]byte("b"), nil)
	require.ErrorIs(t, l.Commit(&b), ErrFailed)
	lines = lg.all()
	require.Len(t, lines, 2, "the failure")
	assert.Equal(t, slog.LevelError, lines[1].level)
	assert.Contains(t, lines[1].attrs["err"].String(), errIO.Error())
	assert.Equal(t, dir, lines[1].attrs["dir"].String())
}

func TestInvalidOptions(t *testing.T) {
	for _, o := range []Options{{SegmentSize: -1}, {Sync: SyncInterval(-time.Second)}} {
		_, err := Open(t.TempDir(), o)
		assert.ErrorIs(t, err, ErrInvalidOptions)
	}
}
