package wal

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The cohort estimate must fall back to 1 once the concurrency is gone, or a
// lone committer waits min(2*lastSync, maxCohortWait) for peers that never
// come, on every Commit ("A lone committer never waits; after the
// concurrency drops, the wait shrinks with it").
func TestCohortFallsBackToOneForALoneCommitter(t *testing.T) {
	fs := &faultFS{noSync: true}
	l := openT(t, t.TempDir(), Options{}, fs)
	burstCommits(t, l, fs, 20, nil)
	// Only this goroutine commits from now on: the writer wrote w.cohort
	// before answering it, and touches it again only for the next request.
	require.NoError(t, l.Commit(putBatch("lone", "v"))) // waits once, for the cohort that is gone
	for i := range 2 {
		require.NoError(t, l.Commit(putBatch(fmt.Sprint("lone", i), "v")))
	}
	assert.LessOrEqual(t, l.w.cohort, 1,
		"after 3 lone Commits the writer still waits for a cohort of %d committers on every Commit", l.w.cohort)
}

// The waiting count (requests with a done channel queued) and want return to
// zero whatever mix of Commit, Sync, CommitAsync (with its "behind" waits)
// and SyncInterval ran.
func TestCohortCountersReturnToZeroWhenIdle(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval(time.Millisecond)} {
		t.Run(fmt.Sprint(time.Duration(policy)), func(t *testing.T) {
			l := openT(t, t.TempDir(), Options{SegmentSize: 4096, Sync: policy}, nil)
			val := strings.Repeat("x", 700) // a few CommitAsyncs pass "behind" (4 KiB)
			var wg sync.WaitGroup
			for g := range 12 {
				wg.Go(func() {
					for i := range 150 {
						b := putBatch(fmt.Sprintf("%d/%d", g, i%20), val)
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
			require.Eventually(t, func() bool { return l.want.Load() == 0 }, settleWait, time.Millisecond)
			require.NoError(t, l.Close())
			assert.Zero(t, l.waiting.Load())
		})
	}
}

// With the writer stuck in an fdatasync, CommitAsyncs pile up past "behind"
// and one waits for the writer holding closeMu shared; Close comes in
// between. Releasing the sync must let everything return, and nothing that
// returned nil may be lost.
func TestAsyncBehindWaitEndsAtClose(t *testing.T) {
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
		assert.NoError(t, l.Commit(putBatch("held", "v")))
	}()
	closedWithin(t, entered, "the held sync")

	var mu sync.Mutex
	ok := map[string]bool{}
	asyncDone := make(chan struct{})
	go func() {
		defer close(asyncDone)
		for i := 0; ; i++ {
			k := fmt.Sprintf("async/%05d", i)
			if err := l.CommitAsync(putBatch(k, strings.Repeat("a", 500))); err != nil {
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
	}, settleWait, time.Millisecond, "CommitAsync reaches its behind wait")
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
	}, settleWait, time.Millisecond)
	commitAfter := make(chan error, 1)
	go func() { commitAfter <- l.Commit(putBatch("late", "v")) }()
	close(release)
	closedWithin(t, commitDone, "the held Commit")
	closedWithin(t, asyncDone, "the CommitAsync waiting behind")
	closedWithin(t, closed, "Close")
	select {
	case err := <-commitAfter:
		if err != nil {
			assert.ErrorIs(t, err, ErrClosed)
		}
	case <-time.After(settleWait):
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
func TestNoCallHangsAfterAFailure(t *testing.T) {
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
							err = l.Commit(putBatch(k, v))
							if err == nil {
								mu.Lock()
								committed[k] = v
								mu.Unlock()
							}
						case 1:
							err = l.CommitAsync(putBatch(k, v))
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
			closedWithin(t, joined, "every caller returning after the failure")
			assert.ErrorIs(t, l.Commit(putBatch("after", "v")), ErrFailed)
			assert.ErrorIs(t, l.CommitAsync(putBatch("after", "v")), ErrFailed)
			assert.ErrorIs(t, l.Sync(), ErrFailed)
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				assert.ErrorIs(t, l.Close(), ErrFailed)
			}()
			closedWithin(t, closed, "Close of a failed log")
			fs.failWrites(nil, 0)
			fs.failSyncs(nil, 0)
			checkNothingLost(t, dir, committed, attempted)
		})
	}
}

// burstCommits makes n committers share one group: the first Commit's fdatasync
// is held until the n-1 others are queued. every, if not nil, runs in every
// fdatasync after that. It returns once all n returned and checks that the
// writer's cohort estimate rose.
func burstCommits(t *testing.T, l *Log, fs *faultFS, n int, every func()) {
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
	go func() { errs <- l.Commit(putBatch("first", "v")) }()
	closedWithin(t, entered, "the first sync")
	for i := 1; i < n; i++ {
		go func() { errs <- l.Commit(putBatch(fmt.Sprint("k", i), "v")) }()
	}
	require.Eventually(t, func() bool { return len(l.reqs) == n-1 }, settleWait, time.Millisecond)
	close(release)
	for range n {
		require.NoError(t, <-errs)
	}
	require.GreaterOrEqual(t, l.w.cohort, 8, "the burst raised the cohort")
}

// After a burst of Commits raised the cohort, the load turns to CommitAsync
// only (acknowledgements). A CommitAsync wakes the writer with a request
// that has no committer behind it, and awaitCohort then waits for the gone
// cohort (need = cohort, not cohort-1, as the waking request is not a
// committer) until its timer; writeGroup never lowers the cohort for a group
// without waiters or sync, so this repeats on every wake: "one wait ends at
// its timer and the next ones wait only for those that came" does not hold,
// and each async batch becomes visible (and is written) a timer late.
func TestAsyncWakeDoesNotWaitForAGoneCohort(t *testing.T) {
	old := maxCohortWait
	maxCohortWait = 400 * time.Millisecond // registered before openT: restored after Close
	t.Cleanup(func() { maxCohortWait = old })
	fs := &faultFS{noSync: true}
	l := openT(t, t.TempDir(), Options{}, fs)
	const slowSync = 100 * time.Millisecond
	// A slow disk: every fdatasync takes 100ms (lastSync).
	burstCommits(t, l, fs, 20, func() { time.Sleep(slowSync) })
	var late []time.Duration
	for i := range 3 {
		k := fmt.Sprint("async", i)
		syncs := fs.syncs.Load()
		start := time.Now()
		require.NoError(t, l.CommitAsync(putBatch(k, "v")))
		require.Eventually(t, func() bool {
			_, ok, err := l.Get([]byte(k))
			require.NoError(t, err)
			return ok
		}, settleWait, 100*time.Microsecond)
		if d := time.Since(start); d >= slowSync {
			late = append(late, d)
		}
		// Let the background sync of the batch (100ms after its write) finish
		// before the next round, so that the writer is idle when it starts.
		require.Eventually(t, func() bool { return fs.syncs.Load() > syncs }, settleWait, time.Millisecond)
	}
	assert.LessOrEqual(t, len(late), 1, "CommitAsync batches written late (the writer slept for a gone cohort each time): %v", late)
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
