package wal

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// dirDigest is every file of dir with a hash of its content and its mode, so
// that a test can tell that nothing changed.
func dirDigest(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		info, err := e.Info()
		require.NoError(t, err)
		out[e.Name()] = fmt.Sprintf("%x %v %v", sha256.Sum256(b), info.Mode(), info.ModTime())
	}
	return out
}

// writeLog writes n batches of one Put each (key k<i>) into a new log in dir
// and closes it.
func writeLog(t *testing.T, dir string, opts Options, n int) {
	t.Helper()
	l, err := Open(dir, opts)
	require.NoError(t, err)
	for i := range n {
		var b Batch
		b.Put(fmt.Appendf(nil, "k%03d", i), fmt.Appendf(nil, "value %d with some padding to fill segments", i))
		require.NoError(t, l.Commit(&b))
	}
	require.NoError(t, l.Close())
}

func TestOpenReadOnlyReadsWithoutChangingTheDirectory(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{SegmentSize: 1024}, 50)
	before := dirDigest(t, dir)

	l, err := OpenReadOnly(dir)
	require.NoError(t, err)
	v, ok, err := l.Get([]byte("k007"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "value 7 with some padding to fill segments", string(v))
	n := 0
	require.NoError(t, l.Scan(func(string, []byte) bool { n++; return true }))
	require.Equal(t, 50, n)
	require.Empty(t, l.Recovery().Cuts, "an intact log has nothing left out")
	segs := l.Segments()
	require.Greater(t, len(segs), 1)
	var records uint64
	for _, s := range segs {
		st, err := os.Stat(filepath.Join(dir, s.Name))
		require.NoError(t, err)
		require.Equal(t, st.Size(), s.Size, "segment %s", s.Name)
		records += s.Records
	}
	require.EqualValues(t, l.Recovery().Records, records)

	var b Batch
	b.Put([]byte("x"), []byte("y"))
	require.ErrorIs(t, l.Commit(&b), ErrReadOnly)
	require.ErrorIs(t, l.CommitAsync(&b), ErrReadOnly)
	require.ErrorIs(t, l.Sync(), ErrReadOnly)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	_, _, err = l.Get([]byte("k007"))
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, before, dirDigest(t, dir), "a read-only open changes nothing")
}

func TestOpenReadOnlyNeverCreatesTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := OpenReadOnly(dir)
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, fs.ErrNotExist)

	empty := t.TempDir()
	_, err = OpenReadOnly(empty)
	require.ErrorIs(t, err, fs.ErrNotExist, "a directory without segments holds no log")
	ents, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, ents)
}

func TestOpenReadOnlyReportsATornTailWithoutCuttingIt(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{}, 5)
	seg := filepath.Join(dir, segName(1))
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{40, 0, 0, 0, 1, 2, 3}) // the start of a record, as a crash leaves it
	require.NoError(t, err)
	require.NoError(t, f.Close())
	before := dirDigest(t, dir)

	l, err := OpenReadOnly(dir)
	require.NoError(t, err)
	cuts := l.Recovery().Cuts
	require.Len(t, cuts, 1)
	require.True(t, cuts[0].Torn)
	require.EqualValues(t, 7, cuts[0].Bytes)
	require.Empty(t, cuts[0].SavedAs)
	n := 0
	require.NoError(t, l.Scan(func(string, []byte) bool { n++; return true }))
	require.Equal(t, 5, n)
	require.NoError(t, l.Close())
	require.Equal(t, before, dirDigest(t, dir), "the torn tail is still there for Open to cut")
}

func TestOpenReadOnlyReportsCorruptionWithoutRepairing(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{SegmentSize: 1024}, 50)
	seg := filepath.Join(dir, segName(1))
	b, err := os.ReadFile(seg)
	require.NoError(t, err)
	b[headerLen+12] ^= 0xff // inside the first record: its CRC fails
	require.NoError(t, os.WriteFile(seg, b, 0o600))
	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrCorrupt, "the precondition: Open refuses this log")
	before := dirDigest(t, dir)

	l, err := OpenReadOnly(dir)
	require.NoError(t, err)
	cuts := l.Recovery().Cuts
	require.NotEmpty(t, cuts)
	require.False(t, cuts[0].Torn)
	require.EqualValues(t, headerLen, cuts[0].Offset)
	require.Equal(t, seg, cuts[0].File)
	for _, c := range cuts {
		require.Empty(t, c.SavedAs, "nothing is copied out")
	}
	require.Equal(t, 0, l.Stats().LiveKeys, "the valid prefix is empty")
	require.NoError(t, l.Close())
	require.Equal(t, before, dirDigest(t, dir), "nothing is repaired")
}

func TestOpenReadOnlyReadsADirectoryHeldByALog(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, Options{})
	require.NoError(t, err)
	defer w.Close()
	var b Batch
	b.Put([]byte("a"), []byte("1"))
	require.NoError(t, w.Commit(&b))

	pid, held, err := LockHolder(dir)
	require.NoError(t, err)
	require.True(t, held)
	require.Equal(t, os.Getpid(), pid)

	r, err := OpenReadOnly(dir)
	require.NoError(t, err)
	v, ok, err := r.Get([]byte("a"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "1", string(v))
	require.NoError(t, r.Close())

	b.Reset()
	b.Put([]byte("b"), []byte("2"))
	require.NoError(t, w.Commit(&b), "the holder goes on writing")
	_, held, err = LockHolder(dir)
	require.NoError(t, err)
	require.True(t, held, "the probe released nothing of the holder's lock")
}

func TestLockHolderOfAFreeDirectory(t *testing.T) {
	dir := t.TempDir()
	pid, held, err := LockHolder(dir)
	require.NoError(t, err)
	require.False(t, held)
	require.Zero(t, pid)
	_, err = os.Stat(filepath.Join(dir, lockName))
	require.True(t, errors.Is(err, fs.ErrNotExist), "the probe creates no LOCK file")

	writeLog(t, dir, Options{}, 1)
	pid, held, err = LockHolder(dir)
	require.NoError(t, err)
	require.False(t, held, "a closed Log holds nothing")
	require.Equal(t, os.Getpid(), pid, "the LOCK file still names its last holder")
	l, err := Open(dir, Options{})
	require.NoError(t, err, "the probe left no lock behind")
	require.NoError(t, l.Close())
}
