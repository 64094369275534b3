//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package wal

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// lockHolder probes the flock of the LOCK file at path with a shared,
// non-blocking flock on a read-only descriptor of its own, released when the
// descriptor is closed (see LockHolder).
func lockHolder(path string) (pid int, held bool, err error) {
	f, err := openNoFollow(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	if err := checkRegular(f); err != nil {
		return 0, false, err
	}
	buf := make([]byte, maxPIDLine)
	n, _ := f.ReadAt(buf, 0)
	pid = pidOf(buf[:n])
	rc, err := f.SyscallConn()
	if err != nil {
		return pid, false, err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if ferr = syscall.Flock(int(fd), syscall.LOCK_SH|syscall.LOCK_NB); ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return pid, false, err
	}
	if errors.Is(ferr, syscall.EWOULDBLOCK) {
		return pid, true, nil
	}
	if ferr != nil {
		return pid, false, &os.PathError{Op: "flock", Path: path, Err: ferr}
	}
	return pid, false, nil // the deferred Close releases the shared lock
}
