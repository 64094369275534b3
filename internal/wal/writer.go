package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// writer is the state of the writer goroutine, which alone touches it.
type writer struct {
	wbuf    []byte       // records gathered for one write
	pending []pendingRec // the records in wbuf
	dirty   bool         // the head has writes that no fdatasync covers yet
	nextSeq uint64       // seq of the next record
	written uint64       // seq of the last record written to the file
	synced  uint64       // seq of the last record an fdatasync has covered
	rbuf    []byte       // compaction's read buffer
	spare   Batch        // swapped with the CommitAsync buffer (see asyncOps.take)
	ops     []op

	cohort       int           // committers that recent syncs answered (see awaitCohort)
	cohortMissed bool          // the last wait for them ended at its timer
	lastSync     time.Duration // how long the last fdatasync took

	compactID  uint64 // segment being compacted, and how far
	compactOff int64
	noCompact  uint64 // a segment compaction gave up on (see compactStep)
	cbatch     Batch

	// trimmed is the highest id named by a trim record (see removeDead):
	// segments below it may have been removed. Set by the replay, then by
	// the writer.
	trimmed uint64
}

type pendingRec struct {
	start, end int
	keys       []string // its Commit's PutSizedString keys, for apply; the committer's until answered
	compaction bool
	trim       bool // a trim record: neither a commit nor a compaction
}

// maxCohortWait bounds awaitCohort's wait, whatever an fdatasync takes. A
// variable for tests.
var maxCohortWait = 2 * time.Millisecond

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// run is the writer goroutine. It gathers whatever requests are queued into a
// group, writes them with one write(2), syncs once for all of them if any
// needs it (group commit: the requests that arrive during an fdatasync make
// the next group), answers them, then does a bounded step of maintenance
// (removing dead segments, compacting). It returns when reqs is closed and
// drained, after a last sync.
func (l *Log) run() {
	defer close(l.done)
	delay := time.Duration(l.opts.Sync)
	if delay == 0 {
		delay = asyncSyncDelay
	}
	timer := time.NewTimer(delay)
	timer.Stop()
	defer timer.Stop()
	var timerC <-chan time.Time // non-nil while the timer runs
	var more <-chan struct{}    // closedChan while maintenance has more to do
	group := make([]*request, 0, 16)
	cohort := time.NewTimer(time.Hour)
	cohort.Stop()
	defer cohort.Stop()
	for {
		select {
		case r, ok := <-l.reqs:
			if !ok {
				l.finish()
				return
			}
			l.received(r)
			group = append(group[:0], r)
			l.awaitCohort(group, cohort)
			open := l.gather(&group)
			l.process(group)
			clear(group)
			if !open {
				l.finish()
				return
			}
		case <-timerC:
			timerC = nil
			_ = l.syncHead() // a failure fails the log; the next call reports it
		case <-more:
		}
		more = nil
		if l.maintain() {
			more = closedChan
		}
		dirty := l.w.dirty && l.failure() == nil // a failed log never syncs again
		switch {
		case dirty && timerC == nil:
			timer.Reset(delay)
			timerC = timer.C
		case !dirty && timerC != nil:
			timer.Stop()
			timerC = nil
		}
	}
}

// awaitCohort waits, for at most about two fdatasyncs, until the committers
// of the last synced groups are queued again, so that gather makes one group
// of them. Without it, the committers answered by a sync come back while the
// next group is being synced, and the log settles into two half-size groups
// taking turns, each waiting a whole sync for the other; waiting for them
// makes one group of all of them, which carries nearly twice as much per sync
// at high concurrency. A lone committer never waits; after the concurrency
// drops, one wait ends at its timer and the next ones wait only for those
// that came (see writeGroup). group holds the one request received.
//
// The writer sleeps through the wait and is woken once, by the committer that
// completes the cohort (see send), not once per request.
func (l *Log) awaitCohort(group []*request, timer *time.Timer) {
	need := l.w.cohort
	if group[0].done != nil {
		need--
	}
	if need <= 0 {
		return
	}
	select { // a signal left from an earlier wait
	case <-l.cohortFull:
	default:
	}
	l.want.Store(int32(min(need, reqQueueLen)))
	if l.waiting.Load() < int32(need) {
		timer.Reset(min(2*l.w.lastSync, maxCohortWait))
		select {
		case <-l.cohortFull:
		case <-timer.C:
			l.w.cohortMissed = true
		}
		timer.Stop()
	}
	l.want.Store(0)
}

// received accounts for a request the writer took from reqs.
func (l *Log) received(r *request) {
	if r.done != nil {
		l.waiting.Add(-1)
	}
}

// gather adds the requests already queued to group, up to maxGroup requests
// or maxGroupBytes, and at most about one segment's worth, so that removal
// and compaction get their turn at least once per segment (a larger group
// would not save syncs: each roll-over syncs anyway). It returns false if
// reqs is closed (and so drained).
func (l *Log) gather(group *[]*request) bool {
	limit := int(min(maxGroupBytes, l.opts.SegmentSize))
	size := len((*group)[0].rec)
	for len(*group) < maxGroup && size < limit {
		select {
		case r, ok := <-l.reqs:
			if !ok {
				return false
			}
			l.received(r)
			*group = append(*group, r)
			size += len(r.rec)
		default:
			return true
		}
	}
	return true
}

// process writes a group and answers its requests.
func (l *Log) process(group []*request) {
	err := l.failure()
	if err == nil {
		err = l.writeGroup(group)
	}
	for _, r := range group {
		if r.done != nil {
			r.done <- err
		}
	}
}

func (l *Log) writeGroup(group []*request) error {
	// CommitAsync batches first: those ordered before a request of the group
	// was sent are among them (see asyncOps).
	if err := l.async.take(&l.w.spare, func(rec []byte) error { return l.appendRecord(rec, nil, false) }); err != nil {
		return l.fail(err)
	}
	needSync, waiters := false, 0
	for _, r := range group {
		if r.done != nil {
			waiters++
		}
		if r.rec != nil {
			if err := l.appendRecord(r.rec, r.keys, false); err != nil {
				return l.fail(err)
			}
			needSync = needSync || (r.done != nil && l.opts.Sync == SyncAlways)
		}
		needSync = needSync || r.sync
	}
	if err := l.flush(); err != nil {
		return l.fail(err)
	}
	// The concurrency seen lately, decaying when it drops (by an eighth, at
	// least 1, a group), so that a few stragglers do not shrink the groups
	// that follow. But a cohort that did not come back within the wait is
	// gone: the next group waits only for those that did (the late ones,
	// queued meanwhile, join it anyway), so a lone committer after a burst
	// waits once, not for 25 groups; and a group of CommitAsync batches only
	// that waited in vain does not make the next one wait again.
	switch {
	case l.w.cohortMissed:
		l.w.cohort = waiters
	case needSync:
		l.w.cohort = max(waiters, l.w.cohort-(l.w.cohort+7)/8)
	case waiters > 0: // no sync for them to share (SyncInterval): nothing to wait for
		l.w.cohort = 0
	}
	l.w.cohortMissed = false
	if needSync {
		return l.syncHead()
	}
	return nil
}

func (l *Log) head() *segment { return l.segs[len(l.segs)-1] }

// directRecord is the size from which appendRecord writes a record from its
// own buffer instead of copying it into the write buffer: a large message is
// then not held twice.
const directRecord = 1 << 20

// appendRecord seals rec into the write buffer, rolling to a new segment
// first if it would not fit in the head. A record of directRecord bytes or
// more is sealed in place and written at once, after what the buffer holds:
// rec is the writer's until the call returns (its committer waits, or it is
// the writer's own buffer). keys are the strings of rec's PutSizedString
// keys, which the index may keep, or nil; like rec, they are read only until
// the record is flushed, before its committer is answered.
func (l *Log) appendRecord(rec []byte, keys []string, compaction bool) error {
	head := l.head()
	end := head.size + int64(len(l.w.wbuf))
	if end > headerLen && end+int64(len(rec)) > l.opts.SegmentSize {
		if err := l.roll(); err != nil {
			return err
		}
		head = l.head()
	}
	if len(rec) >= directRecord {
		if err := l.flush(); err != nil {
			return err
		}
		buf := l.w.wbuf
		sealRecord(rec, l.w.nextSeq, l.w.synced, head.salt)
		l.w.nextSeq++
		l.w.wbuf = rec
		l.w.pending = append(l.w.pending, pendingRec{start: 0, end: len(rec), keys: keys, compaction: compaction})
		err := l.flush()
		l.w.wbuf = buf[:0] // never keep rec, which is the committer's
		return err
	}
	start := len(l.w.wbuf)
	l.w.wbuf = append(l.w.wbuf, rec...)
	sealRecord(l.w.wbuf[start:], l.w.nextSeq, l.w.synced, head.salt)
	l.w.nextSeq++
	l.w.pending = append(l.w.pending, pendingRec{start: start, end: len(l.w.wbuf), keys: keys, compaction: compaction})
	return nil
}

// roll writes and syncs the head, deletes dead segments, then starts a new
// segment. Syncing the old
// head first means a crash can only ever tear the last segment.
func (l *Log) roll() error {
	if err := l.flush(); err != nil {
		return err
	}
	if err := l.syncHead(); err != nil {
		return err
	}
	// Everything is synced: a good time to delete dead segments, which keeps
	// the directory small even while one large group spans many segments.
	if err := l.removeDead(); err != nil {
		return err
	}
	seg, err := l.createSegment(l.head().id+1, l.w.nextSeq)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.segs = append(l.segs, seg)
	l.mu.Unlock()
	return nil
}

// flush writes the write buffer to the head with one write and applies its
// records to the index.
func (l *Log) flush() error {
	if len(l.w.wbuf) == 0 {
		return nil
	}
	head := l.head()
	defer func() {
		clear(l.w.pending) // their keys are the committers'
		l.w.pending = l.w.pending[:0]
		if cap(l.w.wbuf) > 2*maxGroupBytes {
			l.w.wbuf = nil // do not keep the memory of one huge batch
		}
		l.w.wbuf = l.w.wbuf[:0]
	}()
	if _, err := head.f.WriteAt(l.w.wbuf, head.size); err != nil {
		return fmt.Errorf("write %s: %w", head.path, err)
	}
	l.w.dirty = true
	l.w.written = l.w.nextSeq - 1
	var commits, compactions uint64
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.w.pending {
		r, err := decodeBody(l.w.wbuf[p.start:p.end], l.w.ops)
		if err != nil {
			return fmt.Errorf("re-decoding a record written to %s: %w", head.path, err) // a bug
		}
		l.w.ops = r.ops
		l.apply(head, head.size+int64(p.start), r.ops, p.keys)
		head.records++
		switch {
		case p.trim:
		case p.compaction:
			compactions++
		default:
			commits++
		}
	}
	head.size += int64(len(l.w.wbuf))
	l.commits.Add(commits)
	l.compactions.Add(compactions)
	return nil
}

// syncHead fdatasyncs the head if it has unsynced writes. A failure fails the
// log: the error is returned (wrapping ErrFailed) and never retried, since a
// failed fdatasync may have dropped the dirty pages it could not write.
func (l *Log) syncHead() error {
	if err := l.failure(); err != nil {
		return err
	}
	if !l.w.dirty {
		return nil
	}
	head := l.head()
	start := time.Now()
	if err := head.f.Datasync(); err != nil {
		return l.fail(fmt.Errorf("fdatasync %s: %w", head.path, err))
	}
	l.w.lastSync = time.Since(start)
	l.syncs.Add(1)
	l.w.dirty = false
	l.w.synced = l.w.written
	return nil
}

// fail puts the log in the failed state, once, and returns the error that
// every later call returns.
func (l *Log) fail(err error) error {
	if f := l.failure(); f != nil {
		return f
	}
	ferr := fmt.Errorf("%w: %w", ErrFailed, err)
	l.failed.Store(&ferr)
	l.log(slog.LevelError, "wal: log failed; Close it and Open it again", slog.String("dir", l.dir), slog.Any("err", err))
	return ferr
}

// finish is the writer's last act: write and sync what is left.
func (l *Log) finish() {
	if l.failure() != nil {
		return
	}
	if err := l.async.take(&l.w.spare, func(rec []byte) error { return l.appendRecord(rec, nil, false) }); err != nil {
		l.fail(err)
		return
	}
	if err := l.flush(); err != nil {
		l.fail(err)
		return
	}
	_ = l.syncHead()
}

// maintain removes the dead oldest segments and does one compaction step. It
// reports whether more work is waiting.
func (l *Log) maintain() bool {
	if l.failure() != nil {
		return false
	}
	if l.removeDead() != nil {
		return false
	}
	if len(l.segs) < 2 || !l.shouldCompact(l.segs[0]) {
		return false
	}
	if err := l.compactStep(); err != nil {
		l.fail(err)
		return false
	}
	return true
}

// removeDead deletes the oldest segments while they hold no live value. It
// skips the work if a Get or Range is reading (the next group retries).
func (l *Log) removeDead() error {
	for len(l.segs) > 1 && l.segs[0].liveKeys == 0 {
		// The log says that the segment went before it goes: Open refuses
		// a log whose oldest segments are missing unless a trim record says
		// that the log removed them.
		if next := l.segs[1].id; l.w.trimmed < next {
			if err := l.appendTrim(next); err != nil {
				return l.fail(err)
			}
		}
		// Whatever made the segment dead, and the trim record, must be
		// durable before it goes.
		if err := l.syncHead(); err != nil {
			return err
		}
		if !l.readers.TryLock() {
			return nil
		}
		err := l.removeOldest()
		l.readers.Unlock()
		if err != nil {
			return l.fail(err)
		}
	}
	return nil
}

// appendTrim writes a trim record saying that the segments below id are
// removed. It goes into the head whatever its size (a few bytes past
// SegmentSize at most): a roll would call removeDead, which calls appendTrim.
func (l *Log) appendTrim(id uint64) error {
	var b Batch
	b.trim(id)
	rec := b.record()
	start := len(l.w.wbuf)
	l.w.wbuf = append(l.w.wbuf, rec...)
	sealRecord(l.w.wbuf[start:], l.w.nextSeq, l.w.synced, l.head().salt)
	l.w.nextSeq++
	l.w.pending = append(l.w.pending, pendingRec{start: start, end: len(l.w.wbuf), trim: true})
	return l.flush()
}

// removeOldest deletes the oldest segment, which holds no live value. Its
// Deletes can only have cancelled Puts in it or in older segments, which are
// gone already. The caller holds readers.
func (l *Log) removeOldest() error {
	s := l.segs[0]
	l.mu.Lock()
	l.segs = slices.Delete(l.segs, 0, 1)
	l.mu.Unlock()
	s.f.Close()
	if err := l.fs.Remove(s.path); err != nil {
		return fmt.Errorf("remove dead segment: %w", err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	l.removed.Add(1)
	if l.w.compactID == s.id {
		l.w.compactID = 0
	}
	return nil
}

// shouldCompact says whether the oldest segment s is worth rewriting: its
// live values take less than a quarter of it and a newer segment than the
// head's predecessor exists (right after a roll, the last messages of the
// segment before the head are often still being acknowledged: rewriting them
// would be wasted), or the directory is more than twice the live data plus
// two segments. Then s is rewritten whatever it holds, since only removing
// the oldest segment frees the dead ones behind it: a backlog in the oldest
// segment must not pin the whole directory.
func (l *Log) shouldCompact(s *segment) bool {
	if s.id == l.w.noCompact || s.liveKeys == 0 {
		return false // a dead segment is removeDead's (which may wait for a reader)
	}
	if s.liveBytes*4 < s.size && len(l.segs) > 2 {
		return true
	}
	var disk int64
	for _, seg := range l.segs {
		disk += seg.size
	}
	// Each segment costs its header and at least one record's framing,
	// which no rewrite saves: with tiny segments, counting it keeps an idle
	// log from being rewritten forever.
	overhead := int64(len(l.segs)) * (headerLen + recPrefixLen)
	return disk > 2*l.liveBytes+2*l.opts.SegmentSize+overhead
}

// compactStep reads up to a budget of records of the oldest segment and
// rewrites its live Puts into the head as one record, so that the segment
// dies. It runs in the writer, between groups, so no Commit can slip between
// reading a live value and rewriting it.
func (l *Log) compactStep() error {
	s := l.segs[0]
	if l.w.compactID != s.id {
		l.w.compactID, l.w.compactOff = s.id, headerLen
	}
	budget := min(max(l.opts.SegmentSize/4, 64<<10), 1<<20)
	b := &l.w.cbatch
	b.Reset()
	// One read of up to budget bytes, decoded record by record: a record cut
	// by the end of the chunk is left for the next step, and one larger than
	// the chunk is read on its own.
	chunk := min(budget, s.size-l.w.compactOff)
	if int64(cap(l.w.rbuf)) < chunk {
		l.w.rbuf = make([]byte, chunk)
	}
	buf := l.w.rbuf[:chunk]
	if err := readFull(s.f, buf, l.w.compactOff); err != nil {
		return fmt.Errorf("compaction: read %s at offset %d: %w", s.path, l.w.compactOff, err)
	}
	pos := 0
	for pos < len(buf) {
		recOff := l.w.compactOff + int64(pos)
		rec, n, err := decodeRecord(buf[pos:], s.salt, l.w.ops)
		if errors.Is(err, errShort) {
			if pos > 0 {
				break // the rest of it in the next step
			}
			_, rec, n, err = readRecord(s.f, recOff, s.size, s.salt, nil, l.w.ops)
		}
		if err != nil {
			if ioErr := (*ioError)(nil); errors.As(err, &ioErr) {
				err = ioErr.err
			}
			return fmt.Errorf("compaction: read %s at offset %d: %w", s.path, recOff, err)
		}
		l.w.ops = rec.ops
		for _, o := range rec.ops {
			if o.kind != opPut {
				continue
			}
			lc, ok := l.index[string(o.key)]
			if ok && lc.seg == s.id && int64(lc.off) == recOff+int64(o.valOff) {
				b.Put(o.key, o.val) // copies: rec aliases buf
			}
		}
		pos += n
	}
	l.w.compactOff += int64(pos)
	if b.Len() > 0 {
		if err := l.appendRecord(b.record(), nil, true); err != nil {
			return err
		}
		if err := l.flush(); err != nil {
			return err
		}
	}
	if l.w.compactOff >= s.size && s.liveKeys > 0 {
		// Cannot happen unless the live accounting is wrong; do not loop on it.
		l.log(slog.LevelError, "wal: compaction left live keys in a segment; not compacting it again",
			slog.String("file", s.path), slog.Int("live_keys", s.liveKeys))
		l.w.noCompact = s.id
	}
	if cap(b.buf) > 2*maxGroupBytes {
		*b = Batch{}
	}
	return nil
}
