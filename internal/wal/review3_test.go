package wal

import (
	"fmt"
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

// Review 3: attacks on chunked compaction (compactStep), on when it runs
// (shouldCompact), and on awaitCohort. Every identifier here starts with r3.

// r3FS wraps a fileSystem to count reads and bytes written, and to fail reads
// (readErr) of the segment files.
type r3FS struct {
	fileSystem
	reads   atomic.Int64
	written atomic.Int64
	readErr atomic.Pointer[func(name string, n int, off int64) error]
}

func (fs *r3FS) OpenFile(name string, flag int) (file, error) {
	f, err := fs.fileSystem.OpenFile(name, flag)
	if err != nil {
		return nil, err
	}
	return &r3File{file: f, name: name, fs: fs}, nil
}

func (fs *r3FS) failReads(h func(name string, n int, off int64) error) { fs.readErr.Store(&h) }

type r3File struct {
	file
	name string
	fs   *r3FS
}

func (f *r3File) ReadAt(p []byte, off int64) (int, error) {
	f.fs.reads.Add(1)
	if h := f.fs.readErr.Load(); h != nil && *h != nil {
		if err := (*h)(f.name, len(p), off); err != nil {
			return 0, &os.PathError{Op: "read", Path: f.name, Err: err}
		}
	}
	return f.file.ReadAt(p, off)
}

func (f *r3File) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.file.WriteAt(p, off)
	f.fs.written.Add(int64(n))
	return n, err
}

// r3Budget is compactStep's chunk size for a segment size.
func r3Budget(segSize int64) int64 { return min(max(segSize/4, 64<<10), 1<<20) }

// r3RecLen is the encoded size of a record of one Put with an 8-byte key.
func r3RecLen(vlen int) int { return recPrefixLen + int(opCost(8, vlen)) }

// r3ValLen returns the value length that makes a one-Put record (8-byte key)
// exactly z bytes long.
func r3ValLen(t *testing.T, z int) int {
	t.Helper()
	for _, v := range []int{z - 39, z - 40, z - 41} {
		if v >= 0 && r3RecLen(v) == z {
			return v
		}
	}
	t.Fatalf("no record of %d bytes", z)
	return 0
}

// r3Segments lists the segment files of dir, oldest first, with the sizes of
// their records as found on disk.
func r3Segments(t *testing.T, dir string) [][]int {
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

// r3Chunking replays compactStep's chunking over a segment holding records
// of these sizes and returns, for every step that ended inside a record, how
// many bytes of it the chunk held (0 for a chunk ending exactly at a record
// end), and how many records were read on their own (larger than a chunk).
func r3Chunking(sizes []int, budget int) (cuts map[int]bool, alone int) {
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
func TestReview3CompactionChunkBoundaries(t *testing.T) {
	const segSize = 256 << 10
	budget := int(r3Budget(segSize))
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
		v := strings.Repeat(string(rune('a'+n%26)), r3ValLen(t, z))
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
	got := r3Segments(t, dir)
	require.GreaterOrEqual(t, len(got), len(plan))
	require.Equal(t, wantSizes, got[:len(plan)], "the records are laid out as planned")
	cuts, alone := map[int]bool{}, 0
	for _, sizes := range got[:len(plan)] {
		c, a := r3Chunking(sizes, budget)
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
	}, r2Wait, time.Millisecond, "the crafted segments are compacted and removed")
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
func TestReview3CompactionFaultFailsCleanly(t *testing.T) {
	const segSize = 128 << 10
	budget := int(r3Budget(segSize))
	require.Less(t, budget+1000, segSize)
	for _, tc := range []struct {
		name  string
		first int // size of the first value of segment 1 (dead later)
		arm   func(ffs *faultFS, fs *r3FS, seg1 string)
		cause error
	}{
		{"chunk read", 1000, func(_ *faultFS, fs *r3FS, seg1 string) {
			fs.failReads(func(name string, n int, off int64) error {
				if name == seg1 && n > recHeaderLen {
					return errIO
				}
				return nil
			})
		}, errIO},
		{"big record read alone", budget + 1000, func(_ *faultFS, fs *r3FS, seg1 string) {
			fs.failReads(func(name string, n int, off int64) error {
				if name == seg1 && n == recHeaderLen {
					return errIO
				}
				return nil
			})
		}, errIO},
		{"compaction record write", 1000, func(ffs *faultFS, fs *r3FS, seg1 string) {
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
			fs := &r3FS{fileSystem: ffs}
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
			assert.ErrorIs(t, l.CommitAsync(r2Batch("after", "v")), ErrFailed)
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				assert.ErrorIs(t, l.Close(), ErrFailed)
			}()
			r2Within(t, closed, "Close of the failed log")
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
func TestReview3NoBusyLoopWhileReaderPinsDeadSegment(t *testing.T) {
	fs := &r3FS{fileSystem: &faultFS{noSync: true}}
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
	r2Within(t, inFn, "Range's fn")
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
	r2Within(t, ranged, "Range")
	assert.Less(t, spun, int64(100), "the writer read the segments %d times in 300ms while idle", spun)
	require.Eventually(t, func() bool {
		require.NoError(t, l.Sync())
		return l.Stats().SegmentsRemoved > 0
	}, r2Wait, time.Millisecond, "the dead segment goes once the Range is over")
}

// A log of tiny, all-live records (a backlog nobody consumes, in small
// messages: 38 bytes of record for 10 bytes of live entry) crosses "twice the
// live data plus two segments" on framing alone, so compaction rewrites the
// oldest segment whatever it holds. The rewrite must converge (the compacted
// records are dense) and stop: no unbounded write amplification while the
// backlog grows, and no compaction at all once nothing changes.
func TestReview3AllLiveTinyRecordsSettle(t *testing.T) {
	const segSize = 16 << 10
	fs := &r3FS{fileSystem: &faultFS{noSync: true}}
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
func TestReview3BoundedDiskHugeValues(t *testing.T) {
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

// After a burst of Commits raised the cohort, the load turns to CommitAsync
// only (acknowledgements). A CommitAsync wakes the writer with a request
// that has no committer behind it, and awaitCohort then waits for the gone
// cohort (need = cohort, not cohort-1, as the waking request is not a
// committer) until its timer; writeGroup never lowers the cohort for a group
// without waiters or sync, so this repeats on every wake: "one wait ends at
// its timer and the next ones wait only for those that came" does not hold,
// and each async batch becomes visible (and is written) a timer late.
func TestReview3AsyncWakeDoesNotWaitForGoneCohort(t *testing.T) {
	old := maxCohortWait
	maxCohortWait = 400 * time.Millisecond // registered before openT: restored after Close
	t.Cleanup(func() { maxCohortWait = old })
	fs := &faultFS{noSync: true}
	l := openT(t, t.TempDir(), Options{}, fs)
	const slowSync = 100 * time.Millisecond
	// A slow disk: every fdatasync takes 100ms (lastSync).
	r2Burst(t, l, fs, 20, func() { time.Sleep(slowSync) })
	var late []time.Duration
	for i := range 3 {
		k := fmt.Sprint("async", i)
		syncs := fs.syncs.Load()
		start := time.Now()
		require.NoError(t, l.CommitAsync(r2Batch(k, "v")))
		require.Eventually(t, func() bool {
			_, ok, err := l.Get([]byte(k))
			require.NoError(t, err)
			return ok
		}, r2Wait, 100*time.Microsecond)
		if d := time.Since(start); d >= slowSync {
			late = append(late, d)
		}
		// Let the background sync of the batch (100ms after its write) finish
		// before the next round, so that the writer is idle when it starts.
		require.Eventually(t, func() bool { return fs.syncs.Load() > syncs }, r2Wait, time.Millisecond)
	}
	assert.LessOrEqual(t, len(late), 1, "CommitAsync batches written late (the writer slept for a gone cohort each time): %v", late)
}

// With segments so small that each holds one record, the per-segment
// framing (a 32-byte header, a 28-byte record prefix) outweighs small live
// values, so the directory stays above "twice the live data plus two
// segments" whatever compaction does: rewriting the oldest segment's one
// record makes one new segment of the same size. An idle log must still
// settle: no compaction, no segment churn, once nothing changes.
func TestReview3TinySegmentsIdleSettle(t *testing.T) {
	fs := &r3FS{fileSystem: &faultFS{noSync: true}}
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
