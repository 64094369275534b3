package wal

// Faults lets tests outside this package do to the log what a disk can do:
// fail a write (a full disk), a read or an fdatasync (EIO), and learn what each
// fdatasync made durable, so that a test can cut a segment back to it after a
// SIGKILL and so simulate a power loss. A nil func does nothing. Production
// code leaves Options.Faults nil.
type Faults struct {
	// WriteErr is called before each write to a file; an error it returns
	// fails that write.
	WriteErr func(name string) error
	// ReadErr is called before each read of a file (replay, Get, Range and
	// Scan); an error it returns fails that read.
	ReadErr func(name string) error
	// SyncErr is called before each fdatasync of a file; an error it returns
	// fails that fdatasync.
	SyncErr func(name string) error
	// Synced is called after each fdatasync that succeeded, with the file and
	// its size then: everything up to size is durable.
	Synced func(name string, size int64)
}

// hookFS is a fileSystem whose files obey Faults.
type hookFS struct {
	fileSystem
	f *Faults
}

func (fs hookFS) OpenFile(name string, flag int) (file, error) {
	f, err := fs.fileSystem.OpenFile(name, flag)
	if err != nil {
		return nil, err
	}
	return hookFile{file: f, name: name, f: fs.f}, nil
}

type hookFile struct {
	file
	name string
	f    *Faults
}

func (f hookFile) WriteAt(p []byte, off int64) (int, error) {
	if f.f.WriteErr != nil {
		if err := f.f.WriteErr(f.name); err != nil {
			return 0, err
		}
	}
	return f.file.WriteAt(p, off)
}

func (f hookFile) ReadAt(p []byte, off int64) (int, error) {
	if f.f.ReadErr != nil {
		if err := f.f.ReadErr(f.name); err != nil {
			return 0, err
		}
	}
	return f.file.ReadAt(p, off)
}

func (f hookFile) Datasync() error {
	if f.f.SyncErr != nil {
		if err := f.f.SyncErr(f.name); err != nil {
			return err
		}
	}
	if err := f.file.Datasync(); err != nil {
		return err
	}
	if f.f.Synced != nil {
		if size, err := f.file.Size(); err == nil {
			f.f.Synced(f.name, size)
		}
	}
	return nil
}
