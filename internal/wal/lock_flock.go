//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// lockFile takes an exclusive, non-blocking flock(2) on path, creating it. The
// lock belongs to the open file description, so a second lockFile of the same
// path fails in this process as in any other; it is released when the
// returned file is closed, or when the process dies.
func lockFile(path string) (io.Closer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
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
		f.Close()
		if errors.Is(ferr, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, &os.PathError{Op: "flock", Path: path, Err: ferr}
	}
	// The pid is for people looking at the directory; the lock is the flock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
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
