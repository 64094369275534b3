//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package wal

import (
	"errors"
	"io"
	"os"
	"syscall"
)

// lockFile takes an exclusive, non-blocking flock(2) on path, creating it
// (0600) and refusing to follow a symbolic link planted there. The lock
// belongs to the open file description, so a second lockFile of the same
// path fails in this process as in any other; it is released when the
// returned file is closed, or when the process dies. Once the lock is held it
// writes the process id into the file; a refused lockFile reads it back and
// names the holder in its error, which wraps ErrLocked.
func lockFile(path string) (io.Closer, error) {
	f, err := openNoFollow(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f); err != nil {
		f.Close()
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if ferr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB); ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		f.Close()
		return nil, err
	}
	if ferr != nil {
		if errors.Is(ferr, syscall.EWOULDBLOCK) {
			buf := make([]byte, maxPIDLine)
			n, _ := f.ReadAt(buf, 0)
			f.Close()
			return nil, lockedError(path, buf[:n])
		}
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: path, Err: ferr}
	}
	writePID(f)
	return f, nil
}

// syncDir fsyncs a directory, making the creation, removal and renaming of
// its entries durable.
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
