package wal

import (
	"errors"
	"fmt"
	"path/filepath"
)

// Sentinel errors returned by the log. Errors returned by the package wrap one
// of these with more context, so match them with [errors.Is].
var (
	// ErrLocked is returned by Open when another Log, in this process or in
	// another one, holds the directory. The error wrapping it names the
	// holder's process id when the LOCK file tells it.
	ErrLocked = errors.New("wal: directory locked by another Log")

	// ErrCorrupt is returned by Open when the log is damaged before its tail and
	// Options.Repair is not set. The error is a [*CorruptError] naming the file
	// and the offset.
	ErrCorrupt = errors.New("wal: corrupt log")

	// ErrFailed is wrapped by every Commit, CommitAsync, Sync and Close after a
	// write or an fdatasync of the log failed (and by the calls that the failed
	// write or sync covered, together with the cause). What was written but not
	// reported as committed may or may not be on disk: Close the Log and Open it
	// again to read what really is.
	ErrFailed = errors.New("wal: log failed")

	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("wal: log closed")

	// ErrBatchTooLarge is returned by Commit and CommitAsync for a batch whose
	// encoding exceeds 1 GiB.
	ErrBatchTooLarge = errors.New("wal: batch too large")

	// ErrInvalidOptions is returned by Open for a negative SegmentSize or sync
	// interval.
	ErrInvalidOptions = errors.New("wal: invalid options")
)

// CorruptError is the error of Open for a log damaged before its tail: a bad
// record followed by one written after it was synced, a bad segment that is
// not the last one, a segment cut short before the next one, or a missing
// segment (the oldest included). It wraps [ErrCorrupt].
type CorruptError struct {
	// File is the path of the damaged segment.
	File string
	// Offset is the byte offset in File where the damage starts.
	Offset int64
	// Reason says what is wrong, e.g. "checksum mismatch".
	Reason string
}

// Error names the file, the offset and the reason.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("%v: %s at offset %d: %s", ErrCorrupt, filepath.Base(e.File), e.Offset, e.Reason)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }
