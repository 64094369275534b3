package wal

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFilesArePrivate: the directory Open creates is 0700 and every file of
// the log (LOCK, segments, the copies a repair keeps) is 0600.
func TestFilesArePrivate(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permissions")
	}
	dir := filepath.Join(t.TempDir(), "data")
	l, err := Open(dir, Options{SegmentSize: 200})
	require.NoError(t, err)
	commit(t, l, "a="+string(make([]byte, 150)))
	commit(t, l, "b=2")
	commit(t, l, "c=3")
	require.NoError(t, l.Close())

	// Damage segment 1's record, which segment 2's header says was synced: a
	// repair moves it aside and keeps a copy.
	first := filepath.Join(dir, segName(1))
	data, err := os.ReadFile(first)
	require.NoError(t, err)
	data[headerLen+recPrefixLen] ^= 1
	require.NoError(t, os.WriteFile(first, data, 0o600))
	l, err = Open(dir, Options{Repair: true})
	require.NoError(t, err)
	require.NotEmpty(t, l.Recovery().Cuts)
	require.NoError(t, l.Close())

	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the directory")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	saved := 0
	for _, e := range ents {
		info, err := e.Info()
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), e.Name())
		if filepath.Ext(e.Name()) != ".wal" && e.Name() != lockName {
			saved++
		}
	}
	assert.Positive(t, saved, "the repair kept copies")
}

// TestSymlinkedSegmentRefused: a segment that is a symbolic link is not
// followed (its target, anywhere, would be truncated as a torn tail and
// written to): Open fails and leaves the target alone.
func TestSymlinkedSegmentRefused(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	commit(t, l, "a=1")
	require.NoError(t, l.Close())
	seg := filepath.Join(dir, segName(1))
	data, err := os.ReadFile(seg)
	require.NoError(t, err)
	target := filepath.Join(t.TempDir(), "elsewhere")
	data = append(data, "garbage a replay would cut"...)
	require.NoError(t, os.WriteFile(target, data, 0o600))
	require.NoError(t, os.Remove(seg))
	if err := os.Symlink(target, seg); err != nil {
		t.Skipf("cannot create a symbolic link here: %v", err)
	}

	_, err = Open(dir, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "symbolic link")
	_, err = Open(dir, Options{Repair: true})
	require.Error(t, err, "Repair does not follow it either")
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, data, got, "the link's target is untouched")
}

// TestPlantedNextSegmentSymlinkIsNeverFollowed: symbolic links planted under
// the names of the segments the log will create next, before Open or while
// the log runs, are never written through when it rolls to a new segment:
// Open refuses them, or the roll fails, and their targets are never created.
func TestPlantedNextSegmentSymlinkIsNeverFollowed(t *testing.T) {
	for _, when := range []string{"before open", "while running"} {
		t.Run(when, func(t *testing.T) {
			dir := t.TempDir()
			l, err := Open(dir, Options{SegmentSize: 200})
			require.NoError(t, err)
			commit(t, l, "a=1")
			require.NoError(t, l.Close())
			outside := t.TempDir()
			var victims []string
			plant := func() {
				for id := uint64(2); id <= 5; id++ {
					v := filepath.Join(outside, segName(id)+".victim")
					victims = append(victims, v)
					if err := os.Symlink(v, filepath.Join(dir, segName(id))); err != nil {
						t.Skipf("cannot create a symbolic link here: %v", err)
					}
				}
			}
			if when == "before open" {
				plant()
			}
			l, err = Open(dir, Options{SegmentSize: 200})
			if err != nil {
				require.Equal(t, "before open", when, "an Open refused with nothing planted: %v", err)
				t.Logf("refused at open: %v", err)
			} else {
				if when == "while running" {
					plant()
				}
				var cerr error
				for i := 0; i < 20 && cerr == nil; i++ { // several segments' worth
					cerr = l.Commit(putBatch(fmt.Sprint("k", i), strings.Repeat("v", 150)))
				}
				t.Logf("commit: %v", cerr)
				_ = l.Close()
			}
			for _, v := range victims {
				_, err := os.Lstat(v)
				assert.ErrorIs(t, err, fs.ErrNotExist, "the log wrote through the planted symlink to %s", v)
			}
		})
	}
}
