package wal

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

func TestNilAndEmptyBatch(t *testing.T) {
	l := openT(t, t.TempDir(), Options{}, nil)
	require.NoError(t, l.Commit(nil))
	require.NoError(t, l.Commit(&Batch{}))
	require.NoError(t, l.CommitAsync(nil))
	require.NoError(t, l.Sync())
	assert.Empty(t, contents(t, l))
}

// A Commit indexes a PutSizedString key by the caller's own string, not a
// copy: the index holds the very bytes the caller holds. A reused batch
// forgets its keys, and a CommitAsync of PutSizedString keys (merged with
// other batches) is applied as any other.
func TestPutSizedStringIndexKeepsTheKey(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}, nil)
	key := strings.Repeat("m/", 4) + "sized"
	var b Batch
	b.Put([]byte("plain"), []byte("p"))
	copy(b.PutSizedString(key, 3), "abc")
	b.Delete([]byte("gone"))
	copy(b.PutSizedString(key+"2", 1), "z")
	require.Equal(t, []string{key, key + "2"}, b.keys)
	require.NoError(t, l.Commit(&b))
	b.Reset()
	assert.Empty(t, b.keys)
	assert.Equal(t, []string{"", ""}, b.keys[:2], "Reset keeps no key alive")
	async := "async/" + key
	copy(b.PutSizedString(async, 1), "y")
	require.NoError(t, l.CommitAsync(&b))
	require.NoError(t, l.Sync())

	l.mu.Lock()
	held := map[string]*byte{}
	for k := range l.index {
		held[k] = unsafe.StringData(k)
	}
	l.mu.Unlock()
	assert.Same(t, unsafe.StringData(key), held[key], "the index copied a PutSizedString key")
	want := map[string]string{"plain": "p", key: "abc", key + "2": "z", async: "y"}
	assert.Equal(t, want, contents(t, l))
	require.NoError(t, l.Close())
	assert.Equal(t, want, contents(t, openT(t, dir, Options{}, nil)), "after a reopen")
}
