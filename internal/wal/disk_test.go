package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
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
