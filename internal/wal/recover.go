package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// recover replays the segments of l.dir into l.index and l.segs, cutting a
// torn tail, and refusing (or, with Repair, cutting) any other damage. It
// leaves a head segment open for writing.
func (l *Log) recover() error {
	names, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	var ids []uint64
	taken := make(map[string]bool, len(names))
	for _, n := range names {
		taken[n] = true
		if id, ok := parseSegName(n); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)

	r := recoverer{l: l, ids: ids, taken: taken}
	nextSeq := uint64(1)
	nextID := uint64(1)
	if len(ids) > 0 {
		nextID = ids[len(ids)-1] + 1
	}
	for i, id := range ids {
		if i > 0 && id != ids[i-1]+1 {
			if err := r.corrupt(i, nil, 0, fmt.Sprintf("segment %s is missing", segName(ids[i-1]+1))); err != nil {
				return err
			}
			break
		}
		stop, err := r.replay(i, i == len(ids)-1, &nextSeq)
		if err != nil {
			return err
		}
		if stop {
			break
		}
	}
	// Nothing is changed (but by Repair) until the log is known acceptable.
	if err := r.checkOldest(); err != nil {
		return err
	}
	if l.readOnly { // OpenReadOnly: report what Open would cut, change nothing
		if r.torn != nil {
			r.report(r.torn.Cut)
		}
		return nil
	}
	if err := r.cutTorn(); err != nil {
		return err
	}
	if len(l.segs) == 0 {
		seg, err := l.createSegment(nextID, nextSeq)
		if err != nil {
			return err
		}
		l.segs = append(l.segs, seg)
	}
	if r.retrim {
		return r.writeTrim()
	}
	return nil
}

// recoverer holds what recover needs to cut and report.
type recoverer struct {
	l     *Log
	ids   []uint64
	taken map[string]bool // names in the directory
	rbuf  []byte
	ops   []op

	torn   *tornCut // the torn tail to cut, found by replay
	retrim bool     // Repair accepted missing oldest segments: write a trim record

	// The segment being replayed is read ahead in windows of replayChunk
	// bytes: win holds the bytes of winF from winOff.
	win    []byte
	winF   file
	winOff int64
}

func (r *recoverer) path(i int) string { return filepath.Join(r.l.dir, segName(r.ids[i])) }

// replay replays segment ids[i] and appends it to l.segs unless nothing of
// it is kept. It returns stop when the segments after it are not to be
// replayed (a repair cut them).
func (r *recoverer) replay(i int, last bool, nextSeq *uint64) (stop bool, err error) {
	l := r.l
	path := r.path(i)
	f, err := l.fs.OpenFile(path, os.O_RDWR)
	if err != nil {
		return false, fmt.Errorf("wal: %w", err)
	}
	size, err := f.Size()
	if err != nil {
		f.Close()
		return false, fmt.Errorf("wal: %w", err)
	}
	if size > maxSegmentFile { // no Log writes one: the index's offsets would not hold
		f.Close()
		return false, fmt.Errorf("wal: %s: %d bytes, more than a segment can hold (%d)", path, size, int64(maxSegmentFile))
	}
	hb := make([]byte, headerLen)
	n, rerr := f.ReadAt(hb, 0)
	if rerr != nil && n < headerLen && int64(n) < size {
		f.Close()
		return false, fmt.Errorf("wal: read %s: %w", path, rerr)
	}
	h, herr := decodeHeader(hb[:n])
	unreadable := herr != nil
	if herr == nil && h.id != r.ids[i] {
		herr = fmt.Errorf("%w: it names segment %d", errHeader, h.id)
	}
	if herr == nil && len(l.segs) > 0 && h.firstSeq != *nextSeq {
		herr = fmt.Errorf("%w: first record %d, want %d", errSeq, h.firstSeq, *nextSeq)
	}
	if herr != nil {
		f.Close()
		if last && size <= headerLen && unreadable {
			// A crash while the segment was being created: no record can be in
			// it, since records are written only after its header is synced.
			// A whole header that names another segment or seq is no crash's:
			// it says what the segments before it held.
			r.torn = &tornCut{Cut: Cut{File: path, Bytes: size, Torn: true, Reason: herr.Error()}}
			return true, nil
		}
		return true, r.corrupt(i, nil, 0, herr.Error())
	}

	seg := &segment{segHeader: h, path: path, f: f, size: headerLen}
	l.segs = append(l.segs, seg) // from here on f is closed with l.segs
	l.recovery.Segments++
	seq := h.firstSeq
	defer func() { *nextSeq = seq }()
	for off := int64(headerLen); off < size; {
		rec, n, err := r.read(f, off, size, h.salt)
		if err == nil && rec.seq != seq {
			err = fmt.Errorf("%w: seq %d, want %d", errSeq, rec.seq, seq)
		}
		if err != nil {
			if ioErr := (*ioError)(nil); errors.As(err, &ioErr) {
				return false, fmt.Errorf("wal: read %s: %w", path, ioErr.err)
			}
			if last {
				found, synced, lerr := r.laterRecords(f, off, size, h.salt, seq)
				if lerr != nil {
					return false, fmt.Errorf("wal: read %s: %w", path, lerr)
				}
				if !synced {
					reason := err.Error()
					if found > 0 {
						reason += fmt.Sprintf(" (and %d later records of the same unsynced write)", found)
					}
					r.torn = &tornCut{Cut: Cut{File: path, Offset: off, Bytes: size - off, Torn: true, Reason: reason}, seg: seg}
					return false, nil
				}
				err = fmt.Errorf("%w, and a later record shows it had been synced", err)
			}
			return true, r.corrupt(i, f, off, err.Error())
		}
		l.apply(seg, off, rec.ops, nil)
		seg.records++
		l.recovery.Records++
		seq++
		off += int64(n)
		seg.size = off
	}
	return false, nil
}

// tornCut is a torn tail that the replay found, cut by cutTorn once the
// whole log is known to be acceptable.
type tornCut struct {
	Cut
	seg *segment // the last segment, cut at Offset; nil: remove File, a torn creation
}

// cutTorn cuts the torn tail found by the replay, if any: it truncates the
// last segment, or removes a last segment whose creation a crash interrupted.
// It runs after every check, so that an Open that refuses the log has
// changed nothing.
func (r *recoverer) cutTorn() error {
	c := r.torn
	if c == nil {
		return nil
	}
	l := r.l
	if c.seg == nil {
		if err := l.fs.Remove(c.File); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
	} else {
		if err := c.seg.f.Truncate(c.Offset); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		if err := c.seg.f.Datasync(); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		l.syncs.Add(1)
	}
	r.report(c.Cut)
	return nil
}

// checkOldest refuses a log whose oldest segments are missing, or with
// Repair reports them and has Open write a trim record (see retrim). The log
// removes a segment only after a trim record naming the next one is synced
// (see Log.removeDead), so the oldest segment left must be one a trim record
// allows, or, if none does, the log's first (its first record is record 1).
// A version 1 segment was written before trim records existed: with no trim
// record yet, such a log cannot tell a segment it removed from one that went
// missing, and is taken as it is (as the log's earlier versions did), until
// the log's own removals give it trim records.
func (r *recoverer) checkOldest() error {
	l := r.l
	if len(l.segs) == 0 {
		return nil
	}
	s, t := l.segs[0], l.w.trimmed
	if (t == 0 && (s.firstSeq == 1 || s.version == 1)) || (t > 0 && s.id <= t) {
		return nil
	}
	reason := fmt.Sprintf("the segments before it are missing: its first record is %d, and no record says the log removed them", s.firstSeq)
	if t > 0 {
		reason = fmt.Sprintf("segments %s to %s are missing: the log removed only those before %s",
			segName(t), segName(s.id-1), segName(t))
	}
	if !l.opts.Repair {
		return &CorruptError{File: s.path, Offset: 0, Reason: reason}
	}
	r.report(Cut{File: filepath.Join(l.dir, segName(s.id-1)), Reason: reason})
	r.retrim = true
	return nil
}

// writeTrim appends to the head a trim record that allows the oldest
// segment, after a repair that accepted missing segments before it, so that
// the next Open does not refuse the repaired log. Its synced watermark is 0
// (it claims nothing); Open syncs it with the replayed log.
func (r *recoverer) writeTrim() error {
	l := r.l
	head, id := l.head(), l.segs[0].id
	var b Batch
	b.trim(id)
	rec := b.record()
	sealRecord(rec, head.firstSeq+head.records, 0, head.salt)
	if _, err := head.f.WriteAt(rec, head.size); err != nil {
		return fmt.Errorf("wal: write %s: %w", head.path, err)
	}
	head.size += int64(len(rec))
	head.records++
	l.w.trimmed = max(l.w.trimmed, id)
	return nil
}

// ioError marks a read error of the file system, as opposed to bad bytes.
type ioError struct{ err error }

func (e *ioError) Error() string { return e.err.Error() }

// replayChunk is how much of a segment the replay reads at once.
const replayChunk = 1 << 20

// read reads and decodes the record at off of a file of the given size. It
// decodes from a window read ahead (one read per replayChunk rather than two
// per record); a record that the window cannot hold, or that fails to decode
// from it, is read on its own by readRecord, which says why.
func (r *recoverer) read(f file, off, size int64, salt uint32) (record, int, error) {
	if rec, n, ok := r.readWindow(f, off, size, salt); ok {
		return rec, n, nil
	}
	var err error
	var rec record
	var n int
	r.rbuf, rec, n, err = readRecord(f, off, size, salt, r.rbuf, r.ops)
	r.ops = rec.ops
	return rec, n, err
}

// readWindow decodes the record at off from the window, reading the window
// again from off when it does not hold the record. It reports false when the
// record does not decode from a window (too large, damaged, or a read error).
func (r *recoverer) readWindow(f file, off, size int64, salt uint32) (record, int, bool) {
	for refilled := false; ; refilled = true {
		if f == r.winF && off >= r.winOff && off < r.winOff+int64(len(r.win)) {
			rec, n, err := decodeRecord(r.win[off-r.winOff:], salt, r.ops)
			if err == nil {
				r.ops = rec.ops
				return rec, n, true
			}
			if !errors.Is(err, errShort) || r.winOff+int64(len(r.win)) >= size {
				return record{}, 0, false
			}
		}
		if refilled || size-off < recHeaderLen {
			return record{}, 0, false
		}
		if r.win == nil {
			r.win = make([]byte, replayChunk)
		}
		m := min(int64(replayChunk), size-off)
		r.winF, r.winOff, r.win = nil, off, r.win[:m]
		if err := readFull(f, r.win, off); err != nil {
			return record{}, 0, false
		}
		r.winF = f
	}
}

// readRecord reads the record at off of f (whose valid size is size) into buf,
// which it grows as needed and returns. I/O errors come as *ioError.
func readRecord(f file, off, size int64, salt uint32, buf []byte, ops []op) ([]byte, record, int, error) {
	if size-off < recHeaderLen {
		return buf, record{}, 0, errShort
	}
	var hdr [recHeaderLen]byte
	if err := readFull(f, hdr[:], off); err != nil {
		return buf, record{}, 0, &ioError{err}
	}
	n := int64(binary.LittleEndian.Uint32(hdr[:]))
	if n < minBodyLen || n > maxBodyLen {
		return buf, record{}, 0, errLength
	}
	if n > size-off-recHeaderLen {
		return buf, record{}, 0, errShort
	}
	total := int(n) + recHeaderLen
	if cap(buf) < total {
		buf = make([]byte, total)
	}
	buf = buf[:total]
	if err := readFull(f, buf, off); err != nil {
		return buf, record{}, 0, &ioError{err}
	}
	rec, m, err := decodeRecord(buf, salt, ops)
	return buf, rec, m, err
}

// laterRecords looks for valid records of this log (right salt, seq above
// the bad record's seq) anywhere in (off, size) of f, the part after a bad
// record at off whose seq would have been seq. It reports how many it found,
// and whether one of them says that the bad record had been synced before it
// was written (its synced watermark is at least seq): then the bad record is
// corruption of synced data. Otherwise the bad record and everything after it
// were written after the last sync, as one unsynced write whose pages a crash
// may have persisted out of order: a torn tail. It looks at the first bytes
// of each position and verifies the CRC only where the length, seq and
// watermark are plausible, so garbage is scanned in linear time.
func (r *recoverer) laterRecords(f file, off, size int64, salt uint32, seq uint64) (found int, synced bool, err error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk+recPrefixLen)
	for base := off + 1; base+recPrefixLen <= size; base += chunk {
		m := min(int64(len(buf)), size-base)
		if err := readFull(f, buf[:m], base); err != nil {
			return 0, false, err
		}
		for j := int64(0); j < chunk && j+recPrefixLen <= m; j++ {
			p := base + j
			b := buf[j:]
			n := int64(binary.LittleEndian.Uint32(b))
			if n < minBodyLen || n > size-p-recHeaderLen {
				continue
			}
			s := binary.LittleEndian.Uint64(b[recHeaderLen:])
			w := binary.LittleEndian.Uint64(b[recHeaderLen+8:])
			if s <= seq || s-seq > uint64(size-off)/recPrefixLen || w >= s {
				continue
			}
			_, rec, _, err := readRecord(f, p, size, salt, nil, nil)
			if ioErr := (*ioError)(nil); errors.As(err, &ioErr) {
				return 0, false, ioErr.err
			}
			if err != nil {
				continue
			}
			found++
			if rec.synced >= seq {
				return found, true, nil
			}
		}
	}
	return found, false, nil
}

// corrupt handles damage at off of segment ids[i] (f is open on it, or nil):
// without Repair it returns a *CorruptError; with Repair it cuts the log
// there, keeping copies of what it cuts, and returns nil.
func (r *recoverer) corrupt(i int, f file, off int64, reason string) error {
	l := r.l
	path := r.path(i)
	if !l.opts.Repair {
		return &CorruptError{File: path, Offset: off, Reason: reason}
	}
	if l.readOnly {
		r.reportLeftOut(i, f, off, reason)
		return nil
	}
	if off > 0 {
		size, err := f.Size()
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		saved := r.freeName(segName(r.ids[i]) + ".corrupt-" + strconv.FormatInt(off, 10))
		if err := r.copyOut(f, off, size, saved); err != nil {
			return err
		}
		if err := f.Truncate(off); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		if err := f.Datasync(); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		l.syncs.Add(1)
		r.report(Cut{File: path, Offset: off, Bytes: size - off, SavedAs: saved, Reason: reason})
		i++
	}
	for ; i < len(r.ids); i++ {
		p := r.path(i)
		saved := r.freeName(segName(r.ids[i]) + ".corrupt-0")
		var size int64
		if st, err := os.Lstat(p); err == nil {
			size = st.Size()
		}
		if err := l.fs.Rename(p, saved); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		why := "after the cut"
		if p == path {
			why = reason
		}
		r.report(Cut{File: p, Bytes: size, SavedAs: saved, Reason: why})
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	return nil
}

// copyOut copies [off, size) of f to a new file at path, synced.
func (r *recoverer) copyOut(f file, off, size int64, path string) error {
	out, err := r.l.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	buf := make([]byte, 1<<20)
	for pos := off; pos < size; {
		m := min(int64(len(buf)), size-pos)
		if err := readFull(f, buf[:m], pos); err != nil {
			out.Close()
			return fmt.Errorf("wal: %w", err)
		}
		if _, err := out.WriteAt(buf[:m], pos-off); err != nil {
			out.Close()
			return fmt.Errorf("wal: %w", err)
		}
		pos += m
	}
	err = out.Datasync()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	return nil
}

// freeName returns the path of name in the directory, or of name.N for the
// first N that is free.
func (r *recoverer) freeName(name string) string {
	n := name
	for k := 1; r.taken[n]; k++ {
		n = name + "." + strconv.Itoa(k)
	}
	r.taken[n] = true
	return filepath.Join(r.l.dir, n)
}

func (r *recoverer) report(c Cut) {
	r.l.recovery.Cuts = append(r.l.recovery.Cuts, c)
	r.l.log(slog.LevelWarn, "wal: cut log", slog.String("file", c.File), slog.Int64("offset", c.Offset),
		slog.Int64("bytes", c.Bytes), slog.Bool("torn", c.Torn), slog.String("saved_as", c.SavedAs),
		slog.String("reason", c.Reason))
}

// apply applies the ops of the record at recOff of seg to the index and the
// live accounting. The caller holds mu, or is Open before the writer starts.
// keys are strings of the record's Put keys, in order (see
// Batch.PutSizedString): a Put whose key is the next of them is indexed by
// that string, not by a copy. They are checked, never trusted: a key that
// differs is copied as without them.
func (l *Log) apply(seg *segment, recOff int64, ops []op, keys []string) {
	for _, o := range ops {
		if o.kind == opTrim {
			l.w.trimmed = max(l.w.trimmed, o.seg)
			continue
		}
		if old, ok := l.index[string(o.key)]; ok {
			s := l.segByID(old.seg)
			c := opCost(len(o.key), int(old.vlen))
			s.liveKeys--
			s.liveBytes -= c
			l.liveBytes -= c
		}
		if o.kind == opDelete {
			delete(l.index, string(o.key))
			continue
		}
		c := o.cost()
		lc := loc{seg: seg.id, off: uint32(recOff + int64(o.valOff)), vlen: uint32(len(o.val))}
		if len(keys) > 0 && keys[0] == string(o.key) {
			l.index[keys[0]] = lc
			keys = keys[1:]
		} else {
			l.index[string(o.key)] = lc
		}
		seg.liveKeys++
		seg.liveBytes += c
		l.liveBytes += c
	}
}

// createSegment creates segment id, whose first record will be firstSeq,
// writes and syncs its header, and syncs the directory.
func (l *Log) createSegment(id, firstSeq uint64) (*segment, error) {
	path := filepath.Join(l.dir, segName(id))
	f, err := l.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	h := segHeader{id: id, firstSeq: firstSeq, salt: rand.Uint32()}
	if _, err := f.WriteAt(h.encode(), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: write %s: %w", path, err)
	}
	if err := f.Datasync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: fdatasync %s: %w", path, err)
	}
	l.syncs.Add(1)
	if err := l.fs.SyncDir(l.dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: sync directory: %w", err)
	}
	return &segment{segHeader: h, path: path, f: f, size: headerLen}, nil
}
