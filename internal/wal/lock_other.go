//go:build !(linux || darwin || freebsd || openbsd || netbsd || dragonfly || windows)

package wal

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
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

func lockFile(path string) (io.Closer, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	localLocksMu.Lock()
	defer localLocksMu.Unlock()
	if localLocks[abs] {
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	}
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
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
