package wal

import (
	"errors"
	"io"
	"os"
)

// fileSystem is the seam between the log and the operating system: the few
// file operations the log uses. osFS is the real one; tests wrap it to count
// syncs and to inject ENOSPC and EIO.
type fileSystem interface {
	MkdirAll(dir string) error
	ReadDir(dir string) ([]string, error)
	OpenFile(name string, flag int) (file, error)
	Remove(name string) error
	Rename(from, to string) error
	SyncDir(dir string) error
}

// file is an open file of a fileSystem.
type file interface {
	io.ReaderAt
	io.WriterAt
	Truncate(size int64) error
	Datasync() error // fdatasync on Linux, File.Sync elsewhere
	Size() (int64, error)
	Close() error
}

// osFS keeps the log private and refuses what a stranger may have planted in
// its directory: it creates directories 0700 and files 0600, and opens a file
// only if it is a regular file, never through a symbolic link (whose target,
// anywhere, would be truncated and overwritten).
type osFS struct{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o700) }

func (osFS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

func (osFS) OpenFile(name string, flag int) (file, error) {
	f, err := openNoFollow(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f); err != nil {
		f.Close()
		return nil, err
	}
	return osFile{f}, nil
}

var (
	errSymlink    = errors.New("is a symbolic link; the log does not follow links")
	errNotRegular = errors.New("not a regular file")
)

// symlinkError turns the error of an O_NOFOLLOW open of a symbolic link
// (ELOOP on Linux, EMLINK on FreeBSD, EFTYPE on NetBSD) into one that says so.
func symlinkError(name string, err error) error {
	if st, lerr := os.Lstat(name); lerr == nil && st.Mode()&os.ModeSymlink != 0 {
		return &os.PathError{Op: "open", Path: name, Err: errSymlink}
	}
	return err
}

// checkRegular returns an error unless f is a regular file (not a directory,
// a FIFO or a device planted under a segment's name).
func checkRegular(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return &os.PathError{Op: "open", Path: f.Name(), Err: errNotRegular}
	}
	return nil
}

func (osFS) Remove(name string) error     { return os.Remove(name) }
func (osFS) Rename(from, to string) error { return os.Rename(from, to) }
func (osFS) SyncDir(dir string) error     { return syncDir(dir) }

type osFile struct{ *os.File }

func (f osFile) Datasync() error { return fdatasync(f.File) }

func (f osFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}
