//go:build windows

package wal

import (
	"errors"
	"io"
	"os"
	"syscall"
)

const errorSharingViolation = syscall.Errno(32) // ERROR_SHARING_VIOLATION

// lockFile opens path for writing while letting others only read it, which
// Windows enforces against every other open of the file, in this process or
// another: a second lockFile, which asks for write access, is refused. Once
// the lock is held it writes the process id into the file; a refused
// lockFile reads it back (reading is shared) and names the holder in its
// error, which wraps ErrLocked. Windows has no O_NOFOLLOW: a symbolic link at
// path is refused after an Lstat, so one planted between the check and the
// open is followed.
func lockFile(path string) (io.Closer, error) {
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSymlink != 0 {
		return nil, &os.PathError{Op: "open", Path: path, Err: errSymlink}
	}
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE, syscall.FILE_SHARE_READ, nil,
		syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		if errors.Is(err, errorSharingViolation) {
			var content []byte
			if b, rerr := os.ReadFile(path); rerr == nil {
				content = b[:min(len(b), maxPIDLine)]
			}
			return nil, lockedError(path, content)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(h), path)
	if err := checkRegular(f); err != nil {
		f.Close()
		return nil, err
	}
	writePID(f)
	return f, nil
}

// syncDir does nothing: Windows cannot flush a directory handle, and NTFS
// journals directory entries itself.
func syncDir(string) error { return nil }
