package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// ErrReadOnly is returned by Commit, CommitAsync and Sync of a Log opened by
// [OpenReadOnly].
var ErrReadOnly = errors.New("wal: log opened read-only")

// errReadOnlyFS is what the file system of a read-only Log answers to
// anything that would change the directory: a bug if it is ever seen.
var errReadOnlyFS = errors.New("wal: read-only open tried to change the directory")

// readOnlyRetries is how many times OpenReadOnly replays again when a
// segment it listed was removed (by the writer of a live Log) before it
// could open it.
const readOnlyRetries = 5

// OpenReadOnly opens the log in dir for reading only: it replays the
// segments into an index, as [Open] does, and then serves Get, Range, Scan,
// Stats, Recovery and Segments; Commit, CommitAsync and Sync return
// [ErrReadOnly]. It never changes the directory: it does not create it,
// takes no lock, opens every file read-only, cuts nothing and repairs
// nothing, and starts no goroutine.
//
// Damage is reported instead of refused: OpenReadOnly keeps the longest
// valid prefix of the log, as Options.Repair would, but only in memory, and
// [Log.Recovery] lists what it left out as Cuts whose SavedAs is "" (Torn
// for an incomplete last write). Replaying verifies the CRC of every record
// of every segment up to the first damage, so a Recovery with no Cuts means
// that every record is intact. It fails with a [*CorruptError] only when
// nothing of the log is readable.
//
// It may run while a Log of another process writes the directory (see
// [LockHolder]): on systems where an open file outlives its removal (all
// but Windows), the result is a snapshot of what that Log had written when
// each segment was opened, the write it was in the middle of (if any)
// showing as a torn tail. A segment removed between the listing of the
// directory and its opening makes it replay again, a few times at most.
//
// OpenReadOnly blocks for the replay, which reads every segment once. The
// Log must be closed with Close, which releases the files.
func OpenReadOnly(dir string) (*Log, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("wal: %s is not a directory", dir)
	}
	for try := 0; ; try++ {
		l, err := openReadOnly(dir)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || try == readOnlyRetries {
			return l, err
		}
		time.Sleep(time.Duration(try+1) * time.Millisecond) // a live writer is removing segments: let it finish
	}
}

func openReadOnly(dir string) (*Log, error) {
	opts, err := Options{Repair: true}.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Log{
		dir:      dir,
		opts:     opts,
		fs:       readOnlyFS{},
		log:      opts.Log,
		lock:     nopCloser{},
		readOnly: true,
		index:    make(map[string]loc),
		reqs:     make(chan *request),
		done:     make(chan struct{}),
	}
	close(l.done) // no writer: Close has none to wait for
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	if len(l.segs) == 0 {
		l.closeFiles()
		if cuts := l.recovery.Cuts; len(cuts) > 0 {
			return nil, &CorruptError{File: cuts[0].File, Offset: cuts[0].Offset, Reason: cuts[0].Reason}
		}
		return nil, fmt.Errorf("wal: %s holds no log: %w", dir, fs.ErrNotExist)
	}
	return l, nil
}

// SegmentInfo describes one segment file of a Log.
type SegmentInfo struct {
	Name    string // file name, e.g. "00000000000000000001.wal"
	Size    int64  // bytes replayed (a read-only Log's view may end before the file does)
	Records uint64 // records replayed from it
}

// Segments lists the log's segment files, oldest first. It is cheap (one
// short lock).
func (l *Log) Segments() []SegmentInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]SegmentInfo, len(l.segs))
	for i, s := range l.segs {
		out[i] = SegmentInfo{Name: filepath.Base(s.path), Size: s.size, Records: s.records}
	}
	return out
}

// LockHolder reports whether a Log, in any process, holds dir, and the
// process id that the LOCK file names (0 when it names none). It never
// creates or writes the LOCK file and never waits: it takes a shared lock on
// it for the instant of the probe and releases it at once, so an Open that
// comes in that instant is refused with ErrLocked (and may be retried). A
// directory without a LOCK file is not held. On systems without flock it
// returns an error wrapping [errors.ErrUnsupported].
func LockHolder(dir string) (pid int, held bool, err error) {
	return lockHolder(filepath.Join(dir, lockName))
}

// readOnlyFS is the file system of a read-only Log: it opens files
// read-only and refuses every change.
type readOnlyFS struct{}

func (readOnlyFS) MkdirAll(string) error                { return errReadOnlyFS }
func (readOnlyFS) ReadDir(dir string) ([]string, error) { return osFS{}.ReadDir(dir) }
func (readOnlyFS) Remove(string) error                  { return errReadOnlyFS }
func (readOnlyFS) Rename(string, string) error          { return errReadOnlyFS }
func (readOnlyFS) SyncDir(string) error                 { return errReadOnlyFS }

func (readOnlyFS) OpenFile(name string, flag int) (file, error) {
	if flag&(os.O_CREATE|os.O_TRUNC|os.O_APPEND) != 0 {
		return nil, errReadOnlyFS
	}
	f, err := osFS{}.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	return readOnlyFile{f}, nil
}

// readOnlyFile is a file of readOnlyFS: reads only.
type readOnlyFile struct{ file }

func (readOnlyFile) WriteAt([]byte, int64) (int, error) { return 0, errReadOnlyFS }
func (readOnlyFile) Truncate(int64) error               { return errReadOnlyFS }
func (readOnlyFile) Datasync() error                    { return errReadOnlyFS }

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// pidOf is the process id on the first line of a LOCK file's content, or 0.
func pidOf(content []byte) int {
	line, _, _ := bytes.Cut(content, []byte("\n"))
	if pid, err := strconv.Atoi(string(line)); err == nil && pid > 0 {
		return pid
	}
	return 0
}

// reportLeftOut is corrupt for a read-only Log: it reports the damage at off
// of segment ids[i] (f is open on it, or nil) and every segment after it as
// left out of the replay, and changes nothing.
func (r *recoverer) reportLeftOut(i int, f file, off int64, reason string) {
	if off > 0 && f != nil {
		size, _ := f.Size()
		r.report(Cut{File: r.path(i), Offset: off, Bytes: size - off, Reason: reason})
		i++
		reason = "after the damage"
	}
	why := reason // the first segment left out is the damaged one, unless off > 0
	for ; i < len(r.ids); i++ {
		p := r.path(i)
		var size int64
		if st, err := os.Lstat(p); err == nil {
			size = st.Size()
		}
		r.report(Cut{File: p, Bytes: size, Reason: why})
		why = "after the damage"
	}
}
