package wal

import (
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

type osFS struct{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

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
	f, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
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
