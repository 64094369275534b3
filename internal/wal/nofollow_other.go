//go:build !(linux || darwin || freebsd || openbsd || netbsd || dragonfly)

package wal

import "os"

// openNoFollow opens name as os.OpenFile does, except that it fails if name
// is a symbolic link instead of opening the link's target. Without
// O_NOFOLLOW it checks with Lstat first: a link planted between the check and
// the open is still followed.
func openNoFollow(name string, flag int, perm os.FileMode) (*os.File, error) {
	if st, err := os.Lstat(name); err == nil && st.Mode()&os.ModeSymlink != 0 {
		return nil, &os.PathError{Op: "open", Path: name, Err: errSymlink}
	}
	return os.OpenFile(name, flag, perm)
}
