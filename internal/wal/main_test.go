package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// lockChildEnv makes the test binary, re-executed by TestLockOtherProcess, try
// to Open the directory it names and report the outcome on stdout: "opened",
// "locked: " and the error, or "error: " and the error.
const lockChildEnv = "WAL_TEST_LOCK_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		l, err := Open(dir, Options{})
		switch {
		case errors.Is(err, ErrLocked):
			fmt.Println("locked:", err)
		case err != nil:
			fmt.Println("error:", err)
		default:
			l.Close()
			fmt.Println("opened")
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// faultFS wraps the real file system to count segment syncs, to skip them
// (noSync, for fast tests on a shared disk), to hold them (syncHook), and to
// inject ENOSPC on write and EIO on fdatasync.
type faultFS struct {
	osFS
	noSync bool
	syncs  atomic.Int64

	mu         sync.Mutex
	syncHook   func() // called before each segment Datasync, outside mu
	writeErr   error  // once set, writes put half their bytes on disk and fail
	writesLeft int    // writes that still succeed before writeErr fires
	syncErr    error  // once set, Datasync fails
	syncsLeft  int    // syncs that still succeed before syncErr fires
}

func (fs *faultFS) OpenFile(name string, flag int) (file, error) {
	f, err := fs.osFS.OpenFile(name, flag)
	if err != nil {
		return nil, err
	}
	return &faultFile{file: f, fs: fs}, nil
}

// failWrites makes every write after the next n fail with err.
func (fs *faultFS) failWrites(err error, n int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.writeErr, fs.writesLeft = err, n
}

// failSyncs makes every sync after the next n fail with err.
func (fs *faultFS) failSyncs(err error, n int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncErr, fs.syncsLeft = err, n
}

func (fs *faultFS) setSyncHook(h func()) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.syncHook = h
}

func (fs *faultFS) fault(err *error, left *int) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if *err == nil {
		return nil
	}
	if *left > 0 {
		*left--
		return nil
	}
	return *err
}

type faultFile struct {
	file
	fs *faultFS
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if werr := f.fs.fault(&f.fs.writeErr, &f.fs.writesLeft); werr != nil {
		n, err := f.file.WriteAt(p[:len(p)/2], off)
		if err != nil {
			return n, err
		}
		return n, &os.PathError{Op: "write", Path: "segment", Err: werr}
	}
	return f.file.WriteAt(p, off)
}

func (f *faultFile) Datasync() error {
	f.fs.mu.Lock()
	hook := f.fs.syncHook
	f.fs.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.fs.syncs.Add(1)
	if serr := f.fs.fault(&f.fs.syncErr, &f.fs.syncsLeft); serr != nil {
		return &os.PathError{Op: "fdatasync", Path: "segment", Err: serr}
	}
	if f.fs.noSync {
		return nil
	}
	return f.file.Datasync()
}

var (
	errNoSpace = syscall.ENOSPC
	errIO      = syscall.EIO
)

const settleWait = 10 * time.Second

// closedWithin fails the test unless ch is closed within the bound.
func closedWithin(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(settleWait):
		t.Fatalf("%s did not happen in time", what)
	}
}

func putBatch(kv ...string) *Batch {
	var b Batch
	for i := 0; i+1 < len(kv); i += 2 {
		b.Put([]byte(kv[i]), []byte(kv[i+1]))
	}
	return &b
}

// syncedSizes records, per file, the size that the last successful fdatasync
// made durable.
type syncedSizes struct {
	mu   sync.Mutex
	size map[string]int64
}

func (s *syncedSizes) faults() *Faults {
	s.size = map[string]int64{}
	return &Faults{Synced: func(name string, size int64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.size[filepath.Base(name)] = size
	}}
}

// powerLoss copies dir to a new directory as a power loss would leave it:
// each segment cut to what its last fdatasync covered (a segment never synced
// after its header keeps its header only).
func (s *syncedSizes) powerLoss(t *testing.T, dir string) string {
	t.Helper()
	s.mu.Lock()
	sizes := make(map[string]int64, len(s.size))
	for k, v := range s.size {
		sizes[k] = v
	}
	s.mu.Unlock()
	out := t.TempDir()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if _, ok := parseSegName(e.Name()); !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		n, ok := sizes[e.Name()]
		if !ok {
			n = headerLen
		}
		data = data[:min(int64(len(data)), n)]
		require.NoError(t, os.WriteFile(filepath.Join(out, e.Name()), data, 0o644))
	}
	return out
}
