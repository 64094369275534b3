package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// CommitAsync in one goroutine, then (after a channel hand-off) Commit in
// another: once the Commit returns, the async batch is visible and durable
// (it survives a power loss cut at the last fdatasync).
func TestCommitAsyncHappensBeforeALaterCommit(t *testing.T) {
	for _, useSync := range []bool{false, true} {
		t.Run(fmt.Sprint("sync=", useSync), func(t *testing.T) {
			var s syncedSizes
			dir := t.TempDir()
			l, err := open(dir, Options{}, hookFS{&faultFS{noSync: true}, s.faults()})
			require.NoError(t, err)
			defer l.Close()
			const pairs, each = 4, 150
			var wg sync.WaitGroup
			for p := range pairs {
				ch := make(chan int)
				wg.Go(func() {
					defer close(ch)
					for i := range each {
						if !assert.NoError(t, l.CommitAsync(putBatch(fmt.Sprintf("a/%d/%d", p, i), "v"))) {
							return
						}
						ch <- i
					}
				})
				wg.Go(func() {
					for i := range ch {
						var err error
						if useSync {
							err = l.Sync()
						} else {
							err = l.Commit(putBatch(fmt.Sprintf("b/%d/%d", p, i), "v"))
						}
						if !assert.NoError(t, err) {
							continue
						}
						_, ok, err := l.Get(fmt.Appendf(nil, "a/%d/%d", p, i))
						assert.NoError(t, err)
						assert.True(t, ok, "pair %d: async batch %d not visible after a later Commit/Sync returned", p, i)
					}
				})
			}
			wg.Wait()
			// A power loss now keeps every async batch: each was covered by
			// the sync of a Commit or Sync ordered after it.
			cut := s.powerLoss(t, dir)
			l2 := openT(t, cut, Options{}, nil)
			got := contents(t, l2)
			for p := range pairs {
				for i := range each {
					assert.Contains(t, got, fmt.Sprintf("a/%d/%d", p, i))
				}
			}
		})
	}
}

// Close writes and syncs every CommitAsync batch that returned nil before it,
// also while CommitAsyncs race with it; afterwards they all get ErrClosed.
func TestCloseSyncsEveryAcceptedAsyncBatch(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval(time.Hour)} {
		t.Run(fmt.Sprint(time.Duration(policy)), func(t *testing.T) {
			var s syncedSizes
			dir := t.TempDir()
			l, err := open(dir, Options{SegmentSize: 32 << 10, Sync: policy}, hookFS{&faultFS{noSync: true}, s.faults()})
			require.NoError(t, err)
			var mu sync.Mutex
			ok := map[string]bool{}
			var wg sync.WaitGroup
			started := make(chan struct{})
			var startOnce sync.Once
			for g := range 6 {
				wg.Go(func() {
					for i := 0; ; i++ {
						k := fmt.Sprintf("%d/%05d", g, i)
						err := l.CommitAsync(putBatch(k, strings.Repeat("v", 300)))
						if err != nil {
							assert.ErrorIs(t, err, ErrClosed)
							return
						}
						mu.Lock()
						ok[k] = true
						mu.Unlock()
						if i == 50 {
							startOnce.Do(func() { close(started) })
						}
					}
				})
			}
			closedWithin(t, started, "CommitAsyncs")
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				assert.NoError(t, l.Close())
			}()
			closedWithin(t, closed, "Close")
			joined := make(chan struct{})
			go func() { wg.Wait(); close(joined) }()
			closedWithin(t, joined, "CommitAsyncs returning after Close")
			// The log as a power loss right after Close would leave it.
			cut := s.powerLoss(t, dir)
			l2 := openT(t, cut, Options{}, nil)
			got := contents(t, l2)
			missing := 0
			for k := range ok {
				if _, found := got[k]; !found {
					missing++
				}
			}
			assert.Zero(t, missing, "of %d CommitAsyncs that returned nil before Close, %d are not durable", len(ok), missing)
		})
	}
}

// Get and Range see a CommitAsync batch once the writer wrote it, with no
// other call to carry it.
func TestAsyncBatchIsVisibleWithoutOtherCalls(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval(time.Hour)} {
		t.Run(fmt.Sprint(time.Duration(policy)), func(t *testing.T) {
			l := openT(t, t.TempDir(), Options{Sync: policy}, nil)
			for i := range 5 {
				k := fmt.Sprint("k", i)
				require.NoError(t, l.CommitAsync(putBatch(k, "v")))
				require.Eventually(t, func() bool {
					_, ok, err := l.Get([]byte(k))
					require.NoError(t, err)
					return ok
				}, settleWait, 100*time.Microsecond, "batch %d never written", i)
			}
			assert.Len(t, contents(t, l), 5)
		})
	}
}

// Stats agrees with the directory and with Range, before and after Close.
func TestStatsAgreeWithTheDirectoryAndRange(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentSize: 4096}, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 400 {
				var b Batch
				b.Put(fmt.Appendf(nil, "%d/%03d", g, i), []byte(strings.Repeat("s", 40)))
				if i >= 7 {
					b.Delete(fmt.Appendf(nil, "%d/%03d", g, i-7))
				}
				if i%5 == 0 {
					assert.NoError(t, l.Commit(&b))
				} else {
					assert.NoError(t, l.CommitAsync(&b))
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, l.Sync())
	st := l.Stats()
	got := contents(t, l)
	assert.Equal(t, 4*7, st.LiveKeys)
	assert.Len(t, got, st.LiveKeys)
	assert.Positive(t, st.LiveBytes)
	assert.LessOrEqual(t, st.LiveBytes, st.DiskBytes)
	assert.Positive(t, st.Commits)
	assert.Positive(t, st.Syncs)
	require.NoError(t, l.Close())
	after := l.Stats()
	var disk int64
	segs := 0
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if _, ok := parseSegName(e.Name()); ok {
			info, err := e.Info()
			require.NoError(t, err)
			disk += info.Size()
			segs++
		}
	}
	assert.Equal(t, disk, after.DiskBytes, "DiskBytes after Close is the segments' size")
	assert.Equal(t, segs, after.Segments)
	assert.Equal(t, st.LiveKeys, after.LiveKeys)
	assert.GreaterOrEqual(t, after.Commits, st.Commits)
	l2 := openT(t, dir, Options{}, nil)
	assert.Equal(t, got, contents(t, l2))
	assert.Equal(t, after.LiveBytes, l2.Stats().LiveBytes, "live bytes are what a replay counts")
}

// Pooled requests under heavy mixed use with the race detector: every
// Commit gets its own answer (a reused request answered twice, or read after
// its answer, shows up as a wrong error, a lost batch or a data race).
func TestPooledRequestsUnderChurn(t *testing.T) {
	l := openT(t, t.TempDir(), Options{SegmentSize: 64 << 10}, nil)
	var wg sync.WaitGroup
	var commits atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := range 300 {
				k := fmt.Sprintf("%02d/%03d", g, i)
				var err error
				switch i % 5 {
				case 0:
					err = l.Sync()
				case 1:
					err = l.CommitAsync(putBatch(k, k))
				default:
					err = l.Commit(putBatch(k, k))
					if err == nil {
						commits.Add(1)
						v, ok, gerr := l.Get([]byte(k))
						assert.NoError(t, gerr)
						assert.True(t, ok && string(v) == k, "Commit of %s returned before it was applied", k)
					}
				}
				if !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, l.Sync())
	got := contents(t, l)
	assert.Len(t, got, 16*300*4/5)
	assert.Equal(t, int64(16*300*3/5), commits.Load())
	assert.False(t, errors.Is(l.failure(), ErrFailed))
}

// The request that makes the writer take the CommitAsync batches is not
// allocated per call: an acknowledgement costs the log no allocation, nor a
// Sync (its request and done channel are pooled).
func TestCommitAsyncAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := openT(t, t.TempDir(), Options{}, nil)
	var b Batch
	key := []byte("ack")
	step := func() {
		b.Reset()
		b.Delete(key)
		if err := l.CommitAsync(&b); err != nil { // wakes the writer: Sync took the batches before
			t.Fatal(err)
		}
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	step() // the buffers' first growth
	assert.Zero(t, testing.AllocsPerRun(200, step), "a CommitAsync or a Sync allocates")
}
