package wal

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data, and the metadata needed to read it back (its
// size), to stable storage.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			// EINTR means the call did not run to its end, not that a write
			// back failed, so calling it again is not the retry fsyncgate
			// warns of (os.File.Sync does the same).
			if serr = syscall.Fdatasync(int(fd)); serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
