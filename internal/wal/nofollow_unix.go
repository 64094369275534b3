//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package wal

import (
	"os"
	"syscall"
)

// openNoFollow opens name as os.OpenFile does, except that it fails if name
// is a symbolic link instead of opening the link's target (O_NOFOLLOW).
func openNoFollow(name string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|syscall.O_NOFOLLOW, perm)
	if err != nil {
		return nil, symlinkError(name, err)
	}
	return f, nil
}
