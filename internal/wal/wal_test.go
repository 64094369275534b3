package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openT opens dir with fs (nil: a faultFS that skips syncs) and closes the
// Log when the test ends.
func openT(t testing.TB, dir string, opts Options, fs fileSystem) *Log {
	t.Helper()
	if fs == nil {
		fs = &faultFS{noSync: true}
	}
	l, err := open(dir, opts, fs)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// contents returns the live state of l.
func contents(t testing.TB, l *Log) map[string]string {
	t.Helper()
	m := map[string]string{}
	var prev string
	first := true
	require.NoError(t, l.Range(func(k, v []byte) bool {
		if !first {
			require.Less(t, prev, string(k), "Range must go in ascending key order")
		}
		prev, first = string(k), false
		m[string(k)] = string(v)
		return true
	}))
	return m
}

func commit(t testing.TB, l *Log, ops ...string) {
	t.Helper()
	var b Batch
	for _, o := range ops {
		if k, v, ok := strings.Cut(o, "="); ok {
			b.Put([]byte(k), []byte(v))
		} else {
			b.Delete([]byte(o))
		}
	}
	require.NoError(t, l.Commit(&b))
}

func TestCommitGetRangeReopen(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	commit(t, l, "a=1", "b=2", "c=3")
	commit(t, l, "b", "a=10", "d=")
	commit(t, l, "zz") // deleting a missing key is fine

	want := map[string]string{"a": "10", "c": "3", "d": ""}
	assert.Equal(t, want, contents(t, l))
	v, ok, err := l.Get([]byte("a"))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "10", string(v))
	_, ok, err = l.Get([]byte("b"))
	require.NoError(t, err)
	assert.False(t, ok)

	st := l.Stats()
	assert.Equal(t, 1, st.Segments)
	assert.Equal(t, 3, st.LiveKeys)
	assert.Equal(t, uint64(3), st.Commits)
	assert.Equal(t, opCost(1, 2)+opCost(1, 1)+opCost(1, 0), st.LiveBytes)
	require.NoError(t, l.Close())

	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, want, contents(t, l))
	rec := l.Recovery()
	assert.Equal(t, 3, rec.Records)
	assert.Empty(t, rec.Cuts)
	commit(t, l, "e=5")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{}, nil)
	want["e"] = "5"
	assert.Equal(t, want, contents(t, l))
}

func TestBatch(t *testing.T) {
	var b Batch
	assert.Equal(t, 0, b.Len())
	assert.Equal(t, recPrefixLen, b.Size())
	key, val := []byte("k"), []byte("v")
	b.Put(key, val)
	key[0], val[0] = 'x', 'x' // Put copied them
	b.Delete([]byte("k"))
	assert.Equal(t, 2, b.Len())
	rec := b.record()
	sealRecord(rec, 1, 0, 0)
	r, err := decodeBody(rec, nil)
	require.NoError(t, err)
	require.Len(t, r.ops, 2)
	assert.Equal(t, "k", string(r.ops[0].key))
	assert.Equal(t, "v", string(r.ops[0].val))
	assert.Equal(t, opDelete, r.ops[1].kind)
	b.Reset()
	assert.Equal(t, 0, b.Len())
	assert.Equal(t, recPrefixLen, b.Size())
}

func TestInvalidOptions(t *testing.T) {
	for _, o := range []Options{{SegmentSize: -1}, {Sync: SyncInterval(-time.Second)}} {
		_, err := Open(t.TempDir(), o)
		assert.ErrorIs(t, err, ErrInvalidOptions)
	}
}

func TestClosed(t *testing.T) {
	l := openT(t, t.TempDir(), Options{}, nil)
	commit(t, l, "a=1")
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	var b Batch
	b.Put([]byte("b"), nil)
	assert.ErrorIs(t, l.Commit(&b), ErrClosed)
	assert.ErrorIs(t, l.CommitAsync(&b), ErrClosed)
	assert.ErrorIs(t, l.Sync(), ErrClosed)
	_, _, err := l.Get([]byte("a"))
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, l.Range(func(k, v []byte) bool { return true }), ErrClosed)
	assert.Equal(t, 1, l.Stats().LiveKeys, "Stats works after Close")
}

func TestNilAndEmptyBatch(t *testing.T) {
	l := openT(t, t.TempDir(), Options{}, nil)
	require.NoError(t, l.Commit(nil))
	require.NoError(t, l.Commit(&Batch{}))
	require.NoError(t, l.CommitAsync(nil))
	require.NoError(t, l.Sync())
	assert.Empty(t, contents(t, l))
}

func TestCommitAsyncOrderAndDurability(t *testing.T) {
	fs := &faultFS{noSync: true}
	dir := t.TempDir()
	l := openT(t, dir, Options{}, fs)
	commit(t, l, "a=1", "b=2")
	syncs := fs.syncs.Load()
	var b Batch
	b.Delete([]byte("a"))
	require.NoError(t, l.CommitAsync(&b))
	b.Reset() // CommitAsync copied the batch
	b.Put([]byte("c"), []byte("3"))
	require.NoError(t, l.CommitAsync(&b))

	// With nothing else coming, the background sync covers them (SyncAlways:
	// within asyncSyncDelay).
	require.Eventually(t, func() bool { return fs.syncs.Load() > syncs }, 10*time.Second, time.Millisecond)
	assert.Equal(t, map[string]string{"b": "2", "c": "3"}, contents(t, l))

	// A Commit after CommitAsyncs is ordered after them and its sync covers them.
	b.Reset()
	b.Put([]byte("a"), []byte("again"))
	require.NoError(t, l.CommitAsync(&b))
	commit(t, l, "a")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, map[string]string{"b": "2", "c": "3"}, contents(t, l))
}

func TestSyncInterval(t *testing.T) {
	fs := &faultFS{noSync: true}
	dir := t.TempDir()
	l := openT(t, dir, Options{Sync: SyncInterval(time.Hour)}, fs)
	syncs := fs.syncs.Load()
	commit(t, l, "a=1")
	commit(t, l, "b=2")
	assert.Equal(t, syncs, fs.syncs.Load(), "Commit does not sync under SyncInterval")
	assert.Equal(t, map[string]string{"a": "1", "b": "2"}, contents(t, l))
	require.NoError(t, l.Sync())
	assert.Equal(t, syncs+1, fs.syncs.Load(), "Sync syncs")
	require.NoError(t, l.Sync())
	assert.Equal(t, syncs+1, fs.syncs.Load(), "nothing to sync")
	require.NoError(t, l.Close())

	l = openT(t, dir, Options{Sync: SyncInterval(5 * time.Millisecond)}, fs)
	syncs = fs.syncs.Load()
	commit(t, l, "c=3")
	require.Eventually(t, func() bool { return fs.syncs.Load() > syncs }, 10*time.Second, time.Millisecond,
		"the background sync comes within the interval")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, map[string]string{"a": "1", "b": "2", "c": "3"}, contents(t, l))
}

// TestGroupCommit holds the first fdatasync until N-1 more Commits are queued
// behind it: they must all share the next one.
func TestGroupCommit(t *testing.T) {
	const n = 100
	fs := &faultFS{noSync: true}
	l := openT(t, t.TempDir(), Options{}, fs)
	base := fs.syncs.Load()
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	fs.setSyncHook(func() {
		once.Do(func() {
			close(entered)
			<-release
		})
	})
	errs := make(chan error, n)
	go func() {
		var b Batch
		b.Put([]byte("first"), nil)
		errs <- l.Commit(&b)
	}()
	<-entered
	for i := 1; i < n; i++ {
		go func() {
			var b Batch
			b.Put(fmt.Appendf(nil, "k%03d", i), []byte("v"))
			errs <- l.Commit(&b)
		}()
	}
	require.Eventually(t, func() bool { return len(l.reqs) == n-1 }, 10*time.Second, time.Millisecond)
	close(release)
	for range n {
		require.NoError(t, <-errs)
	}
	syncs := fs.syncs.Load() - base
	t.Logf("%d concurrent Commits, %d fdatasyncs", n, syncs)
	assert.LessOrEqual(t, syncs, int64(2))
	assert.Equal(t, uint64(n), l.Stats().Commits)
	assert.Len(t, contents(t, l), n)
}

func TestConcurrentUse(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 2048}, nil)
	const writers, each = 4, 150
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			var b Batch
			for i := range each {
				b.Reset()
				b.Put(fmt.Appendf(nil, "%d/%03d", g, i), fmt.Appendf(nil, "value %d %d", g, i))
				if i >= 10 {
					b.Delete(fmt.Appendf(nil, "%d/%03d", g, i-10))
				}
				if i%3 == 0 {
					assert.NoError(t, l.CommitAsync(&b))
				} else {
					assert.NoError(t, l.Commit(&b))
				}
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				assert.NoError(t, l.Range(func(k, v []byte) bool {
					assert.True(t, strings.HasPrefix(string(v), "value "), "value %q", v)
					return true
				}))
				_, _, err := l.Get([]byte("0/149"))
				assert.NoError(t, err)
				_ = l.Stats()
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	require.NoError(t, l.Sync())
	want := map[string]string{}
	for g := range writers {
		for i := each - 10; i < each; i++ {
			want[fmt.Sprintf("%d/%03d", g, i)] = fmt.Sprintf("value %d %d", g, i)
		}
	}
	assert.Equal(t, want, contents(t, l))
	// Readers may have held removal off; it happens after a later group.
	require.Eventually(t, func() bool {
		require.NoError(t, l.Sync())
		return l.Stats().SegmentsRemoved > 0
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{}, nil)
	assert.Equal(t, want, contents(t, l))
}

// TestRangeReentrant: fn may call the Log, even Close, and may panic.
func TestRangeReentrant(t *testing.T) {
	l := openT(t, t.TempDir(), Options{SegmentSize: 256}, nil)
	commit(t, l, "a=1", "b=2")
	require.NoError(t, l.Range(func(k, v []byte) bool {
		commit(t, l, "c=3", string(k)) // removal is postponed, not deadlocked
		_, _, err := l.Get([]byte("c"))
		assert.NoError(t, err)
		assert.NoError(t, l.Range(func(k, v []byte) bool { return true }))
		return true
	}))
	assert.Equal(t, map[string]string{"c": "3"}, contents(t, l))
	assert.Panics(t, func() {
		_ = l.Range(func(k, v []byte) bool { panic("boom") })
	})
	commit(t, l, "d=4") // the panic released the read lock: removal works again
	var closeErr error
	err := l.Range(func(k, v []byte) bool {
		closeErr = l.Close()
		return true
	})
	require.NoError(t, closeErr)
	assert.True(t, err == nil || errors.Is(err, ErrClosed), "got %v", err)
}

// checkNothingLost reopens dir and checks that every key in committed is there
// with its value, and that every key there was at least attempted.
func checkNothingLost(t *testing.T, dir string, committed, attempted map[string]string) {
	t.Helper()
	l, err := Open(dir, Options{})
	require.NoError(t, err)
	defer l.Close()
	got := contents(t, l)
	for k, v := range committed {
		assert.Equal(t, v, got[k], "key %s reported committed", k)
	}
	for k, v := range got {
		assert.Equal(t, attempted[k], v, "key %s was never written", k)
	}
}

func TestFailedSync(t *testing.T) {
	fs := &faultFS{noSync: true}
	dir := t.TempDir()
	l := openT(t, dir, Options{}, fs)
	committed, attempted := map[string]string{}, map[string]string{}
	for i := range 5 {
		k := fmt.Sprint("before", i)
		commit(t, l, k+"=v")
		committed[k], attempted[k] = "v", "v"
	}
	fs.failSyncs(errIO, 0)
	const n = 20
	type result struct {
		key string
		err error
	}
	results := make(chan result, n)
	for i := range n {
		k := fmt.Sprint("during", i)
		attempted[k] = "v"
		go func() {
			var b Batch
			b.Put([]byte(k), []byte("v"))
			results <- result{k, l.Commit(&b)}
		}()
	}
	for range n {
		r := <-results
		require.Error(t, r.err, "nothing was synced")
		assert.ErrorIs(t, r.err, ErrFailed)
		assert.ErrorIs(t, r.err, errIO, "the covered Commits get the cause")
	}
	var b Batch
	b.Put([]byte("after"), []byte("v"))
	assert.ErrorIs(t, l.Commit(&b), ErrFailed)
	assert.ErrorIs(t, l.CommitAsync(&b), ErrFailed)
	assert.ErrorIs(t, l.Sync(), ErrFailed)
	assert.ErrorIs(t, l.Close(), ErrFailed)
	fs.failSyncs(nil, 0)
	checkNothingLost(t, dir, committed, attempted)
}

func TestFailedWrite(t *testing.T) {
	fs := &faultFS{noSync: true}
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 4096}, fs)
	committed, attempted := map[string]string{}, map[string]string{}
	var failed error
	for i := 0; failed == nil; i++ {
		if i == 30 {
			fs.failWrites(errNoSpace, 0) // the disk is full from now on
		}
		k, v := fmt.Sprint("k", i), strings.Repeat("v", i)
		attempted[k] = v
		var b Batch
		b.Put([]byte(k), []byte(v))
		if err := l.Commit(&b); err != nil {
			failed = err
		} else {
			committed[k] = v
		}
	}
	assert.ErrorIs(t, failed, errNoSpace, "the covered Commit gets the cause")
	assert.ErrorIs(t, failed, ErrFailed)
	assert.Len(t, committed, 30)
	var b Batch
	assert.ErrorIs(t, l.Commit(&b), ErrFailed)
	assert.ErrorIs(t, l.Close(), ErrFailed)
	fs.failWrites(nil, 0)
	checkNothingLost(t, dir, committed, attempted)

	// The half-written record was a torn tail, cut on reopen.
	l2, err := Open(dir, Options{})
	require.NoError(t, err)
	assert.Empty(t, l2.Recovery().Cuts, "the first reopen cut it already")
	require.NoError(t, l2.Close())
}

// TestFailedRoll fails the creation of a new segment.
func TestFailedRoll(t *testing.T) {
	fs := &faultFS{noSync: true}
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 200}, fs)
	committed := map[string]string{}
	commit(t, l, "a="+strings.Repeat("x", 100))
	committed["a"] = strings.Repeat("x", 100)
	fs.failSyncs(errIO, 0) // the sync of the new segment's header fails
	var b Batch
	b.Put([]byte("b"), []byte(strings.Repeat("y", 100)))
	err := l.Commit(&b)
	assert.ErrorIs(t, err, ErrFailed)
	assert.ErrorIs(t, err, errIO)
	l.Close()
	fs.failSyncs(nil, 0)
	checkNothingLost(t, dir, committed, map[string]string{"a": committed["a"], "b": strings.Repeat("y", 100)})
}

func TestSegmentNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   uint64
		ok   bool
	}{
		{"00000000000000000001.wal", 1, true},
		{"18446744073709551615.wal", 1<<64 - 1, true},
		{"18446744073709551616.wal", 0, false},
		{"0000000000000000001.wal", 0, false},
		{"00000000000000000001.wal.corrupt-0", 0, false},
		{"0000000000000000000a.wal", 0, false},
		{"LOCK", 0, false},
	} {
		id, ok := parseSegName(tc.name)
		assert.Equal(t, tc.ok, ok, tc.name)
		assert.Equal(t, tc.id, id, tc.name)
		if ok {
			assert.Equal(t, tc.name, segName(id))
		}
	}
	assert.Equal(t, "00000000000000000007.wal", filepath.Base(segName(7)))
}

// Grow keeps what the batch holds and makes room for more.
func TestBatchGrowKeepsOps(t *testing.T) {
	var b Batch
	b.Grow(100)
	b.Put([]byte("a"), []byte("1"))
	b.Grow(1000)
	b.Delete([]byte("b"))
	require.Equal(t, 2, b.Len())
	l := openT(t, t.TempDir(), Options{}, nil)
	require.NoError(t, l.Commit(&b))
	v, ok, err := l.Get([]byte("a"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "1", string(v))
	var fresh Batch
	fresh.Grow(64)
	val := make([]byte, 32)
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		fresh.Reset()
		fresh.Put([]byte("key"), val)
	}), "a Put into a grown batch allocates")
}

// awaitCohort sleeps until as many committers as recent groups had are
// queued again, woken by the one that completes the cohort; it never waits
// for a lone committer, and stragglers that never come end the wait.
func TestAwaitCohort(t *testing.T) {
	newLog := func(cohort int, lastSync time.Duration) *Log {
		l := &Log{reqs: make(chan *request, 16), cohortFull: make(chan struct{}, 1), opts: Options{SegmentSize: 1 << 20}}
		l.w.cohort, l.w.lastSync = cohort, lastSync
		return l
	}
	commit := func() *request { return &request{rec: make([]byte, 10), done: make(chan error, 1)} }
	timer := time.NewTimer(time.Hour)
	timer.Stop()

	old := maxCohortWait
	maxCohortWait = time.Hour // with lastSync an hour, only the cohort can end a wait
	defer func() { maxCohortWait = old }()
	// wait runs awaitCohort on l and returns a channel closed when it returns.
	wait := func(l *Log) <-chan struct{} {
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			l.awaitCohort([]*request{commit()}, timer)
		}()
		return returned
	}
	atOnce := func(l *Log, what string) {
		t.Helper()
		select {
		case <-wait(l):
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: awaitCohort waited", what)
		}
	}

	l := newLog(5, time.Hour)
	returned := wait(l)
	for range 3 {
		require.NoError(t, l.send(&request{rec: make([]byte, 10)})) // a CommitAsync does not count
		require.NoError(t, l.send(commit()))
	}
	select {
	case <-returned:
		t.Fatal("awaitCohort returned with 3 of the 4 other committers queued")
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, l.send(commit()))
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the committer completing the cohort did not wake the writer")
	}
	assert.Len(t, l.reqs, 7, "the requests are left for gather")
	assert.Zero(t, l.want.Load(), "the wait is over")

	l = newLog(3, time.Hour)
	require.NoError(t, l.send(commit()))
	require.NoError(t, l.send(commit()))
	atOnce(l, "the cohort was back before the wait")

	atOnce(newLog(1, time.Hour), "a lone committer")

	// Stragglers that never come: the wait ends after 2 syncs (2 ms here).
	atOnce(newLog(64, time.Millisecond), "stragglers")
}

// recordCRC folds the salt in without crc32.Update (to save an allocation):
// the result must be what the format specifies, the CRC-32C of the salt's 4
// little-endian bytes, the length field and the body.
func TestRecordCRCMatchesSpec(t *testing.T) {
	rec := make([]byte, 64)
	for i := range rec {
		rec[i] = byte(i * 7)
	}
	for _, salt := range []uint32{0, 1, 0xdeadbeef, 0xffffffff, 0x80000000} {
		spec := append(binary.LittleEndian.AppendUint32(nil, salt), rec[0:4]...)
		spec = append(spec, rec[recHeaderLen:]...)
		assert.Equal(t, crc32.Checksum(spec, castagnoli), recordCRC(salt, rec), "salt %#x", salt)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { recordCRC(7, rec) }))
}

// CommitAsync batches wait in asyncOps, merged into records of at most
// about limit bytes, in order; the first one asks for a wake-up, and the
// caller is told to wait once more than behind bytes wait. take empties it.
func TestAsyncOpsMerge(t *testing.T) {
	a := &asyncOps{limit: 100, behind: 150}
	rec := func(keys ...string) []byte {
		var b Batch
		for _, k := range keys {
			b.Put([]byte(k), make([]byte, 20))
		}
		return slices.Clone(b.record())
	}
	ops := func(r []byte) (keys []string) {
		sealRecord(r, 2, 1, 0) // decodeBody wants a seq above the watermark
		d, err := decodeBody(r, nil)
		require.NoError(t, err)
		for _, o := range d.ops {
			keys = append(keys, string(o.key))
		}
		return keys
	}
	var spare Batch
	var got [][]string
	collect := func(r []byte) error { got = append(got, ops(slices.Clone(r))); return nil }

	wake, behind := a.add(rec("a"))
	assert.True(t, wake, "the first batch asks for the writer")
	assert.False(t, behind)
	wake, _ = a.add(rec("b", "c"))
	assert.False(t, wake, "a request is already on its way")
	require.NoError(t, a.take(&spare, collect))
	assert.Equal(t, [][]string{{"a", "b", "c"}}, got, "two batches, one record, in order")
	assert.False(t, a.queued)

	got = nil
	wake, _ = a.add(rec("d", "e")) // 2 ops of 23 bytes: 46 bytes of body
	assert.True(t, wake, "after a take, the next batch asks again")
	_, behind = a.add(rec("f", "g")) // 92 bytes would pass the limit: a new record
	assert.False(t, behind)
	_, behind = a.add(rec("h", "i", "j"))
	assert.True(t, behind, "more than 150 bytes wait")
	require.NoError(t, a.take(&spare, collect))
	assert.Equal(t, [][]string{{"d", "e"}, {"f", "g"}, {"h", "i", "j"}}, got)

	got = nil
	require.NoError(t, a.take(&spare, collect))
	assert.Empty(t, got, "nothing waits")
}

// A record of directRecord bytes or more is written from its batch, in its
// place among the group's records; the batch may be reused as soon as
// Commit returns, and what the log holds is unchanged by that.
func TestLargeRecordsKeepTheirPlaceAndTheirBytes(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	big := strings.Repeat("b", 3*directRecord)
	want := map[string]string{}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			var b Batch
			for i := range 20 {
				k, v := fmt.Sprintf("g%d/%02d", g, i), fmt.Sprint(i)
				if i%5 == 0 {
					v = big
				}
				b.Reset()
				b.Put([]byte(k), []byte(v))
				b.Put([]byte(fmt.Sprintf("g%d/last", g)), []byte(k))
				assert.NoError(t, l.Commit(&b))
				for j := range b.buf { // reuse the batch's bytes at once
					b.buf[j] = 'x'
				}
			}
		})
		for i := range 20 {
			k, v := fmt.Sprintf("g%d/%02d", g, i), fmt.Sprint(i)
			if i%5 == 0 {
				v = big
			}
			want[k] = v
		}
		want[fmt.Sprintf("g%d/last", g)] = fmt.Sprintf("g%d/19", g)
	}
	wg.Wait()
	assert.True(t, maps.Equal(want, contents(t, l)), "what the log holds")
	require.NoError(t, l.Close())
	l = openT(t, dir, Options{}, nil)
	assert.True(t, maps.Equal(want, contents(t, l)), "after a reopen")
}
