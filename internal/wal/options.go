package wal

import (
	"fmt"
	"log/slog"
	"time"
)

// DefaultSegmentSize is the SegmentSize used when Options.SegmentSize is 0.
const DefaultSegmentSize = 64 << 20

// MaxSegmentSize is the largest SegmentSize. A segment then holds at most
// MaxSegmentSize bytes, or one record of up to 1 GiB and its header: never
// more than maxSegmentFile, so that the index keeps offsets in 32 bits.
const MaxSegmentSize = 2 << 30

// maxSegmentFile is the largest segment file that Open replays.
const maxSegmentFile = 1<<32 - 1

// asyncSyncDelay bounds how long a CommitAsync batch stays unsynced under
// SyncAlways when no Commit or Sync comes to carry it.
const asyncSyncDelay = 100 * time.Millisecond

// SyncPolicy says when [Log.Commit] returns. The zero value is [SyncAlways].
type SyncPolicy time.Duration

// SyncAlways makes Commit return once an fdatasync covering the batch has
// returned. Concurrent Commits share one fdatasync (group commit). It is the
// default.
const SyncAlways SyncPolicy = 0

// SyncInterval makes Commit return once the batch is written to the file (in
// the OS page cache) and syncs in the background at most d after a write. A
// crash of the process loses nothing; a crash of the machine or a power loss
// loses the batches of the last d (and whatever the failing sync covered).
func SyncInterval(d time.Duration) SyncPolicy { return SyncPolicy(d) }

// Options configures [Open]. The zero value is valid: SyncAlways, 64 MiB
// segments, no repair, no logging.
type Options struct {
	// SegmentSize is the size at which the log starts a new segment file; 0
	// means DefaultSegmentSize, and more than MaxSegmentSize is refused with
	// ErrInvalidOptions. A batch larger than it gets a segment of its own.
	SegmentSize int64

	// Sync is the durability policy of Commit; the zero value is SyncAlways.
	Sync SyncPolicy

	// Repair lets Open cut a log damaged before its tail instead of failing with
	// ErrCorrupt: the log is cut at the first bad byte (keeping its longest
	// valid prefix), the cut bytes are kept beside it in files named
	// "<segment>.corrupt-<offset>", and the cuts are reported by
	// [Log.Recovery] and logged.
	Repair bool

	// Log, if not nil, is told what cannot be returned as an error: each cut
	// that Open made (at Warn level, with the attributes file, offset, bytes,
	// torn, saved_as and reason) and the error that failed the log (at Error
	// level, with dir and err). It is called from the log's goroutines (Open's
	// caller and the writer), with no lock of the log held; it must not block
	// or call back into the log. The log never calls user code itself: the
	// owner of the Log adapts this to its logger and guards it. Nil discards.
	Log func(level slog.Level, msg string, attrs ...slog.Attr)

	// Faults, for tests only, injects disk failures and reports syncs.
	Faults *Faults
}

func (o Options) withDefaults() (Options, error) {
	if o.SegmentSize < 0 || o.SegmentSize > MaxSegmentSize {
		return o, fmt.Errorf("%w: SegmentSize %d outside [0, %d]", ErrInvalidOptions, o.SegmentSize, int64(MaxSegmentSize))
	}
	if o.Sync < 0 {
		return o, fmt.Errorf("%w: negative sync interval %v", ErrInvalidOptions, time.Duration(o.Sync))
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.Log == nil {
		o.Log = func(slog.Level, string, ...slog.Attr) {}
	}
	return o, nil
}
