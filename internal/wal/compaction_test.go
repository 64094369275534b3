package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var n int64
	for _, e := range ents {
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // the writer removed it since ReadDir: it takes no room
		}
		require.NoError(t, err)
		n += info.Size()
	}
	return n
}

// TestBoundedDisk runs 200k put+delete pairs, with a few long-lived keys the
// compaction has to move along: the directory must stay a few segments big.
func TestBoundedDisk(t *testing.T) {
	const (
		segSize = 8 << 10
		pairs   = 200_000
		perB    = 10 // pairs per batch
		lag     = 25 // a key is deleted this many puts after it was put
	)
	dir := t.TempDir()
	fs := &faultFS{noSync: true}
	l := openT(t, dir, Options{SegmentSize: segSize}, fs)
	want := map[string]string{}
	var b Batch
	for i := range 20 {
		k, v := fmt.Sprintf("long%02d", i), strings.Repeat("L", 40)
		b.Put([]byte(k), []byte(v))
		want[k] = v
	}
	require.NoError(t, l.Commit(&b))

	val := []byte(strings.Repeat("v", 64))
	bound := int64(6 * segSize)
	var maxDisk int64
	for i := 0; i < pairs; i += perB {
		b.Reset()
		for j := i; j < i+perB; j++ {
			b.Put(fmt.Appendf(nil, "msg%07d", j), val)
			if j >= lag {
				b.Delete(fmt.Appendf(nil, "msg%07d", j-lag))
			}
		}
		if i%(100*perB) == 0 {
			// Now and then a long-lived key changes, as a queue's metadata would.
			k := fmt.Sprintf("long%02d", i/(100*perB)%20)
			b.Put([]byte(k), fmt.Appendf(nil, "L%d", i))
			want[k] = fmt.Sprintf("L%d", i)
			require.NoError(t, l.Commit(&b))
		} else {
			require.NoError(t, l.CommitAsync(&b))
		}
		if i%(10*perB) == 0 {
			maxDisk = max(maxDisk, l.Stats().DiskBytes)
		}
	}
	require.NoError(t, l.Sync())
	for j := pairs - lag; j < pairs; j++ {
		want[fmt.Sprintf("msg%07d", j)] = string(val)
	}
	// The writer removes dead segments after answering the Sync; wait for it.
	require.Eventually(t, func() bool { return l.Stats().DiskBytes <= bound }, 10*time.Second, time.Millisecond)
	st := l.Stats()
	maxDisk = max(maxDisk, st.DiskBytes)
	t.Logf("after %d pairs: %+v; largest DiskBytes seen %d; directory %d bytes", pairs, st, maxDisk, dirBytes(t, dir))
	assert.LessOrEqual(t, maxDisk, bound)
	assert.LessOrEqual(t, dirBytes(t, dir), bound)
	assert.Greater(t, st.SegmentsRemoved, uint64(100))
	assert.Greater(t, st.Compactions, uint64(0), "the long-lived keys were moved")
	assert.Equal(t, len(want), st.LiveKeys)
	assert.Equal(t, want, contents(t, l))
	require.NoError(t, l.Close())

	l = openT(t, dir, Options{SegmentSize: segSize}, fs)
	assert.Equal(t, want, contents(t, l))
}

// TestCompaction: a segment that holds a few live values among dead ones is
// rewritten into the head and deleted, and the values survive a reopen.
func TestCompaction(t *testing.T) {
	const segSize = 4 << 10
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: segSize}, nil)
	// Segment 1: three keys that stay, many that are overwritten later.
	commit(t, l, "keep/a=alpha", "keep/b=beta", "keep/c=gamma")
	for i := range 60 {
		commit(t, l, fmt.Sprintf("churn/%d=%s", i%10, strings.Repeat("x", 100)))
	}
	first := filepath.Join(dir, segName(1))
	require.Eventually(t, func() bool {
		// Compaction and removal run in the writer after a group; a Sync is a group.
		require.NoError(t, l.Sync())
		_, err := os.Stat(first)
		return os.IsNotExist(err)
	}, 10*time.Second, time.Millisecond)
	st := l.Stats()
	assert.Greater(t, st.Compactions, uint64(0))
	assert.Greater(t, st.SegmentsRemoved, uint64(0))
	want := map[string]string{"keep/a": "alpha", "keep/b": "beta", "keep/c": "gamma"}
	for i := range 10 {
		want[fmt.Sprintf("churn/%d", i)] = strings.Repeat("x", 100)
	}
	assert.Equal(t, want, contents(t, l))
	// Live data is about 1.2 KiB: a few segments at most.
	assert.LessOrEqual(t, st.DiskBytes, int64(3*segSize))
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, want, contents(t, l))
}

// Compaction reads a chunk per step (a quarter segment here, 128 KiB): records
// cut by the chunk's end are read again by the next step, and a live record
// larger than a chunk is read on its own; all of them survive.
func TestCompactionChunks(t *testing.T) {
	const segSize = 512 << 10
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: segSize}, nil)
	big := strings.Repeat("B", 200<<10)
	want := map[string]string{"big": big}
	commit(t, l, "big="+big)
	for i := range 120 { // odd-sized records: chunk ends fall inside them
		k, v := fmt.Sprintf("keep/%03d", i), strings.Repeat("k", 900+i)
		commit(t, l, k+"="+v)
		want[k] = v
		k, v = fmt.Sprintf("churn/%d", i%7), strings.Repeat("x", 1500+i)
		commit(t, l, k+"="+v)
		want[k] = v
	}
	// The first segment is mostly live (the big value): it is compacted once
	// the directory passes twice the live data plus two segments. Churn
	// until then (a bounded number of commits).
	first := filepath.Join(dir, segName(1))
	gone := false
	for i := 0; i < 2000 && !gone; i++ {
		commit(t, l, fmt.Sprintf("fill/%d=%s", i%5, strings.Repeat("f", 4000)))
		_, err := os.Stat(first)
		gone = os.IsNotExist(err)
	}
	require.True(t, gone, "the first segment was compacted and removed")
	for i := range 5 {
		want[fmt.Sprintf("fill/%d", i)] = strings.Repeat("f", 4000)
	}
	assert.Greater(t, l.Stats().Compactions, uint64(1), "more than one step")
	same := func(got map[string]string) bool { // not assert.Equal: a failure would print 200 KiB
		return maps.Equal(want, got)
	}
	assert.True(t, same(contents(t, l)), "the live values after compaction")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{SegmentSize: segSize}, nil)
	assert.True(t, same(contents(t, l)), "the live values after a reopen")
}

// TestCompactionNoChurnLoop: a log whose data is all live is left alone.
func TestCompactionAllLive(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 1024}, nil)
	for i := range 100 {
		commit(t, l, fmt.Sprintf("k%03d=%s", i, strings.Repeat("v", 50)))
	}
	require.NoError(t, l.Sync())
	st := l.Stats()
	assert.Zero(t, st.Compactions)
	assert.Zero(t, st.SegmentsRemoved)
	assert.Equal(t, 100, st.LiveKeys)
}

// A steady put/delete load keeps the directory at a few small segments even
// when the oldest segment is mostly live: here the first segment holds values
// that stay (a backlog nobody consumes), a little over half of it, and a
// churn of put/delete pairs (TestBoundedDisk's load) follows. Dead segments
// can only be removed oldest first, so the oldest must be compacted away for
// anything behind it to go.
func TestBoundedDiskBehindAMostlyLiveOldestSegment(t *testing.T) {
	const (
		segSize = 8 << 10
		pairs   = 20_000
		perB    = 10
		lag     = 25
	)
	for _, liveShare := range []int{75, 100} { // percent of the first segment that stays live
		t.Run(fmt.Sprint(liveShare, "% live"), func(t *testing.T) {
			l := openT(t, t.TempDir(), Options{SegmentSize: segSize}, nil)
			want := map[string]string{}
			var b Batch
			val := strings.Repeat("k", 90)
			for i := 0; l.Stats().Segments == 1; i++ {
				b.Reset()
				k := fmt.Sprintf("keep/%04d", i)
				b.Put([]byte(k), []byte(val))
				want[k] = val
				require.NoError(t, l.Commit(&b))
			}
			// Delete enough of the first segment's keys to leave liveShare% live.
			first := l.Stats().LiveBytes
			for i := 0; l.Stats().LiveBytes*100 > first*int64(liveShare); i++ {
				k := fmt.Sprintf("keep/%04d", i)
				b.Reset()
				b.Delete([]byte(k))
				delete(want, k)
				require.NoError(t, l.Commit(&b))
			}
			churn := []byte(strings.Repeat("v", 64))
			var maxDisk int64
			for i := 0; i < pairs; i += perB {
				b.Reset()
				for j := i; j < i+perB; j++ {
					b.Put(fmt.Appendf(nil, "msg%07d", j), churn)
					if j >= lag {
						b.Delete(fmt.Appendf(nil, "msg%07d", j-lag))
					}
				}
				require.NoError(t, l.CommitAsync(&b))
				maxDisk = max(maxDisk, l.Stats().DiskBytes)
			}
			require.NoError(t, l.Sync())
			for j := pairs - lag; j < pairs; j++ {
				want[fmt.Sprintf("msg%07d", j)] = string(churn)
			}
			st := l.Stats()
			bound := st.LiveBytes + 6*segSize
			t.Logf("%+v; largest DiskBytes seen %d, bound %d", st, maxDisk, bound)
			assert.LessOrEqual(t, maxDisk, bound, "the directory grew with the churn: dead segments pile up behind the oldest")
			assert.Equal(t, want, contents(t, l))
		})
	}
}

// readFaultFS wraps a fileSystem to count reads and bytes written, and to fail reads
// (readErr) of the segment files.
type readFaultFS struct {
	fileSystem
	reads   atomic.Int64
	written atomic.Int64
	readErr atomic.Pointer[func(name string, n int, off int64) error]
}

func (fs *readFaultFS) OpenFile(name string, flag int) (file, error) {
	f, err := fs.fileSystem.OpenFile(name, flag)
	if err != nil {
		return nil, err
	}
	return &readFaultFile{file: f, name: name, fs: fs}, nil
}

func (fs *readFaultFS) failReads(h func(name string, n int, off int64) error) { fs.readErr.Store(&h) }

type readFaultFile struct {
	file
	name string
	fs   *readFaultFS
}

func (f *readFaultFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.reads.Add(1)
	if h := f.fs.readErr.Load(); h != nil && *h != nil {
		if err := (*h)(f.name, len(p), off); err != nil {
			return 0, &os.PathError{Op: "read", Path: f.name, Err: err}
		}
	}
	return f.file.ReadAt(p, off)
}

func (f *readFaultFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.file.WriteAt(p, off)
	f.fs.written.Add(int64(n))
	return n, err
}

// chunkBudget is compactStep's chunk size for a segment size.
func chunkBudget(segSize int64) int64 { return min(max(segSize/4, 64<<10), 1<<20) }

// putRecordLen is the encoded size of a record of one Put with an 8-byte key.
func putRecordLen(vlen int) int { return recPrefixLen + int(opCost(8, vlen)) }

// valLenForRecord returns the value length that makes a one-Put record (8-byte key)
// exactly z bytes long.
func valLenForRecord(t *testing.T, z int) int {
	t.Helper()
	for _, v := range []int{z - 39, z - 40, z - 41} {
		if v >= 0 && putRecordLen(v) == z {
			return v
		}
	}
	t.Fatalf("no record of %d bytes", z)
	return 0
}

// segmentSizes lists the segment files of dir, oldest first, with the sizes of
// their records as found on disk.
func segmentSizes(t *testing.T, dir string) [][]int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out [][]int
	for _, e := range ents {
		if _, ok := parseSegName(e.Name()); !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		h, err := decodeHeader(data)
		require.NoError(t, err)
		var sizes []int
		for off := headerLen; off < len(data); {
			_, n, err := decodeRecord(data[off:], h.salt, nil)
			require.NoError(t, err)
			sizes = append(sizes, n)
			off += n
		}
		out = append(out, sizes)
	}
	return out
}

// replayChunking replays compactStep's chunking over a segment holding records
// of these sizes and returns, for every step that ended inside a record, how
// many bytes of it the chunk held (0 for a chunk ending exactly at a record
// end), and how many records were read on their own (larger than a chunk).
func replayChunking(sizes []int, budget int) (cuts map[int]bool, alone int) {
	cuts = map[int]bool{}
	size := headerLen
	for _, z := range sizes {
		size += z
	}
	off, i := headerLen, 0
	for off < size {
		chunk := min(budget, size-off)
		p := 0
		for p < chunk {
			z := sizes[i]
			if z > chunk-p {
				if p > 0 {
					cuts[chunk-p] = true
					break
				}
				alone++
			}
			p += z
			i++
		}
		if p == chunk && off+chunk < size {
			cuts[0] = true
		}
		off += p
	}
	return cuts, alone
}

// Compaction reads the oldest segment a chunk at a time. Here the segments
// are laid out so that chunk ends fall exactly on record ends, inside a
// record's 8-byte header (1, 4, 7 bytes of it), just after the header (8),
// inside the seq/synced/count prefix (27, 28), one byte before a record's
// end, and at the start of records larger than a chunk (read alone), at a
// chunk start and in the middle of one. The records cut by chunk ends hold
// live values, everything else dies, so the segments are compacted (under a
// quarter live, more than two segments); Get runs throughout. Every live
// value must survive, in place and after a reopen.
func TestCompactionChunkBoundaries(t *testing.T) {
	const segSize = 256 << 10
	budget := int(chunkBudget(segSize))
	require.Equal(t, 64<<10, budget)
	const straddler = 1500
	big := budget + 4464 // larger than a chunk
	type target struct{ cut, size int }
	plan := [][]target{
		{{budget, big}, {0, straddler}, {1, straddler}}, // a big record at the start of a chunk
		{{7, straddler}, {8, straddler}, {4, straddler}},
		{{27, straddler}, {28, straddler}, {straddler - 1, straddler}},
		{{100, big}, {9, straddler}}, // a big record cut by a chunk end
	}
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: segSize}, nil)
	want := map[string]string{}
	var dead []string
	var wantSizes [][]int
	n := 0
	put := func(z int, live bool) {
		k := fmt.Sprintf("d%07d", n)
		if live {
			k = fmt.Sprintf("l%07d", n)
		}
		n++
		v := strings.Repeat(string(rune('a'+n%26)), valLenForRecord(t, z))
		commit(t, l, k+"="+v)
		if live {
			want[k] = v
		} else {
			dead = append(dead, k)
		}
		wantSizes[len(wantSizes)-1] = append(wantSizes[len(wantSizes)-1], z)
	}
	for _, seg := range plan {
		wantSizes = append(wantSizes, nil)
		pos, cstart := headerLen, headerLen
		fill := func(end int) {
			gap := end - pos
			require.True(t, gap == 0 || gap >= 400, "plan: gap %d", gap)
			for gap > 2000 {
				put(1000, false)
				gap -= 1000
			}
			if gap > 0 {
				put(gap/2, false)
				put(gap-gap/2, false)
			}
			pos = end
		}
		for _, tg := range seg {
			end := cstart + budget - tg.cut
			fill(end)
			put(tg.size, tg.size < budget) // the big ones die, but are still read and decoded
			pos = end + tg.size
			cstart = end
			if tg.size > budget {
				cstart = end + tg.size
			}
		}
		for pos+1000 <= segSize { // the next record (1000 bytes or more) starts a new segment
			put(1000, false)
			pos += 1000
		}
	}
	got := segmentSizes(t, dir)
	require.GreaterOrEqual(t, len(got), len(plan))
	require.Equal(t, wantSizes, got[:len(plan)], "the records are laid out as planned")
	cuts, alone := map[int]bool{}, 0
	for _, sizes := range got[:len(plan)] {
		c, a := replayChunking(sizes, budget)
		maps.Copy(cuts, c)
		alone += a
	}
	for _, c := range []int{0, 1, 4, 7, 8, 9, 27, 28, 100, straddler - 1} {
		assert.True(t, cuts[c], "no chunk ends %d bytes into a record", c)
	}
	assert.Equal(t, 2, alone, "records read on their own")

	// Readers run while the segments are compacted and removed.
	stop := make(chan struct{})
	live := maps.Clone(want)
	var readers sync.WaitGroup
	stopReaders := sync.OnceFunc(func() { close(stop); readers.Wait() })
	defer stopReaders() // before the Close of openT's cleanup
	for range 2 {
		readers.Go(func() {
			for {
				for k, v := range live {
					select {
					case <-stop:
						return
					default:
					}
					val, ok, err := l.Get([]byte(k))
					if !assert.NoError(t, err) || !assert.True(t, ok, "key %s", k) || !assert.True(t, string(val) == v, "value of %s", k) {
						return
					}
				}
			}
		})
	}
	var b Batch
	for _, k := range dead {
		b.Delete([]byte(k))
	}
	require.NoError(t, l.Commit(&b))
	for i := range 3 { // two more segments: the last crafted one is not the head's predecessor
		k, v := fmt.Sprintf("tail/%d", i), strings.Repeat("t", 150<<10)
		commit(t, l, k+"="+v)
		want[k] = v
	}
	last := filepath.Join(dir, segName(uint64(len(plan))))
	require.Eventually(t, func() bool {
		if !assert.NoError(t, l.Sync()) {
			return true
		}
		_, err := os.Stat(last)
		// The count rises just after the file goes (see removeOldest).
		return os.IsNotExist(err) && l.Stats().SegmentsRemoved >= uint64(len(plan))
	}, settleWait, time.Millisecond, "the crafted segments are compacted and removed")
	stopReaders()
	st := l.Stats()
	assert.Positive(t, st.Compactions)
	assert.GreaterOrEqual(t, st.SegmentsRemoved, uint64(len(plan)))
	assert.True(t, maps.Equal(want, contents(t, l)), "the live values after compaction")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{SegmentSize: segSize}, nil)
	assert.True(t, maps.Equal(want, contents(t, l)), "the live values after a reopen")
}

// A read that fails during compaction (the chunk read, or the read of a
// record larger than a chunk, or a write of the compaction record) fails the
// log: every later call reports ErrFailed with the cause, Close does not
// hang, and a reopen finds everything that was committed.
func TestCompactionReadFailureFailsCleanly(t *testing.T) {
	const segSize = 128 << 10
	budget := int(chunkBudget(segSize))
	require.Less(t, budget+1000, segSize)
	for _, tc := range []struct {
		name  string
		first int // size of the first value of segment 1 (dead later)
		arm   func(ffs *faultFS, fs *readFaultFS, seg1 string)
		cause error
	}{
		{"chunk read", 1000, func(_ *faultFS, fs *readFaultFS, seg1 string) {
			fs.failReads(func(name string, n int, off int64) error {
				if name == seg1 && n > recHeaderLen {
					return errIO
				}
				return nil
			})
		}, errIO},
		{"big record read alone", budget + 1000, func(_ *faultFS, fs *readFaultFS, seg1 string) {
			fs.failReads(func(name string, n int, off int64) error {
				if name == seg1 && n == recHeaderLen {
					return errIO
				}
				return nil
			})
		}, errIO},
		{"compaction record write", 1000, func(ffs *faultFS, fs *readFaultFS, seg1 string) {
			var once sync.Once
			fs.failReads(func(name string, n int, off int64) error {
				if name == seg1 {
					once.Do(func() { ffs.failWrites(errNoSpace, 0) })
				}
				return nil
			})
		}, errNoSpace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := &faultFS{noSync: true}
			fs := &readFaultFS{fileSystem: ffs}
			dir := t.TempDir()
			l, err := open(dir, Options{SegmentSize: segSize}, fs)
			require.NoError(t, err)
			committed := map[string]string{}
			c := func(k, v string) {
				commit(t, l, k+"="+v)
				committed[k] = v
			}
			c("first", strings.Repeat("F", tc.first))
			for i := 0; l.Stats().Segments == 1; i++ {
				c(fmt.Sprintf("d/%04d", i), strings.Repeat("d", 900))
			}
			c("keep", "k") // in segment 2
			// From here on, reading segment 1 can only be compaction's doing.
			tc.arm(ffs, fs, filepath.Join(dir, segName(1)))
			// Kill what segment 1 holds but one small value.
			var b Batch
			var deleted []string
			for k := range committed {
				if strings.HasPrefix(k, "d/") && k != "d/0003" || k == "first" {
					b.Delete([]byte(k))
					deleted = append(deleted, k)
				}
			}
			require.NoError(t, l.Commit(&b), "answered before any maintenance")
			attempted := maps.Clone(committed)
			for _, k := range deleted {
				delete(committed, k)
			}
			var failure error
			for i := 0; i < 10_000 && failure == nil; i++ {
				k, v := fmt.Sprintf("x/%05d", i), strings.Repeat("x", 900)
				attempted[k] = v
				var b Batch
				b.Put([]byte(k), []byte(v))
				if failure = l.Commit(&b); failure == nil {
					committed[k] = v
				}
			}
			require.Error(t, failure, "the compaction fault never failed the log")
			assert.ErrorIs(t, failure, ErrFailed)
			assert.ErrorIs(t, l.Sync(), tc.cause, "the cause is reported")
			assert.ErrorIs(t, l.CommitAsync(putBatch("after", "v")), ErrFailed)
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				assert.ErrorIs(t, l.Close(), ErrFailed)
			}()
			closedWithin(t, closed, "Close of the failed log")
			fs.failReads(nil)
			ffs.failWrites(nil, 0)
			checkNothingLost(t, dir, committed, attempted)
			l2 := openT(t, dir, Options{}, nil)
			got := contents(t, l2)
			for _, k := range deleted {
				assert.NotContains(t, got, k, "a deleted key came back")
			}
		})
	}
}

// While a Range holds the readers lock, the writer cannot delete the dead
// oldest segment ("the next group retries"). It must not spin meanwhile:
// with the oldest segment dead and more than two segments, shouldCompact
// keeps saying yes, compactStep finds nothing left to read and maintain
// reports more work, so the writer loops on zero-length reads for as long
// as the Range lasts, a core at 100% with nothing to do.
func TestNoBusyLoopWhileAReaderPinsADeadSegment(t *testing.T) {
	fs := &readFaultFS{fileSystem: &faultFS{noSync: true}}
	l := openT(t, t.TempDir(), Options{SegmentSize: 4096}, fs)
	val := strings.Repeat("v", 200)
	var keys []string
	for i := 0; l.Stats().Segments == 1; i++ {
		k := fmt.Sprintf("d/%03d", i)
		commit(t, l, k+"="+val)
		keys = append(keys, k)
	}
	commit(t, l, "pin=p")
	inFn, release, ranged := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ranged)
		var once sync.Once
		assert.NoError(t, l.Range(func(k, v []byte) bool {
			once.Do(func() { close(inFn) })
			<-release
			return false
		}))
	}()
	closedWithin(t, inFn, "Range's fn")
	var b Batch
	for _, k := range keys[:len(keys)-1] { // the last one went to segment 2
		b.Delete([]byte(k))
	}
	require.NoError(t, l.Commit(&b))
	for i := 0; l.Stats().Segments < 4; i++ {
		commit(t, l, fmt.Sprintf("f/%03d=%s", i, val))
	}
	require.NoError(t, l.Sync())
	// Nothing is written from here on: the writer has nothing to do.
	before := fs.reads.Load()
	<-time.After(300 * time.Millisecond) // a measuring window, not a synchronisation
	spun := fs.reads.Load() - before
	close(release)
	closedWithin(t, ranged, "Range")
	assert.Less(t, spun, int64(100), "the writer read the segments %d times in 300ms while idle", spun)
	require.Eventually(t, func() bool {
		require.NoError(t, l.Sync())
		return l.Stats().SegmentsRemoved > 0
	}, settleWait, time.Millisecond, "the dead segment goes once the Range is over")
}

// A log of tiny, all-live records (a backlog nobody consumes, in small
// messages: 38 bytes of record for 10 bytes of live entry) crosses "twice the
// live data plus two segments" on framing alone, so compaction rewrites the
// oldest segment whatever it holds. The rewrite must converge (the compacted
// records are dense) and stop: no unbounded write amplification while the
// backlog grows, and no compaction at all once nothing changes.
func TestAllLiveTinyRecordsSettle(t *testing.T) {
	const segSize = 16 << 10
	fs := &readFaultFS{fileSystem: &faultFS{noSync: true}}
	l := openT(t, t.TempDir(), Options{SegmentSize: segSize}, fs)
	const n = 6000
	want := map[string]string{}
	for i := range n {
		k := fmt.Sprintf("k%06d", i)
		commit(t, l, k+"=")
		want[k] = ""
	}
	require.NoError(t, l.Sync())
	last := l.Stats().Compactions
	settled := false
	for range 1000 {
		require.NoError(t, l.Sync())
		c := l.Stats().Compactions
		if c == last {
			settled = true
			break
		}
		last = c
	}
	require.True(t, settled, "compaction keeps running with nothing changing")
	for range 20 {
		require.NoError(t, l.Sync())
	}
	st := l.Stats()
	assert.Equal(t, last, st.Compactions, "compaction runs again on an idle log")
	appended := int64(n * (recPrefixLen + int(opCost(7, 0)))) // what the Commits wrote
	t.Logf("%+v; %d bytes written for %d bytes of commits", st, fs.written.Load(), appended)
	assert.Less(t, fs.written.Load(), 4*appended, "write amplification over 4x for an all-live log")
	assert.LessOrEqual(t, st.DiskBytes, 2*st.LiveBytes+2*segSize+segSize)
	assert.Equal(t, want, contents(t, l))
}

// Values larger than a segment (each record gets a segment of its own),
// churned with a lag, beside a long-lived huge value and a long-lived small
// key that changes now and then: the directory stays bounded by about twice
// the live data, compaction moves the long-lived values along (compaction
// records compacted again), and everything survives a reopen.
func TestBoundedDiskWithValuesLargerThanASegment(t *testing.T) {
	const (
		segSize = 8 << 10
		huge    = 3*segSize + 123
		lag     = 3
		rounds  = 400
	)
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: segSize}, nil)
	want := map[string]string{}
	c := func(b *Batch) { require.NoError(t, l.Commit(b)) }
	var b Batch
	b.Put([]byte("long/huge"), []byte(strings.Repeat("H", huge)))
	b.Put([]byte("long/small"), []byte("s0"))
	want["long/huge"], want["long/small"] = strings.Repeat("H", huge), "s0"
	c(&b)
	var maxDisk, maxLive int64
	for i := range rounds {
		b.Reset()
		b.Put(fmt.Appendf(nil, "msg/%04d", i), []byte(strings.Repeat(string(rune('a'+i%26)), huge)))
		if i >= lag {
			b.Delete(fmt.Appendf(nil, "msg/%04d", i-lag))
		}
		if i%50 == 0 {
			v := fmt.Sprintf("s%d", i)
			b.Put([]byte("long/small"), []byte(v))
			want["long/small"] = v
		}
		c(&b)
		st := l.Stats()
		maxDisk, maxLive = max(maxDisk, st.DiskBytes), max(maxLive, st.LiveBytes)
	}
	for i := rounds - lag; i < rounds; i++ {
		want[fmt.Sprintf("msg/%04d", i)] = strings.Repeat(string(rune('a'+i%26)), huge)
	}
	require.NoError(t, l.Sync())
	st := l.Stats()
	t.Logf("%+v; largest DiskBytes %d, largest LiveBytes %d", st, maxDisk, maxLive)
	assert.LessOrEqual(t, maxDisk, 2*maxLive+4*segSize+huge, "the directory grew past twice the live data")
	assert.Positive(t, st.Compactions, "the long-lived values were moved")
	assert.True(t, maps.Equal(want, contents(t, l)), "the live values")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{SegmentSize: segSize}, nil)
	assert.True(t, maps.Equal(want, contents(t, l)), "the live values after a reopen")
}

// With segments so small that each holds one record, the per-segment
// framing (a 32-byte header, a 28-byte record prefix) outweighs small live
// values, so the directory stays above "twice the live data plus two
// segments" whatever compaction does: rewriting the oldest segment's one
// record makes one new segment of the same size. An idle log must still
// settle: no compaction, no segment churn, once nothing changes.
func TestTinySegmentsSettleWhenIdle(t *testing.T) {
	fs := &readFaultFS{fileSystem: &faultFS{noSync: true}}
	l := openT(t, t.TempDir(), Options{SegmentSize: 100}, fs)
	want := map[string]string{}
	for i := range 10 {
		k, v := fmt.Sprintf("k%03d", i), strings.Repeat("v", 20)
		commit(t, l, k+"="+v)
		want[k] = v
	}
	require.NoError(t, l.Sync())
	before := l.Stats()
	<-time.After(200 * time.Millisecond) // a measuring window, not a synchronisation
	after := l.Stats()
	t.Logf("before %+v\nafter  %+v", before, after)
	assert.Less(t, after.Compactions-before.Compactions, uint64(20),
		"compaction keeps rewriting an idle log (%d records in 200ms)", after.Compactions-before.Compactions)
	assert.Less(t, after.SegmentsRemoved-before.SegmentsRemoved, uint64(20), "segments churn on an idle log")
	assert.Equal(t, want, contents(t, l))
}
