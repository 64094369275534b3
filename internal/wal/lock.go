package wal

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// The LOCK file holds the flock (see lockFile) and, as its first line, the id
// of the process that holds it, for the error of a refused Open.

// writePID writes this process's id as the first line of f, the LOCK file
// whose lock was just taken. It writes before it truncates, so that a
// refused Open reading the file concurrently finds a whole line (the new one
// or the last holder's), never an empty file. It is best effort: the lock is
// the flock, not the pid.
func writePID(f *os.File) {
	b := strconv.AppendInt(nil, int64(os.Getpid()), 10)
	b = append(b, '\n')
	if _, err := f.WriteAt(b, 0); err == nil {
		_ = f.Truncate(int64(len(b)))
	}
}

// lockedError is the error of a refused lock on path, naming the holder found
// in content, the start of the LOCK file, when it names one.
func lockedError(path string, content []byte) error {
	line, _, _ := bytes.Cut(content, []byte("\n"))
	if pid, err := strconv.Atoi(string(line)); err == nil && pid > 0 {
		return fmt.Errorf("%w: %s held by process %d", ErrLocked, path, pid)
	}
	return fmt.Errorf("%w: %s", ErrLocked, path)
}

// maxPIDLine is how much of a LOCK file a refused Open reads.
const maxPIDLine = 32
