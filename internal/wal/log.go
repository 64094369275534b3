package wal

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

const (
	reqQueueLen   = 1024    // requests waiting for the writer
	maxGroup      = 1024    // requests written and synced together
	maxGroupBytes = 4 << 20 // bytes after which the writer stops gathering
	lockName      = "LOCK"
)

// Log is an append-only, crash-safe key/value log. Open it, change it with
// batches ([Log.Commit]), read its live state ([Log.Get], [Log.Range]) and
// Close it. All methods are safe for concurrent use.
//
// # Concurrency map
//
// Goroutines: one writer (run), started by Open and joined by Close (it closes
// done). It alone writes, syncs, rolls, compacts and removes segments, and
// mutates index and segs. Nothing else is started. Open (on its caller's
// goroutine) and the writer call Options.Log, the owner's callback, with no
// lock held; the log calls no user code but the fn given to Range.
//
// Locks (taken in this order, never the other way; no user code runs under
// any of them except readers, see below):
//   - closeMu: Commit, CommitAsync and Sync hold it shared while they check
//     closed and send on reqs; Close holds it exclusively to set closed and
//     close reqs, so no send can race with the close.
//   - readers: Get and Range hold it shared while they read segment files,
//     including while Range calls its fn. The writer only TryLocks it to remove
//     a segment (and retries later), so a reader never waits for it and fn may
//     call any method, Close included.
//   - async.mu: guards the CommitAsync batches waiting for the writer; held
//     only to add one or to swap them out, never while writing.
//   - mu: guards index, segs and the segments' sizes and live counts. The
//     writer reads them without it (it is their only writer) and writes them
//     under it; everyone else reads them under it.
type Log struct {
	reqPool sync.Pool // requests with their done channel: see getRequest

	dir  string
	opts Options
	fs   fileSystem
	log  func(level slog.Level, msg string, attrs ...slog.Attr) // Options.Log
	lock io.Closer

	readOnly bool // opened by OpenReadOnly: no writer, no lock, nothing written

	recovery Recovery // set by Open, read-only afterwards

	reqs chan *request // closed by Close; the writer drains it

	// Waking the writer for each Commit would cost a goroutine switch per
	// request while it gathers a group (see awaitCohort). Instead, Commits
	// count themselves in waiting once queued, and the one that brings it to
	// want (set by the writer while it waits for a group) wakes the writer
	// through cohortFull.
	waiting    atomic.Int32  // queued requests with a done channel
	want       atomic.Int32  // waiting count that wakes the writer; 0 when it is not waiting
	cohortFull chan struct{} // capacity 1

	async asyncOps
	done  chan struct{} // closed when the writer returns

	closeMu sync.RWMutex
	closed  bool // under closeMu

	isClosed  atomic.Bool // set by Close; Get, Range and Stats check it
	closeOnce sync.Once
	closeErr  error

	failed atomic.Pointer[error] // the error wrapping ErrFailed, once failed

	readers sync.RWMutex

	mu        sync.Mutex
	index     map[string]loc
	segs      []*segment // oldest first, ids contiguous; the last is the head
	liveBytes int64

	syncs, commits, compactions, removed atomic.Uint64

	w writer // the writer goroutine's own state
}

// loc is where a live value is: segment, offset and length of the value. The
// encoded size of its op (for the live-bytes accounting) follows from the
// lengths of the key and the value. 16 bytes: an offset fits in 32 bits, as
// a segment is never larger than maxSegmentFile.
type loc struct {
	seg  uint64
	off  uint32
	vlen uint32
}

// segment is one segment file.
type segment struct {
	segHeader
	path      string
	f         file
	size      int64  // valid bytes; the head's grows as the writer writes
	records   uint64 // records in the segment
	liveKeys  int    // index entries pointing into the segment
	liveBytes int64  // their cost
}

func segName(id uint64) string { return fmt.Sprintf("%020d.wal", id) }

// parseSegName returns the id of a segment file name, or false.
func parseSegName(name string) (uint64, bool) {
	num, ok := strings.CutSuffix(name, ".wal")
	if !ok || len(num) != 20 {
		return 0, false
	}
	var id uint64
	for _, c := range []byte(num) {
		if c < '0' || c > '9' {
			return 0, false
		}
		next := id*10 + uint64(c-'0')
		if next/10 != id {
			return 0, false
		}
		id = next
	}
	return id, true
}

// Open opens the log in dir, creating dir if needed, and replays it: the live
// state is rebuilt in memory as an index of keys to value positions (values
// stay on disk). Open takes an exclusive lock on dir (a flock on dir/LOCK) and
// fails with an error wrapping [ErrLocked], naming the process that holds it,
// while another Log, in this process or another, has it. Open creates dir
// (0700) and the log's files (0600) private, and never follows a symbolic
// link planted in dir: a LOCK or a segment that is one fails Open.
//
// An Open that fails keeps nothing: it releases the lock and every file it
// opened, and leaves no goroutine. One that refuses the directory (ErrLocked,
// ErrCorrupt) has changed none of the log's segments, so it can be called
// again once the cause is gone.
//
// A torn tail (an incomplete or damaged last write, as a crash leaves it; see
// the package documentation) is cut and reported by [Log.Recovery]. Damage
// anywhere else fails Open with a [*CorruptError] wrapping [ErrCorrupt], unless
// Options.Repair is set. Open blocks for the time of the replay, which reads
// every segment once, and for one fdatasync.
func Open(dir string, opts Options) (*Log, error) {
	if opts.Faults != nil {
		return open(dir, opts, hookFS{osFS{}, opts.Faults})
	}
	return open(dir, opts, osFS{})
}

func open(dir string, opts Options, fsys fileSystem) (*Log, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := fsys.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	// Make dir's own entry durable, in case MkdirAll just created it.
	if err := fsys.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	lock, err := lockFile(filepath.Join(dir, lockName))
	if err != nil {
		if errors.Is(err, ErrLocked) {
			return nil, err
		}
		return nil, fmt.Errorf("wal: lock: %w", err)
	}
	l := &Log{
		dir:        dir,
		opts:       opts,
		fs:         fsys,
		log:        opts.Log,
		lock:       lock,
		index:      make(map[string]loc),
		reqs:       make(chan *request, reqQueueLen),
		cohortFull: make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	// Async batches are written with the next group, and all of them (they
	// are ordered before its requests): holding at most about a group's
	// worth keeps groups, and so the disk between maintenance steps, bounded.
	l.async.limit = int(min(maxAsyncRecord, opts.SegmentSize/8))
	l.async.behind = int(min(maxGroupBytes, opts.SegmentSize))
	opened := false
	defer func() {
		if !opened { // a failed Open keeps nothing; no goroutine is started before
			l.closeFiles()
			lock.Close()
		}
	}()
	if err := l.recover(); err != nil {
		return nil, err
	}
	// What was replayed may have been in the page cache only (the last process
	// died before its sync): make it durable before anyone acts on it. Every
	// other segment was synced before the one after it was created.
	head := l.head()
	if err := head.f.Datasync(); err != nil {
		return nil, fmt.Errorf("wal: fdatasync %s: %w", head.path, err)
	}
	l.syncs.Add(1)
	l.w.nextSeq = head.firstSeq + head.records
	l.w.written = l.w.nextSeq - 1
	l.w.synced = l.w.written
	opened = true
	go l.run()
	return l, nil
}

// request is a batch (or a Sync) sent to the writer.
type request struct {
	rec  []byte     // an unsealed record; nil for Sync
	keys []string   // the batch's PutSizedString keys, for the index (see Log.apply)
	sync bool       // Sync: fdatasync whatever the policy
	done chan error // receives the outcome; nil for CommitAsync
}

// wakeRequest is the request a CommitAsync sends to make the writer take the
// batches waiting (see asyncOps): one for every log, since the writer only
// reads a request, and one without a done channel is never answered.
var wakeRequest = &request{}

// getRequest returns a request with its done channel, for Commit and Sync,
// from the log's own pool (putRequest gives it back once the writer has sent
// on done). The pool is the log's, not the package's, so that a channel never
// outlives the log that made it: a log opened in a testing/synctest bubble
// keeps its channels there.
func (l *Log) getRequest() *request {
	if r, ok := l.reqPool.Get().(*request); ok {
		return r
	}
	return &request{done: make(chan error, 1)}
}

func (l *Log) putRequest(r *request) { l.reqPool.Put(r) }

// call sends a request for rec (a Commit, with its batch's keys) or a sync
// to the writer and waits for its answer. The writer reads rec and keys only
// until it answers.
func (l *Log) call(rec []byte, keys []string, sync bool) error {
	r := l.getRequest()
	r.rec, r.keys, r.sync = rec, keys, sync
	err := l.send(r)
	if err == nil {
		err = <-r.done
	}
	r.rec, r.keys = nil, nil
	l.putRequest(r)
	return err
}

// Commit writes b as one record and returns when it is durable under the
// sync policy: under [SyncAlways] after an fdatasync that covers it (shared
// with concurrent Commits), under [SyncInterval] once it is written to the
// file. After Commit returns nil, Get and Range see the batch; b may then be
// reused. A nil b is an empty batch.
//
// Commit blocks for the write and the sync (and while the writer's queue is
// full). If the write or the sync fails, it returns an error wrapping the
// cause and [ErrFailed], and the batch may or may not be in the log after a
// reopen. After Close it returns [ErrClosed].
func (l *Log) Commit(b *Batch) error {
	rec, err := recordOf(b)
	if err != nil {
		return err
	}
	var keys []string
	if b != nil {
		keys = b.keys
	}
	return l.call(rec, keys, false)
}

// CommitAsync orders b in the log behind every batch already committed or
// ordered, and returns without waiting for the write or the sync: use it for
// changes that may be lost in a crash (such as acknowledgements), which then
// never cost an fdatasync of their own. The batch becomes durable with the
// next sync: a later Commit's (under SyncAlways), Sync, Close, or the
// background sync, which comes at most 100ms (SyncAlways) or the sync
// interval after its write. Get and Range see it once the writer has written
// it. b may be reused at once (CommitAsync copies it).
//
// Concurrent CommitAsync batches are gathered into one record per group
// written (each batch stays all-or-nothing after a crash), so that many small
// ones cost the writer about as much as one.
//
// CommitAsync blocks only while the writer is behind (a segment's worth of
// batches, at most 4 MiB, waiting). A failure of its later write shows as
// ErrFailed in the calls after it. After Close it returns [ErrClosed].
func (l *Log) CommitAsync(b *Batch) error {
	rec, err := recordOf(b)
	if err != nil {
		return err
	}
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if err := l.usable(); err != nil {
		return err
	}
	wake, behind := l.async.add(rec)
	if behind {
		// Wait for the writer to take what is waiting, like a full reqs.
		r := l.getRequest()
		r.rec, r.keys, r.sync = nil, nil, false
		l.enqueue(r)
		err := <-r.done
		l.putRequest(r)
		return err
	} else if wake {
		l.enqueue(wakeRequest)
	}
	return nil
}

// asyncOps holds the CommitAsync batches that the writer has not taken yet,
// merged into records. A CommitAsync that finds none waiting sends the
// writer an empty request, which makes it take them (the writer also takes
// them with every group it writes).
type asyncOps struct {
	mu     sync.Mutex
	cur    Batch    // batches merged into one record
	full   [][]byte // earlier merged records, unsealed, closed when cur reached limit
	size   int      // bytes in cur and full
	limit  int      // the size past which cur is closed: a fraction of a segment (set by Open)
	behind int      // the size past which CommitAsync waits for the writer (set by Open)
	queued bool     // a request is in reqs, or the writer will take them anyway
}

// maxAsyncRecord is the largest record that merged CommitAsync batches make
// (unless one batch is larger); with small segments, an eighth of one.
const maxAsyncRecord = 1 << 20

// add merges the unsealed record rec (see Batch.record). It reports whether the writer
// must be sent a request to take it, and whether so much is waiting that the
// caller should wait for the writer.
func (a *asyncOps) add(rec []byte) (wake, behind bool) {
	n := int(binary.LittleEndian.Uint32(rec[recHeaderLen+16:]))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur.Size()+len(rec)-recPrefixLen > a.limit && a.cur.n > 0 {
		a.full = append(a.full, bytes.Clone(a.cur.record()))
		a.cur.Reset()
	}
	a.cur.init()
	a.cur.buf = append(a.cur.buf, rec[recPrefixLen:]...)
	a.cur.n += n
	a.size += len(rec) - recPrefixLen
	wake = !a.queued
	a.queued = true
	return wake, a.size > a.behind
}

// take calls fn with every waiting record, oldest first, and empties the
// buffer. It swaps the merged record with spare (an empty batch, whose memory
// it reuses) under the lock and calls fn without it, so that CommitAsync does
// not wait for fn's writes. fn must not keep rec. Only the writer calls it.
func (a *asyncOps) take(spare *Batch, fn func(rec []byte) error) error {
	a.mu.Lock()
	a.queued = false
	full := a.full
	spare.Reset()
	a.cur, *spare = *spare, a.cur
	a.full, a.size = nil, 0
	a.mu.Unlock()
	for _, r := range full {
		if err := fn(r); err != nil {
			return err
		}
	}
	if spare.n > 0 {
		if err := fn(spare.record()); err != nil {
			return err
		}
	}
	if cap(spare.buf) > 2*a.limit {
		*spare = Batch{}
	}
	return nil
}

// Sync returns once every batch committed or ordered before it is durable,
// whatever the sync policy. It blocks for one fdatasync (none if nothing is
// pending). It returns an error wrapping [ErrFailed] if the log failed, and
// [ErrClosed] after Close.
func (l *Log) Sync() error {
	return l.call(nil, nil, true)
}

func recordOf(b *Batch) ([]byte, error) {
	if b == nil {
		b = &Batch{}
	}
	rec := b.record()
	if len(rec)-recHeaderLen > maxBodyLen {
		return nil, fmt.Errorf("%w: %d bytes", ErrBatchTooLarge, len(rec))
	}
	return rec, nil
}

// send hands r to the writer, which will answer on r.done.
func (l *Log) send(r *request) error {
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if err := l.usable(); err != nil {
		return err
	}
	l.enqueue(r)
	return nil
}

// usable returns ErrClosed after Close, the failure of a failed log, or nil.
// The caller holds closeMu shared.
func (l *Log) usable() error {
	if l.closed {
		return ErrClosed
	}
	if l.readOnly {
		return ErrReadOnly
	}
	return l.failure()
}

// enqueue hands r to the writer. The caller holds closeMu shared and has
// checked closed.
func (l *Log) enqueue(r *request) {
	l.reqs <- r
	if r.done != nil {
		n := l.waiting.Add(1)
		if w := l.want.Load(); w > 0 && n >= w {
			select {
			case l.cohortFull <- struct{}{}:
			default:
			}
		}
	}
}

// Err returns the error that failed the log (wrapping ErrFailed), ErrClosed
// after Close, or nil while the log takes writes. It does not block.
func (l *Log) Err() error {
	if l.isClosed.Load() {
		return ErrClosed
	}
	return l.failure()
}

// failure returns the error wrapping ErrFailed, or nil.
func (l *Log) failure() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Get returns the live value of key, read from its segment file, and whether
// there is one. It sees every batch whose Commit has returned. It blocks for
// one read. After Close it returns [ErrClosed].
func (l *Log) Get(key []byte) ([]byte, bool, error) {
	if l.isClosed.Load() {
		return nil, false, ErrClosed
	}
	l.readers.RLock()
	defer l.readers.RUnlock()
	l.mu.Lock()
	lc, ok := l.index[string(key)]
	var f file
	if ok {
		f = l.segByID(lc.seg).f
	}
	l.mu.Unlock()
	if !ok {
		return nil, false, nil
	}
	val := make([]byte, lc.vlen)
	if err := readFull(f, val, int64(lc.off)); err != nil {
		return nil, false, l.readErr(lc.seg, err)
	}
	return val, true, nil
}

// Range calls fn for every live key and its value in ascending key order,
// until fn returns false. The keys come from a snapshot of the in-memory
// index taken when Range starts (a Commit that returns before Range is called
// is in it); the values are read from the segment files one at a time, so a
// large state never has to fit in memory. key and val are only valid until fn
// returns.
//
// fn may call any method of the Log. While Range runs, the writer postpones
// removing dead segments. Range blocks for a sort of the keys and one read
// per value. It returns the first read error, or [ErrClosed] after Close.
func (l *Log) Range(fn func(key, val []byte) bool) error {
	if l.isClosed.Load() {
		return ErrClosed
	}
	l.readers.RLock()
	defer l.readers.RUnlock()
	type entry struct {
		key string
		loc
		f file
	}
	l.mu.Lock()
	ents := make([]entry, 0, len(l.index))
	for k, lc := range l.index {
		ents = append(ents, entry{k, lc, l.segByID(lc.seg).f})
	}
	l.mu.Unlock()
	slices.SortFunc(ents, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	var buf []byte
	for _, e := range ents {
		if cap(buf) < int(e.vlen) {
			buf = make([]byte, e.vlen)
		}
		val := buf[:e.vlen]
		if err := readFull(e.f, val, int64(e.off)); err != nil {
			return l.readErr(e.seg, err)
		}
		if !fn([]byte(e.key), val) {
			return nil
		}
	}
	return nil
}

// scanChunk is the most that Scan reads at once, and scanGap the largest
// stretch of dead bytes it reads through rather than start another read: a
// page-cache copy of a few KiB costs less than a system call.
const (
	scanChunk = 1 << 20
	scanGap   = 4 << 10
)

// Scan calls fn for every live key and its value in the order of their
// positions in the log (oldest segment first, then by offset), until fn
// returns false. As for Range, the keys come from a snapshot of the index
// taken when Scan starts. Unlike Range, it reads the segment files
// sequentially, many values per read (up to 1 MiB, skipping dead stretches
// longer than a few KiB), and hands fn the index's own key string, which fn
// may keep; val is only valid until fn returns.
//
// fn may call any method of the Log. While Scan runs, the writer postpones
// removing dead segments. Scan blocks for a sort of the positions (about
// 100ns per key) and for the reads. It returns the first read error, or
// [ErrClosed] after Close.
func (l *Log) Scan(fn func(key string, val []byte) bool) error {
	if l.isClosed.Load() {
		return ErrClosed
	}
	l.readers.RLock()
	defer l.readers.RUnlock()
	type entry struct {
		key  string
		off  int64
		vlen uint32
		seg  uint32 // index in segs
	}
	l.mu.Lock()
	segs := slices.Clone(l.segs)
	sizes := make([]int64, len(segs))
	for i, s := range segs {
		sizes[i] = s.size
	}
	ents := make([]entry, 0, len(l.index))
	first := segs[0].id
	for k, lc := range l.index {
		ents = append(ents, entry{k, int64(lc.off), lc.vlen, uint32(lc.seg - first)})
	}
	l.mu.Unlock()
	// Sorted by one integer, segment and offset packed, when they fit.
	if len(segs) <= 1<<20 && slices.IndexFunc(sizes, func(n int64) bool { return n >= 1<<44 }) < 0 {
		pos := func(e *entry) uint64 { return uint64(e.seg)<<44 | uint64(e.off) }
		slices.SortFunc(ents, func(a, b entry) int { return cmp.Compare(pos(&a), pos(&b)) })
	} else {
		slices.SortFunc(ents, func(a, b entry) int {
			if a.seg != b.seg {
				return cmp.Compare(a.seg, b.seg)
			}
			return cmp.Compare(a.off, b.off)
		})
	}
	var buf []byte
	for i := 0; i < len(ents); {
		// One read from ents[i] to the end of the last value after it that
		// fits in scanChunk with no gap wider than scanGap.
		start, seg := ents[i].off, ents[i].seg
		end := start + int64(ents[i].vlen)
		j := i + 1
		for ; j < len(ents) && ents[j].seg == seg; j++ {
			e := ents[j]
			if e.off-end > scanGap || e.off+int64(e.vlen)-start > scanChunk {
				break
			}
			end = max(end, e.off+int64(e.vlen))
		}
		if end > sizes[seg] {
			return l.readErr(segs[seg].id, io.ErrUnexpectedEOF) // the index points past the segment: a bug
		}
		if int64(cap(buf)) < end-start {
			buf = make([]byte, end-start)
		}
		win := buf[:end-start]
		if err := readFull(segs[seg].f, win, start); err != nil {
			return l.readErr(segs[seg].id, err)
		}
		for ; i < j; i++ {
			e := &ents[i]
			v := win[e.off-start : e.off-start+int64(e.vlen)]
			if !fn(e.key, v[:len(v):len(v)]) {
				return nil
			}
		}
	}
	return nil
}

func (l *Log) readErr(seg uint64, err error) error {
	if l.isClosed.Load() {
		return ErrClosed
	}
	return fmt.Errorf("wal: read %s: %w", segName(seg), err)
}

func readFull(f file, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// segByID returns the segment with that id, which must exist. Under mu, or in
// the writer.
func (l *Log) segByID(id uint64) *segment {
	return l.segs[id-l.segs[0].id]
}

// Stats is a snapshot of a Log's counters.
type Stats struct {
	Segments  int   // segment files
	DiskBytes int64 // their total size
	LiveKeys  int   // keys with a live value
	// LiveBytes is the size of the live entries as encoded in the log (keys,
	// values and 2 to 20 bytes of framing each).
	LiveBytes int64

	Commits         uint64 // records written since Open for Commit and CommitAsync (which merges batches)
	Syncs           uint64 // fdatasyncs of segment files since Open
	Compactions     uint64 // records written by compaction since Open
	SegmentsRemoved uint64 // dead segments deleted since Open
}

// Stats returns the log's counters. It is cheap (one short lock) and works
// after Close, returning the last values.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	s := Stats{Segments: len(l.segs), LiveKeys: len(l.index), LiveBytes: l.liveBytes}
	for _, seg := range l.segs {
		s.DiskBytes += seg.size
	}
	l.mu.Unlock()
	s.Commits = l.commits.Load()
	s.Syncs = l.syncs.Load()
	s.Compactions = l.compactions.Load()
	s.SegmentsRemoved = l.removed.Load()
	return s
}

// Close writes and syncs every batch committed or ordered before it, stops the
// writer, closes the files and releases the directory lock. It blocks for the
// last write and sync. It returns an error wrapping [ErrFailed] if the log
// failed before or during the final sync, in which case what was ordered but
// not reported committed may be missing: Open the directory again to see what
// is on disk. Close is idempotent: later calls return the first call's result.
// Calls other than Stats and Recovery return [ErrClosed] after it.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.closeMu.Lock()
		l.closed = true
		close(l.reqs)
		l.closeMu.Unlock()
		<-l.done
		l.isClosed.Store(true)
		l.closeFiles()
		if err := l.lock.Close(); err != nil && l.failure() == nil {
			l.closeErr = fmt.Errorf("wal: unlock: %w", err)
		}
		if err := l.failure(); err != nil {
			l.closeErr = err
		}
	})
	return l.closeErr
}

func (l *Log) closeFiles() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.segs {
		s.f.Close()
	}
}

// Recovery is what Open found and did while replaying the log.
type Recovery struct {
	// Segments is the number of segment files replayed, Records the number of
	// records (batches) in them.
	Segments int
	Records  int
	// Cuts lists what Open cut off: torn tails, and with Options.Repair the
	// corrupt parts.
	Cuts []Cut
}

// Cut is a part of the log that Open cut off.
type Cut struct {
	File   string // path of the segment
	Offset int64  // where the cut starts; 0 for a whole file
	Bytes  int64  // how many bytes were cut
	Torn   bool   // a torn tail (a crash's leftover) rather than corruption
	// SavedAs is the path of the copy of the cut bytes ("" for torn tails).
	SavedAs string
	Reason  string
}

// Recovery returns what Open found and cut. It never blocks.
func (l *Log) Recovery() Recovery {
	r := l.recovery
	r.Cuts = slices.Clone(r.Cuts)
	return r
}
