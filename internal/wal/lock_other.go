//go:build !(linux || darwin || freebsd || openbsd || netbsd || dragonfly || windows)

package wal

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// On systems without flock the lock only excludes other Logs of this process.
var (
	localLocksMu sync.Mutex
	localLocks   = map[string]bool{}
)

type localLock struct{ path string }

func (l localLock) Close() error {
	localLocksMu.Lock()
	delete(localLocks, l.path)
	localLocksMu.Unlock()
	return nil
}

// lockFile creates path (0600, not following a symbolic link planted there)
// and marks it held in this process; a second lockFile of it fails with an
// error wrapping ErrLocked until the returned Closer is closed.
func lockFile(path string) (io.Closer, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	localLocksMu.Lock()
	defer localLocksMu.Unlock()
	if localLocks[abs] {
		return nil, lockedError(path, strconv.AppendInt(nil, int64(os.Getpid()), 10))
	}
	f, err := openNoFollow(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f); err != nil {
		f.Close()
		return nil, err
	}
	writePID(f)
	f.Close()
	localLocks[abs] = true
	return localLock{abs}, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
