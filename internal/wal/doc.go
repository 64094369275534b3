// Package wal is a crash-safe, append-only key/value log with group commit,
// meant to back TinyMQ's durable queues. It uses only the standard library.
//
// # Model
//
// A [Log] is a directory of segment files. Writes are batches of Put and
// Delete operations ([Batch]); each batch is one framed record, so after a
// crash either all of its operations are in the log or none. The live state
// is, for each key, the value of its latest Put not followed by a Delete.
// [Open] replays the segments into an in-memory index of key -> (segment,
// offset, length); values stay on disk and [Log.Get] and [Log.Range] read them
// back with ReadAt.
//
//	l, err := wal.Open(dir, wal.Options{})
//	var b wal.Batch
//	b.Put([]byte("msg/1"), payload)
//	b.Delete([]byte("msg/0"))
//	err = l.Commit(&b) // durable once it returns (SyncAlways)
//	err = l.Close()
//
// # Durability
//
// One writer goroutine, owned by the Log, does every write. Commit hands it
// the batch and waits; the writer takes every batch queued at that moment,
// writes them with one write(2) and, under [SyncAlways], covers them with one
// fdatasync(2) (File.Sync on systems without it). The batches that arrive
// during that fdatasync make the next group, so N concurrent committers cost
// far fewer than N syncs. A single writer rather than leader/follower keeps
// the ordering, the segment roll-over and the compaction in one place, at the
// price of one goroutine hand-off per Commit (microseconds, against a
// millisecond-class fdatasync).
//
// The writer sleeps while the committers of the last groups come back (at
// most about two syncs) and is woken once, by the one that completes the
// cohort, rather than once per Commit.
//
// [Log.CommitAsync] orders a batch without waiting for its write or sync (for
// acknowledgements: they ride on the next sync and never cost one of their
// own). It does not wake the writer either: the batches wait in a buffer,
// merged into one record, and are written first in the next group. [SyncInterval] makes Commit return after the write and syncs in the
// background: a crash of the machine may lose the last interval of commits.
//
// If a write or an fdatasync fails (ENOSPC, EIO), the Commits it covered
// return the error and the log fails: every later call returns an error
// wrapping [ErrFailed]. A failed fdatasync is never retried — after one, the
// kernel may have dropped the pages it could not write and a second fsync
// would succeed without them ("fsyncgate"). To recover, Close the Log and Open
// it again: the replay reads what is really on disk.
//
// # Recovery
//
// Open cuts a torn tail: what a crash in the middle of a write leaves at the
// end of the last segment. That is an incomplete or damaged record with no
// valid record after it, or with only records written after the last
// fdatasync that had completed when the damaged one was written — the pages
// of one unsynced write may reach the disk in any order, so a crash can leave
// a hole followed by valid records, none of which any Commit had been
// promised. Each record carries that "synced" watermark, so the two cases are
// told apart. A last segment no longer than a header whose header cannot be
// read is a torn creation, removed. Any other damage — a bad record followed
// by a record written after it was synced, a bad segment that is not the
// last, a segment that ends before the record the next segment's header
// starts at, a gap in the segment ids, an oldest segment missing (one that no
// trim record, see below, says the log removed) — makes Open fail with a
// [*CorruptError] (wrapping [ErrCorrupt]) naming the file and the offset, and
// change nothing, unless [Options].Repair is set; then the log is cut at
// the first bad byte (its longest valid prefix is kept), the cut bytes are
// kept in files named "<segment>.corrupt-<offset>" (offset 0: the whole
// segment), and the cuts are reported by [Log.Recovery] and logged; missing
// oldest segments are reported and what follows them is kept. Damage to the
// very last write of a log (bit rot after its sync, or a truncation of the
// last segment at a record's end) looks like a torn tail and is cut as one:
// nothing in the log can tell them apart.
//
// Open ends with an fdatasync of the last segment, so that what it replayed
// from the page cache of a crashed process is durable before it is used.
//
// # Bounded disk
//
// The oldest segment is deleted once none of its Puts holds a live value (its
// Deletes can only cancel Puts in it or in older segments, which are gone
// already), after a trim record naming the next segment is synced in the
// head, so that Open can tell the segments the log removed from one deleted
// behind its back. When the oldest segment holds little live data (under a quarter
// of its bytes, once a segment newer than the head's predecessor exists), or
// whatever it holds once the directory exceeds twice the live data plus two
// segments (so that a backlog in the oldest segment cannot pin every dead
// segment behind it), the writer rewrites its live values into the head
// segment as new Puts, a bounded step at a time between groups (one read of
// up to 1 MiB each), so the segment dies and is deleted. A steady put/delete
// load therefore keeps the directory at a few segments, and at most about
// twice the live data.
//
// # File format
//
// Segment files are named by a 20-digit, zero-padded decimal id
// ("00000000000000000001.wal"); ids are consecutive, the highest is the head
// that is appended to. All integers are little-endian. A segment starts with a
// 32-byte header:
//
//	offset size field
//	0      6    magic "TMQWAL"
//	6      2    format version, 1
//	8      8    segment id (equals the file name)
//	16     8    seq of the segment's first record
//	24     4    salt, random per segment
//	28     4    CRC-32C (Castagnoli) of bytes 0..27
//
// followed by records, back to back:
//
//	offset size field
//	0      4    n, length of the body, 20 <= n <= 1 GiB
//	4      4    CRC-32C of salt (4 bytes) || bytes 0..3 || body
//	8      n    body:
//	              8 bytes  seq, consecutive across the whole log
//	              8 bytes  synced: every record up to this seq had been
//	                       fdatasynced when this one was written (< seq)
//	              4 bytes  number of ops
//	              ops, each:
//	                1 byte   kind: 1 Put, 2 Delete, 3 Trim
//	                Put, Delete: uvarint key length, then the key
//	                Put only: uvarint value length, then the value
//	                Trim: uvarint segment id; the segments below it are
//	                      removed (the writer's own records)
//
// Varints must be minimal and the ops must fill the body exactly. The salt
// makes a record copied from another segment, or carried inside a value,
// fail the CRC; the seq makes a stale record of the same segment detectable.
// A new segment's header is synced, and the directory with it, before any
// record goes into it, and a segment is synced before the next one is
// started, so only the last segment can have a torn tail. The directory is
// also synced when a segment is removed or renamed. dir/LOCK holds the flock
// that keeps a second Log, in any process, off the directory, and as its
// first line the pid of the holder, which a refused Open names. The log
// creates its directory 0700 and its files 0600, and opens no file through a
// symbolic link (O_NOFOLLOW; an Lstat check where there is none).
package wal
