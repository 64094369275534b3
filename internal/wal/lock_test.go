package wal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestLockSameProcess(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	_, err := Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked)
	require.NoError(t, l.Close())
	l2, err := Open(dir, Options{})
	require.NoError(t, err, "Close releases the lock")
	require.NoError(t, l2.Close())
}

func TestLockOtherProcess(t *testing.T) {
	dir := t.TempDir()
	child := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
		out, err := cmd.Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out))
	}
	l := openT(t, dir, Options{}, nil)
	got := child()
	assert.True(t, strings.HasPrefix(got, "locked"), "the child got %q", got)
	assert.Contains(t, got, fmt.Sprintf("held by process %d", os.Getpid()), "the child's error names the holder")
	require.NoError(t, l.Close())
	assert.Equal(t, "opened", child())
}

// TestLockNamesHolder: the LOCK file holds the pid of the process that holds
// the lock, and a refused Open names it.
func TestLockNamesHolder(t *testing.T) {
	dir := t.TempDir()
	lockPath := filepath.Join(dir, lockName)
	require.NoError(t, os.WriteFile(lockPath, []byte("999999999999 a much longer line left by an old holder\n"), 0o600))
	l := openT(t, dir, Options{}, nil)
	data, err := os.ReadFile(lockPath)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d\n", os.Getpid()), string(data))

	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), fmt.Sprintf("held by process %d", os.Getpid()))
	assert.Contains(t, err.Error(), lockPath)
	require.NoError(t, l.Close())
}

// TestLockDoesNotFollowSymlink: a LOCK planted as a symbolic link is refused,
// and the file it points to is left alone (it used to be truncated and
// overwritten with a pid).
func TestLockDoesNotFollowSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "precious")
	require.NoError(t, os.WriteFile(target, []byte("precious data"), 0o600))
	if err := os.Symlink(target, filepath.Join(dir, lockName)); err != nil {
		t.Skipf("cannot create a symbolic link here: %v", err)
	}
	_, err := Open(dir, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "symbolic link")
	data, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "precious data", string(data), "the link's target is untouched")
	names, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, names, 1, "the refused Open created nothing")
}

// openFDs returns the number of open file descriptors of the process, or -1
// where it cannot tell.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// snapshot returns the names and contents of the log's files in dir (LOCK
// aside, whose pid Open rewrites).
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := map[string]string{}
	for _, e := range ents {
		if e.Name() == lockName {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		m[e.Name()] = string(data)
	}
	return m
}

// createFailFS fails the creation of files with EACCES, as a directory that
// is not writable does (the tests may run as root, which chmod cannot stop).
type createFailFS struct{ faultFS }

func (fs *createFailFS) OpenFile(name string, flag int) (file, error) {
	if flag&os.O_CREATE != 0 {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}
	return fs.faultFS.OpenFile(name, flag)
}

// TestRefusedOpenKeepsNothing: whatever makes Open fail, it releases the lock,
// its files and its goroutines, a refusal changes none of the log's files,
// and an Open after the cause is gone succeeds.
func TestRefusedOpenKeepsNothing(t *testing.T) {
	twoRecords := func(t *testing.T, dir string) []byte {
		l := openT(t, dir, Options{}, nil)
		commit(t, l, "a=1")
		commit(t, l, "b=2")
		require.NoError(t, l.Close())
		data, err := os.ReadFile(filepath.Join(dir, segName(1)))
		require.NoError(t, err)
		return data
	}
	for _, tc := range []struct {
		name string
		// setup prepares dir and returns the file system for the failing
		// Open and a func that removes the cause.
		setup func(t *testing.T, dir string) (fs fileSystem, cure func())
		want  error // nil: any error
		state map[string]string
	}{
		{"locked", func(t *testing.T, dir string) (fileSystem, func()) {
			holder := openT(t, dir, Options{}, nil)
			commit(t, holder, "a=1")
			return osFS{}, func() { require.NoError(t, holder.Close()) }
		}, ErrLocked, map[string]string{"a": "1"}},
		{"corrupt record", func(t *testing.T, dir string) (fileSystem, func()) {
			good := twoRecords(t, dir)
			bad := append([]byte(nil), good...)
			bad[headerLen+recPrefixLen] ^= 1 // in a's record, which b's says was synced
			path := filepath.Join(dir, segName(1))
			require.NoError(t, os.WriteFile(path, bad, 0o600))
			return osFS{}, func() { require.NoError(t, os.WriteFile(path, good, 0o600)) }
		}, ErrCorrupt, map[string]string{"a": "1", "b": "2"}},
		{"missing oldest segment, torn head", func(t *testing.T, dir string) (fileSystem, func()) {
			l := openT(t, dir, Options{SegmentSize: 200}, nil)
			for i := range 6 {
				commit(t, l, fmt.Sprintf("k%d=%s", i, strings.Repeat("v", 100)))
			}
			require.NoError(t, l.Close())
			first := filepath.Join(dir, segName(1))
			saved, err := os.ReadFile(first)
			require.NoError(t, err)
			require.NoError(t, os.Remove(first))
			head := filepath.Join(dir, segName(6))
			f, err := os.OpenFile(head, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.Write([]byte("torn garbage"))
			require.NoError(t, err)
			require.NoError(t, f.Close())
			return osFS{}, func() { require.NoError(t, os.WriteFile(first, saved, 0o600)) }
		}, ErrCorrupt, func() map[string]string {
			m := map[string]string{}
			for i := range 6 {
				m[fmt.Sprint("k", i)] = strings.Repeat("v", 100)
			}
			return m
		}()},
		{"directory not writable", func(t *testing.T, dir string) (fileSystem, func()) {
			return &createFailFS{faultFS{noSync: true}}, func() {}
		}, syscall.EACCES, map[string]string{}},
		{"failed fdatasync", func(t *testing.T, dir string) (fileSystem, func()) {
			twoRecords(t, dir)
			fs := &faultFS{}
			fs.failSyncs(errIO, 0)
			return fs, func() {}
		}, errIO, map[string]string{"a": "1", "b": "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fs, cure := tc.setup(t, dir)
			before := snapshot(t, dir)
			fds := openFDs()
			ignore := goleak.IgnoreCurrent()

			l, err := open(dir, Options{}, fs)
			if err == nil {
				l.Close()
				t.Fatal("Open succeeded")
			}
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			}
			if fds >= 0 {
				assert.Equal(t, fds, openFDs(), "file descriptors left open by the failed Open")
			}
			goleak.VerifyNone(t, ignore)
			if tc.want == ErrLocked || tc.want == ErrCorrupt {
				assert.Equal(t, before, snapshot(t, dir), "a refused Open changed the log")
			}

			cure()
			l, err = Open(dir, Options{})
			require.NoError(t, err, "an Open after the cause is gone")
			assert.Equal(t, tc.state, contents(t, l))
			require.NoError(t, l.Close())
		})
	}
}
