package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// builtLog is a small closed log of several segments, with the live state
// after each batch and the position of each record.
type builtLog struct {
	names  []string            // segment file names, in order
	data   [][]byte            // their contents
	starts [][]int64           // record start offsets per file
	ends   [][]int64           // record end offsets per file
	states []map[string]string // states[i]: the live state after i batches
}

// records returns the number of records in the log.
func (bl *builtLog) records() int {
	n := 0
	for _, e := range bl.ends {
		n += len(e)
	}
	return n
}

func buildLog(t *testing.T) *builtLog {
	t.Helper()
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 400}, nil)
	model := map[string]string{}
	bl := &builtLog{states: []map[string]string{{}}}
	for i := range 16 {
		var b Batch
		put := func(k, v string) { b.Put([]byte(k), []byte(v)); model[k] = v }
		put(fmt.Sprintf("keep%02d", i), fmt.Sprintf("value %d %s", i, strings.Repeat("x", i*2)))
		if i%3 == 2 && i > 8 { // only in the later segments, or compaction starts
			k := fmt.Sprintf("keep%02d", i-2)
			b.Delete([]byte(k))
			delete(model, k)
		}
		if i%4 == 1 && i > 8 {
			put("hot", fmt.Sprint("hot", i))
			put("hot", fmt.Sprint("hotter", i)) // the later Put of a batch wins
		}
		require.NoError(t, l.Commit(&b))
		bl.states = append(bl.states, maps.Clone(model))
	}
	st := l.Stats()
	require.NoError(t, l.Close())
	require.Zero(t, st.Compactions, "the test needs every record to be a batch")
	require.Zero(t, st.SegmentsRemoved)
	require.GreaterOrEqual(t, st.Segments, 3)

	names, err := osFS{}.ReadDir(dir)
	require.NoError(t, err)
	for _, n := range names {
		if _, ok := parseSegName(n); !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		var starts, ends []int64
		for off := int64(headerLen); off < int64(len(data)); {
			starts = append(starts, off)
			off += recHeaderLen + int64(binary.LittleEndian.Uint32(data[off:]))
			ends = append(ends, off)
		}
		bl.names = append(bl.names, n)
		bl.data = append(bl.data, data)
		bl.starts = append(bl.starts, starts)
		bl.ends = append(bl.ends, ends)
	}
	require.Equal(t, len(bl.states)-1, bl.records())
	var size int
	for _, d := range bl.data {
		size += len(d)
	}
	t.Logf("log of %d segments, %d records, %d bytes", len(bl.names), bl.records(), size)
	return bl
}

// write replaces the contents of dir with the files of the log.
func writeFiles(t *testing.T, dir string, names []string, data [][]byte) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		require.NoError(t, os.Remove(filepath.Join(dir, e.Name())))
	}
	for i, n := range names {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), data[i], 0o644))
	}
}

// TestTruncateEveryOffset cuts the log after every byte: Open must recover
// exactly the batches complete in that prefix, and never fail.
func TestTruncateEveryOffset(t *testing.T) {
	bl := buildLog(t)
	work := t.TempDir()
	var total int64
	for _, d := range bl.data {
		total += int64(len(d))
	}
	for p := int64(0); p <= total; p++ {
		// The prefix: whole files, then the file p falls in, cut.
		var names []string
		var data [][]byte
		complete := 0 // records complete in the prefix
		rest := p
		cutExpected := false
		for i, d := range bl.data {
			n := min(rest, int64(len(d)))
			names = append(names, bl.names[i])
			data = append(data, d[:n])
			for _, e := range bl.ends[i] {
				if e <= n {
					complete++
				}
			}
			if n < int64(len(d)) {
				cutExpected = n < headerLen || !isBoundary(bl.ends[i], n)
				break
			}
			rest -= n
			if rest == 0 {
				break
			}
		}
		writeFiles(t, work, names, data)
		l, err := open(work, Options{}, &faultFS{noSync: true})
		require.NoError(t, err, "prefix of %d bytes", p)
		assert.Equal(t, bl.states[complete], contents(t, l), "prefix of %d bytes", p)
		cuts := l.Recovery().Cuts
		if cutExpected {
			if assert.Len(t, cuts, 1, "prefix of %d bytes", p) {
				assert.True(t, cuts[0].Torn)
			}
		} else {
			assert.Empty(t, cuts, "prefix of %d bytes", p)
		}
		if p%5 == 0 {
			// The log goes on from the cut.
			commit(t, l, fmt.Sprintf("after=%d", p))
			require.NoError(t, l.Close())
			l, err = open(work, Options{}, &faultFS{noSync: true})
			require.NoError(t, err)
			want := maps.Clone(bl.states[complete])
			want["after"] = fmt.Sprint(p)
			assert.Equal(t, want, contents(t, l), "prefix of %d bytes, then a commit", p)
			assert.Empty(t, l.Recovery().Cuts)
		}
		require.NoError(t, l.Close())
	}
}

func isBoundary(ends []int64, n int64) bool {
	if n == headerLen {
		return true
	}
	for _, e := range ends {
		if e == n {
			return true
		}
	}
	return false
}

// TestFlipEveryByte flips every byte of the log, one at a time: Open must
// report corruption at the right record, or cut the last record when the flip
// is in it, and never return a wrong value.
func TestFlipEveryByte(t *testing.T) {
	bl := buildLog(t)
	work := t.TempDir()
	last := len(bl.data) - 1
	n := bl.records()
	for fi, d := range bl.data {
		for off := range d {
			for _, mask := range []byte{0xff, 0x01} {
				data := make([][]byte, len(bl.data))
				copy(data, bl.data)
				data[fi] = append([]byte(nil), d...)
				data[fi][off] ^= mask
				writeFiles(t, work, bl.names, data)

				var recStart int64 // 0: the header
				lastRecord := false
				for r, s := range bl.starts[fi] {
					if int64(off) >= s {
						recStart = s
						lastRecord = r == len(bl.starts[fi])-1
					}
				}
				where := fmt.Sprintf("file %d offset %d mask %#x", fi, off, mask)

				l, err := open(work, Options{}, &faultFS{noSync: true})
				if fi == last && lastRecord {
					require.NoError(t, err, where)
					assert.Equal(t, bl.states[n-1], contents(t, l), where)
					cuts := l.Recovery().Cuts
					if assert.Len(t, cuts, 1, where) {
						assert.True(t, cuts[0].Torn, where)
						assert.Equal(t, recStart, cuts[0].Offset, where)
					}
					require.NoError(t, l.Close())
					continue
				}
				if err == nil {
					l.Close()
					t.Fatalf("%s: flip not detected", where)
				}
				require.ErrorIs(t, err, ErrCorrupt, where)
				var ce *CorruptError
				require.True(t, errors.As(err, &ce), where)
				assert.Equal(t, filepath.Join(work, bl.names[fi]), ce.File, where)
				assert.Equal(t, recStart, ce.Offset, where)
			}
		}
	}
}

func TestRepair(t *testing.T) {
	bl := buildLog(t)
	dir := t.TempDir()
	// Damage the second record of the first segment.
	data := make([][]byte, len(bl.data))
	copy(data, bl.data)
	data[0] = append([]byte(nil), bl.data[0]...)
	bad := bl.starts[0][1]
	data[0][bad+10] ^= 0x40
	writeFiles(t, dir, bl.names, data)

	_, err := Open(dir, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, bad, ce.Offset)
	assert.Contains(t, err.Error(), bl.names[0])
	assert.Contains(t, err.Error(), fmt.Sprint(bad))

	l, err := Open(dir, Options{Repair: true})
	require.NoError(t, err)
	assert.Equal(t, bl.states[1], contents(t, l), "the valid prefix: one batch")
	cuts := l.Recovery().Cuts
	require.Len(t, cuts, len(bl.names))
	assert.Equal(t, bad, cuts[0].Offset)
	assert.False(t, cuts[0].Torn)
	saved, err := os.ReadFile(cuts[0].SavedAs)
	require.NoError(t, err)
	assert.Equal(t, data[0][bad:], saved, "the cut bytes are kept")
	assert.Equal(t, filepath.Join(dir, bl.names[0]+".corrupt-"+fmt.Sprint(bad)), cuts[0].SavedAs)
	for i, c := range cuts[1:] {
		assert.Equal(t, int64(0), c.Offset)
		saved, err := os.ReadFile(c.SavedAs)
		require.NoError(t, err)
		assert.Equal(t, bl.data[i+1], saved, "later segments are moved aside whole")
	}
	commit(t, l, "new=1")
	require.NoError(t, l.Close())

	l, err = Open(dir, Options{})
	require.NoError(t, err, "a repaired log opens without Repair")
	want := maps.Clone(bl.states[1])
	want["new"] = "1"
	assert.Equal(t, want, contents(t, l))
	assert.Empty(t, l.Recovery().Cuts)
	require.NoError(t, l.Close())

	// Repairing the same damage again does not overwrite the first copy.
	writeFiles(t, dir, append(bl.names, bl.names[0]+".corrupt-"+fmt.Sprint(bad)), append(data, []byte("old copy")))
	l, err = Open(dir, Options{Repair: true})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, bl.names[0]+".corrupt-"+fmt.Sprint(bad)+".1"), l.Recovery().Cuts[0].SavedAs)
	require.NoError(t, l.Close())
}

func TestMissingSegment(t *testing.T) {
	bl := buildLog(t)
	dir := t.TempDir()
	writeFiles(t, dir, bl.names, bl.data)
	require.NoError(t, os.Remove(filepath.Join(dir, bl.names[1])))
	_, err := Open(dir, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, filepath.Join(dir, bl.names[2]), ce.File)
	assert.Contains(t, ce.Reason, "missing")

	l, err := Open(dir, Options{Repair: true})
	require.NoError(t, err)
	assert.Equal(t, bl.states[len(bl.ends[0])], contents(t, l))
	require.NoError(t, l.Close())
}

// TestCorruptHeader: a damaged header of the last segment is corruption when
// records follow it, a torn creation when the file is no longer than a header.
func TestCorruptHeader(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	commit(t, l, "a=1")
	require.NoError(t, l.Close())
	path := filepath.Join(dir, segName(1))
	data, err := os.ReadFile(path)
	require.NoError(t, err)

	// A header full of zeros, as a crash may leave an extended file.
	next := filepath.Join(dir, segName(2))
	require.NoError(t, os.WriteFile(next, make([]byte, headerLen), 0o644))
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, map[string]string{"a": "1"}, contents(t, l))
	require.Len(t, l.Recovery().Cuts, 1)
	assert.True(t, l.Recovery().Cuts[0].Torn)
	require.NoError(t, l.Close())

	bad := append([]byte(nil), data...)
	bad[3] ^= 1
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	_, err = Open(dir, Options{})
	assert.ErrorIs(t, err, ErrCorrupt)
}

// TestTornTailWithGarbage: zeros or random bytes after the last record are a
// torn tail, even a lot of them.
func TestTornTailGarbage(t *testing.T) {
	for _, tail := range [][]byte{make([]byte, 200_000), []byte(strings.Repeat("\xde\xad\xbe\xef", 50_000))} {
		dir := t.TempDir()
		l := openT(t, dir, Options{}, nil)
		commit(t, l, "a=1")
		require.NoError(t, l.Close())
		path := filepath.Join(dir, segName(1))
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		_, err = f.Write(tail)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		l = openT(t, dir, Options{}, nil)
		assert.Equal(t, map[string]string{"a": "1"}, contents(t, l))
		require.Len(t, l.Recovery().Cuts, 1)
		assert.Equal(t, int64(len(tail)), l.Recovery().Cuts[0].Bytes)
	}
}

// TestEmbeddedRecord: a value that holds a copy of a record of the log does
// not make a torn tail look like corruption.
func TestEmbeddedRecord(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	commit(t, l, "a=1")
	require.NoError(t, l.Close())
	path := filepath.Join(dir, segName(1))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	rec := data[headerLen:] // the record of batch 1

	l = openT(t, dir, Options{}, nil)
	var b Batch
	b.Put([]byte("copy"), rec)
	require.NoError(t, l.Commit(&b))
	require.NoError(t, l.Close())
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data[:len(data)-1], 0o644)) // tear the last record
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, map[string]string{"a": "1"}, contents(t, l))
	require.Len(t, l.Recovery().Cuts, 1)
	assert.True(t, l.Recovery().Cuts[0].Torn)
}

// TestUnsyncedWriteHole: a crash may persist the pages of an unsynced write
// out of order, leaving a bad record with valid ones after it. If none of
// those says the bad record had been synced, it is a torn tail; if one does,
// it is corruption.
func TestUnsyncedWriteHole(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{Sync: SyncInterval(time.Hour)}, nil)
	commit(t, l, "a=1")
	require.NoError(t, l.Sync())
	commit(t, l, "b=2") // b, c, d: written after the last sync
	commit(t, l, "c=3")
	commit(t, l, "d=4")
	require.NoError(t, l.Close())
	path := filepath.Join(dir, segName(1))
	orig, err := os.ReadFile(path)
	require.NoError(t, err)
	var starts []int64
	for off := int64(headerLen); off < int64(len(orig)); off += recHeaderLen + int64(binary.LittleEndian.Uint32(orig[off:])) {
		starts = append(starts, off)
	}
	require.Len(t, starts, 4)

	// A lost page in b: a torn tail, with c and d cut too.
	data := bytes.Clone(orig)
	clear(data[starts[1]+4 : starts[2]])
	require.NoError(t, os.WriteFile(path, data, 0o644))
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, map[string]string{"a": "1"}, contents(t, l))
	cuts := l.Recovery().Cuts
	require.Len(t, cuts, 1)
	assert.True(t, cuts[0].Torn)
	assert.Equal(t, starts[1], cuts[0].Offset)
	assert.Contains(t, cuts[0].Reason, "2 later records")
	require.NoError(t, l.Close())

	// A bad a: b was written after a was synced, so a's damage is corruption.
	data = bytes.Clone(orig)
	data[starts[0]+10] ^= 1
	require.NoError(t, os.WriteFile(path, data, 0o644))
	_, err = Open(dir, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, starts[0], ce.Offset)
	assert.Contains(t, ce.Reason, "synced")
}

// churnRemoving commits to l, with tiny segments, until the log has removed
// at least n dead segments, and returns the live state.
func churnRemoving(t *testing.T, l *Log, n uint64) map[string]string {
	t.Helper()
	want := map[string]string{"keep": "k"}
	commit(t, l, "keep=k")
	for i := 0; l.Stats().SegmentsRemoved < n; i++ {
		require.Less(t, i, 10_000, "the log removed no segment")
		k := fmt.Sprint("churn", i%3)
		v := fmt.Sprintf("%d%s", i, strings.Repeat("x", 60))
		commit(t, l, k+"="+v)
		want[k] = v
	}
	return want
}

// TestRemovedSegmentsAreNotMissing: the segments the log removed itself,
// even across a power loss, do not make Open refuse the log, while an oldest
// segment deleted behind its back does.
func TestRemovedSegmentsAreNotMissing(t *testing.T) {
	var synced syncedSizes
	dir := t.TempDir()
	opts := Options{SegmentSize: 256, Faults: synced.faults()}
	l, err := Open(dir, opts)
	require.NoError(t, err)
	want := churnRemoving(t, l, 5)
	lost := synced.powerLoss(t, dir)
	require.NoError(t, l.Close())

	for _, d := range []string{dir, lost} {
		l, err = Open(d, Options{SegmentSize: 256})
		require.NoError(t, err, "the log removed its oldest segments itself")
		assert.Equal(t, want, contents(t, l))
		require.NoError(t, l.Close())
	}

	names, err := osFS{}.ReadDir(dir)
	require.NoError(t, err)
	var ids []uint64
	for _, n := range names {
		if id, ok := parseSegName(n); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	require.Greater(t, ids[0], uint64(1))
	require.GreaterOrEqual(t, len(ids), 2)
	require.NoError(t, os.Remove(filepath.Join(dir, segName(ids[0]))))
	_, err = Open(dir, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce, "an oldest segment deleted behind the log's back")
	assert.Equal(t, filepath.Join(dir, segName(ids[1])), ce.File)
	assert.Contains(t, ce.Reason, "missing")
}

// TestMissingOldestSegment: a log whose first segment is gone (its second
// segment starts after record 1, and no record says the log removed it) is
// corrupt; Repair opens what is left, and the repaired log opens without
// Repair.
func TestMissingOldestSegment(t *testing.T) {
	bl := buildLog(t)
	dir := t.TempDir()
	writeFiles(t, dir, bl.names[1:], bl.data[1:])
	_, err := Open(dir, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, filepath.Join(dir, bl.names[1]), ce.File)
	assert.Contains(t, ce.Reason, "missing")
	assert.Equal(t, bl.data[1:], func() [][]byte {
		var d [][]byte
		for _, n := range bl.names[1:] {
			b, err := os.ReadFile(filepath.Join(dir, n))
			require.NoError(t, err)
			d = append(d, b)
		}
		return d
	}(), "the refused Open changed nothing")

	l, err := Open(dir, Options{Repair: true})
	require.NoError(t, err)
	cuts := l.Recovery().Cuts
	require.Len(t, cuts, 1)
	assert.False(t, cuts[0].Torn)
	assert.Equal(t, filepath.Join(dir, bl.names[0]), cuts[0].File)
	got := contents(t, l)
	assert.Equal(t, bl.states[len(bl.states)-1]["hot"], got["hot"], "what the later segments hold is kept")
	require.NoError(t, l.Close())
	l, err = Open(dir, Options{})
	require.NoError(t, err, "a repaired log opens without Repair")
	assert.Equal(t, got, contents(t, l))
	assert.Empty(t, l.Recovery().Cuts)
	require.NoError(t, l.Close())
}

// TestVersion1LogWithoutTrimRecordsOpens: a log written before trim records
// existed (format version 1) has no record of the segments it removed, so
// its oldest segment is taken as it is, as that version did; once its own
// removals give it trim records, the rule of TestMissingOldestSegment holds.
func TestVersion1LogWithoutTrimRecordsOpens(t *testing.T) {
	bl := buildLog(t)
	dir := t.TempDir()
	data := make([][]byte, 0, len(bl.data)-1)
	for _, d := range bl.data[1:] {
		d = append([]byte(nil), d...)
		binary.LittleEndian.PutUint16(d[6:], 1)
		binary.LittleEndian.PutUint32(d[28:], crc32.Checksum(d[:28], castagnoli))
		data = append(data, d)
	}
	writeFiles(t, dir, bl.names[1:], data)
	l, err := Open(dir, Options{})
	require.NoError(t, err, "a version 1 log whose oldest segment is gone opens")
	assert.Equal(t, bl.states[len(bl.states)-1]["hot"], contents(t, l)["hot"])
	require.NoError(t, l.Close())
}

// TestTruncatedSegmentBeforeEmptyHead: when the head holds only its header,
// the header still says where the segment before it ended; a segment cut
// short before it is corruption, not a torn creation of the head.
func TestTruncatedSegmentBeforeEmptyHead(t *testing.T) {
	bl := buildLog(t)
	last := len(bl.names) - 1
	id, ok := parseSegName(bl.names[last])
	require.True(t, ok)
	head := segHeader{id: id + 1, firstSeq: uint64(bl.records()) + 1, salt: 7}
	names := append(slices.Clone(bl.names), segName(id+1))
	data := append(slices.Clone(bl.data), head.encode())

	dir := t.TempDir()
	writeFiles(t, dir, names, data)
	l, err := Open(dir, Options{})
	require.NoError(t, err, "a head with only its header is fine")
	assert.Equal(t, bl.states[bl.records()], contents(t, l))
	assert.Empty(t, l.Recovery().Cuts)
	require.NoError(t, l.Close())

	// Cut the last record of the segment before the head.
	ends := bl.ends[last]
	data[last] = data[last][:ends[len(ends)-2]]
	writeFiles(t, dir, names, data)
	_, err = Open(dir, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce, "a synced record is missing")
	assert.Equal(t, filepath.Join(dir, segName(id+1)), ce.File)
	_, err = os.Stat(filepath.Join(dir, segName(id+1)))
	assert.NoError(t, err, "the head is not removed")
}

// Merged CommitAsync batches stay all-or-nothing, and in order, whatever
// byte the last segment is cut at.
func TestMergedAsyncBatchesStayAtomicUnderATornTail(t *testing.T) {
	const goroutines, each = 6, 120
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 16 << 10}, nil) // limit 2 KiB: several merged records
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				var b Batch
				for _, part := range []string{"x", "y", "z"} {
					b.Put(fmt.Appendf(nil, "%d/%03d/%s", g, i, part), fmt.Appendf(nil, "%d-%d-%s", g, i, strings.Repeat(part, i%40)))
				}
				if !assert.NoError(t, l.CommitAsync(&b)) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, l.Close())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var segs []string
	for _, e := range ents {
		if _, ok := parseSegName(e.Name()); ok {
			segs = append(segs, e.Name())
		}
	}
	require.NotEmpty(t, segs)
	last := segs[len(segs)-1]
	data, err := os.ReadFile(filepath.Join(dir, last))
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	offsets := []int64{int64(len(data)), headerLen}
	for range 60 {
		offsets = append(offsets, headerLen+rng.Int64N(int64(len(data)-headerLen)))
	}
	for _, off := range offsets {
		cut := t.TempDir()
		for _, name := range segs {
			b, err := os.ReadFile(filepath.Join(dir, name))
			require.NoError(t, err)
			if name == last {
				b = b[:off]
			}
			require.NoError(t, os.WriteFile(filepath.Join(cut, name), b, 0o644))
		}
		l2, err := Open(cut, Options{})
		require.NoError(t, err, "cut at %d", off)
		got := contents(t, l2)
		require.NoError(t, l2.Close())
		for g := range goroutines {
			present := 0
			for i := range each {
				n := 0
				for _, part := range []string{"x", "y", "z"} {
					if v, ok := got[fmt.Sprintf("%d/%03d/%s", g, i, part)]; ok {
						n++
						assert.Equal(t, fmt.Sprintf("%d-%d-%s", g, i, strings.Repeat(part, i%40)), v)
					}
				}
				require.True(t, n == 0 || n == 3, "cut at %d: batch %d/%d has %d of its 3 puts", off, g, i, n)
				if n == 3 {
					require.Equal(t, present, i, "cut at %d: goroutine %d has batch %d without batch %d", off, g, i, present)
					present++
				}
			}
			if off == int64(len(data)) {
				assert.Equal(t, each, present, "nothing cut: every batch is there")
			}
		}
	}
}
