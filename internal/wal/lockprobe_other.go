//go:build !(linux || darwin || freebsd || openbsd || netbsd || dragonfly)

package wal

import (
	"errors"
	"fmt"
)

// lockHolder cannot tell, without flock, whether another process holds the
// directory.
func lockHolder(path string) (pid int, held bool, err error) {
	return 0, false, fmt.Errorf("wal: probing the lock %s: %w", path, errors.ErrUnsupported)
}
