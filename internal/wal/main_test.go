package wal

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

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
