package wal

import (
	"fmt"
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
