//go:build windows

package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

const errorSharingViolation = syscall.Errno(32) // ERROR_SHARING_VIOLATION

// lockFile opens path with no sharing allowed, which Windows enforces against
// every other open of the file, in this process or another.
func lockFile(path string) (io.Closer, error) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE, 0, nil,
		syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		if errors.Is(err, errorSharingViolation) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(h), path), nil
}

// syncDir does nothing: Windows cannot flush a directory handle, and NTFS
// journals directory entries itself.
func syncDir(string) error { return nil }
