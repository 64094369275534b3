package wal

import (
	"errors"
	"fmt"
	"math/rand/v2"
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

// Review 2: attacks on CommitAsync's buffer, awaitCohort and the pooled
// requests.

const r2Wait = 10 * time.Second

// r2Within fails the test unless ch is closed within the bound.
func r2Within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(r2Wait):
		t.Fatalf("%s did not happen in time", what)
	}
}

func r2Batch(kv ...string) *Batch {
	var b Batch
	for i := 0; i+1 < len(kv); i += 2 {
		b.Put([]byte(kv[i]), []byte(kv[i+1]))
	}
	return &b
}

// r2Synced records, per file, the size that the last successful fdatasync
// made durable.
type r2Synced struct {
	mu   sync.Mutex
	size map[string]int64
}

func (s *r2Synced) faults() *Faults {
	s.size = map[string]int64{}
	return &Faults{Synced: func(name string, size int64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.size[filepath.Base(name)] = size
	}}
}

// powerLoss copies dir to a new directory as a power loss would leave it:
// each segment cut to what its last fdatasync covered (a segment never synced
// after its header keeps its header only).
func (s *r2Synced) powerLoss(t *testing.T, dir string) string {
	t.Helper()
	s.mu.Lock()
	sizes := make(map[string]int64, len(s.size))
	for k, v := range s.size {
		sizes[k] = v
	}
	s.mu.Unlock()
	out := t.TempDir()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if _, ok := parseSegName(e.Name()); !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		n, ok := sizes[e.Name()]
		if !ok {
			n = headerLen
		}
		data = data[:min(int64(len(data)), n)]
		require.NoError(t, os.WriteFile(filepath.Join(out, e.Name()), data, 0o644))
	}
	return out
}

// The cohort estimate must fall back to 1 once the concurrency is gone, or a
// lone committer waits min(2*lastSync, maxCohortWait) for peers that never
// come, on every Commit ("A lone committer never waits; after the
// concurrency drops, the wait shrinks with it").
func TestReview2CohortDecaysForLoneCommitter(t *testing.T) {
	fs := &faultFS{noSync: true}
	l := openT(t, t.TempDir(), Options{}, fs)
	r2Burst(t, l, fs, 20, nil)
	// Only this goroutine commits from now on: the writer wrote w.cohort
	// before answering it, and touches it again only for the next request.
	require.NoError(t, l.Commit(r2Batch("lone", "v"))) // waits once, for the cohort that is gone
	for i := range 2 {
		require.NoError(t, l.Commit(r2Batch(fmt.Sprint("lone", i), "v")))
	}
	assert.LessOrEqual(t, l.w.cohort, 1,
		"after 3 lone Commits the writer still waits for a cohort of %d committers on every Commit", l.w.cohort)
}

// The waiting count (requests with a done channel queued) and want return to
// zero whatever mix of Commit, Sync, CommitAsync (with its "behind" waits)
// and SyncInterval ran.
func TestReview2CohortCountersSettle(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval(time.Millisecond)} {
		t.Run(fmt.Sprint(time.Duration(policy)), func(t *testing.T) {
			l := openT(t, t.TempDir(), Options{SegmentSize: 4096, Sync: policy}, nil)
			val := strings.Repeat("x", 700) // a few CommitAsyncs pass "behind" (4 KiB)
			var wg sync.WaitGroup
			for g := range 12 {
				wg.Go(func() {
					for i := range 150 {
						b := r2Batch(fmt.Sprintf("%d/%d", g, i%20), val)
						var err error
						switch (g + i) % 4 {
						case 0:
							err = l.Commit(b)
						case 1:
							err = l.Sync()
						default:
							err = l.CommitAsync(b)
						}
						if !assert.NoError(t, err) {
							return
						}
					}
				})
			}
			wg.Wait()
			assert.Zero(t, l.waiting.Load(), "every request with done was received")
			require.Eventually(t, func() bool { return l.want.Load() == 0 }, r2Wait, time.Millisecond)
			require.NoError(t, l.Close())
			assert.Zero(t, l.waiting.Load())
		})
	}
}

// CommitAsync in one goroutine, then (after a channel hand-off) Commit in
// another: once the Commit returns, the async batch is visible and durable
// (it survives a power loss cut at the last fdatasync).
func TestReview2AsyncHappensBeforeLaterCommit(t *testing.T) {
	for _, useSync := range []bool{false, true} {
		t.Run(fmt.Sprint("sync=", useSync), func(t *testing.T) {
			var s r2Synced
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
						if !assert.NoError(t, l.CommitAsync(r2Batch(fmt.Sprintf("a/%d/%d", p, i), "v"))) {
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
							err = l.Commit(r2Batch(fmt.Sprintf("b/%d/%d", p, i), "v"))
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

// Merged CommitAsync batches stay all-or-nothing, and in order, whatever
// byte the last segment is cut at.
func TestReview2AsyncBatchesAtomicUnderTornTail(t *testing.T) {
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

// Close writes and syncs every CommitAsync batch that returned nil before it,
// also while CommitAsyncs race with it; afterwards they all get ErrClosed.
func TestReview2CloseSyncsAsync(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval(time.Hour)} {
		t.Run(fmt.Sprint(time.Duration(policy)), func(t *testing.T) {
			var s r2Synced
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
						err := l.CommitAsync(r2Batch(k, strings.Repeat("v", 300)))
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
			r2Within(t, started, "CommitAsyncs")
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				assert.NoError(t, l.Close())
			}()
			r2Within(t, closed, "Close")
			joined := make(chan struct{})
			go func() { wg.Wait(); close(joined) }()
			r2Within(t, joined, "CommitAsyncs returning after Close")
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

// With the writer stuck in an fdatasync, CommitAsyncs pile up past "behind"
// and one waits for the writer holding closeMu shared; Close comes in
// between. Releasing the sync must let everything return, and nothing that
// returned nil may be lost.
func TestReview2BehindWaitVersusClose(t *testing.T) {
	fs := &faultFS{noSync: true}
	dir := t.TempDir()
	l, err := open(dir, Options{SegmentSize: 8 << 10}, fs)
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fs.setSyncHook(func() { once.Do(func() { close(entered); <-release }) })
	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		assert.NoError(t, l.Commit(r2Batch("held", "v")))
	}()
	r2Within(t, entered, "the held sync")

	var mu sync.Mutex
	ok := map[string]bool{}
	asyncDone := make(chan struct{})
	go func() {
		defer close(asyncDone)
		for i := 0; ; i++ {
			k := fmt.Sprintf("async/%05d", i)
			if err := l.CommitAsync(r2Batch(k, strings.Repeat("a", 500))); err != nil {
				assert.ErrorIs(t, err, ErrClosed)
				return
			}
			mu.Lock()
			ok[k] = true
			mu.Unlock()
		}
	}()
	require.Eventually(t, func() bool {
		l.async.mu.Lock()
		defer l.async.mu.Unlock()
		return l.async.size > l.async.behind
	}, r2Wait, time.Millisecond, "CommitAsync reaches its behind wait")
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = l.Close()
	}()
	// Close is waiting for closeMu (a writer is pending: TryRLock fails).
	require.Eventually(t, func() bool {
		if l.closeMu.TryRLock() {
			l.closeMu.RUnlock()
			return false
		}
		return true
	}, r2Wait, time.Millisecond)
	commitAfter := make(chan error, 1)
	go func() { commitAfter <- l.Commit(r2Batch("late", "v")) }()
	close(release)
	r2Within(t, commitDone, "the held Commit")
	r2Within(t, asyncDone, "the CommitAsync waiting behind")
	r2Within(t, closed, "Close")
	select {
	case err := <-commitAfter:
		if err != nil {
			assert.ErrorIs(t, err, ErrClosed)
		}
	case <-time.After(r2Wait):
		t.Fatal("a Commit racing with Close hangs")
	}
	l2 := openT(t, dir, Options{}, nil)
	got := contents(t, l2)
	for k := range ok {
		assert.Contains(t, got, k)
	}
	assert.Contains(t, got, "held")
}

// After an injected write or sync failure, every kind of call returns (with
// ErrFailed once failed), CommitAsyncs waiting behind included, and Close
// does not hang; nothing reported committed is lost.
func TestReview2FailureNeverHangs(t *testing.T) {
	for _, tc := range []struct {
		name string
		arm  func(fs *faultFS)
	}{
		{"write", func(fs *faultFS) { fs.failWrites(errNoSpace, 20) }},
		{"sync", func(fs *faultFS) { fs.failSyncs(errIO, 5) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := &faultFS{noSync: true}
			dir := t.TempDir()
			l, err := open(dir, Options{SegmentSize: 4096}, fs)
			require.NoError(t, err)
			tc.arm(fs)
			var mu sync.Mutex
			committed, attempted := map[string]string{}, map[string]string{}
			var wg sync.WaitGroup
			for g := range 10 {
				wg.Go(func() {
					for i := 0; i < 10_000; i++ {
						k, v := fmt.Sprintf("%d/%d", g, i), strings.Repeat("v", 400)
						mu.Lock()
						attempted[k] = v
						mu.Unlock()
						var err error
						switch i % 3 {
						case 0:
							err = l.Commit(r2Batch(k, v))
							if err == nil {
								mu.Lock()
								committed[k] = v
								mu.Unlock()
							}
						case 1:
							err = l.CommitAsync(r2Batch(k, v))
						default:
							err = l.Sync()
						}
						if err != nil {
							assert.ErrorIs(t, err, ErrFailed)
							return
						}
					}
					t.Errorf("goroutine %d never saw the failure", g)
				})
			}
			joined := make(chan struct{})
			go func() { wg.Wait(); close(joined) }()
			r2Within(t, joined, "every caller returning after the failure")
			assert.ErrorIs(t, l.Commit(r2Batch("after", "v")), ErrFailed)
			assert.ErrorIs(t, l.CommitAsync(r2Batch("after", "v")), ErrFailed)
			assert.ErrorIs(t, l.Sync(), ErrFailed)
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				assert.ErrorIs(t, l.Close(), ErrFailed)
			}()
			r2Within(t, closed, "Close of a failed log")
			fs.failWrites(nil, 0)
			fs.failSyncs(nil, 0)
			checkNothingLost(t, dir, committed, attempted)
		})
	}
}

// Get and Range see a CommitAsync batch once the writer wrote it, with no
// other call to carry it.
func TestReview2AsyncVisibleWithoutOtherCalls(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval(time.Hour)} {
		t.Run(fmt.Sprint(time.Duration(policy)), func(t *testing.T) {
			l := openT(t, t.TempDir(), Options{Sync: policy}, nil)
			for i := range 5 {
				k := fmt.Sprint("k", i)
				require.NoError(t, l.CommitAsync(r2Batch(k, "v")))
				require.Eventually(t, func() bool {
					_, ok, err := l.Get([]byte(k))
					require.NoError(t, err)
					return ok
				}, r2Wait, 100*time.Microsecond, "batch %d never written", i)
			}
			assert.Len(t, contents(t, l), 5)
		})
	}
}

// Stats agrees with the directory and with Range, before and after Close.
func TestReview2StatsSane(t *testing.T) {
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

// A steady put/delete load keeps the directory at a few small segments even
// when the oldest segment is mostly live: here the first segment holds values
// that stay (a backlog nobody consumes), a little over half of it, and a
// churn of put/delete pairs (TestBoundedDisk's load) follows. Dead segments
// can only be removed oldest first, so the oldest must be compacted away for
// anything behind it to go.
func TestReview2BoundedDiskBehindMostlyLiveOldest(t *testing.T) {
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

// Pooled requests under heavy mixed use with the race detector: every
// Commit gets its own answer (a reused request answered twice, or read after
// its answer, shows up as a wrong error, a lost batch or a data race).
func TestReview2PooledRequestsUnderChurn(t *testing.T) {
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
					err = l.CommitAsync(r2Batch(k, k))
				default:
					err = l.Commit(r2Batch(k, k))
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

// r2Burst makes n committers share one group: the first Commit's fdatasync
// is held until the n-1 others are queued. every, if not nil, runs in every
// fdatasync after that. It returns once all n returned and checks that the
// writer's cohort estimate rose.
func r2Burst(t *testing.T, l *Log, fs *faultFS, n int, every func()) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fs.setSyncHook(func() {
		once.Do(func() { close(entered); <-release })
		if every != nil {
			every()
		}
	})
	errs := make(chan error, n)
	go func() { errs <- l.Commit(r2Batch("first", "v")) }()
	r2Within(t, entered, "the first sync")
	for i := 1; i < n; i++ {
		go func() { errs <- l.Commit(r2Batch(fmt.Sprint("k", i), "v")) }()
	}
	require.Eventually(t, func() bool { return len(l.reqs) == n-1 }, r2Wait, time.Millisecond)
	close(release)
	for range n {
		require.NoError(t, <-errs)
	}
	require.GreaterOrEqual(t, l.w.cohort, 8, "the burst raised the cohort")
}
