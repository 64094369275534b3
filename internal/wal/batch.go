package wal

import (
	"encoding/binary"
	"slices"
)

// Batch is a list of Put and Delete operations that [Log.Commit] writes as one
// record: after a crash either all of them are in the log or none. The zero
// value is an empty batch ready to use.
//
// Put and Delete copy their arguments, so the caller may reuse its slices at
// once. A Batch may be reused (Reset) once Commit or CommitAsync returns. A
// Batch is not safe for concurrent use.
type Batch struct {
	buf  []byte   // a record being built: recPrefixLen bytes reserved, then the ops
	n    int      // number of ops
	keys []string // the keys of PutSizedString, in order: the index may keep them (see Log.apply)
}

func (b *Batch) init() {
	if len(b.buf) < recPrefixLen {
		if cap(b.buf) < recPrefixLen {
			b.buf = make([]byte, 0, recPrefixLen+64) // room for a small op or two
		}
		b.buf = append(b.buf[:0], make([]byte, recPrefixLen)...)
	}
}

// Put records that key is set to val. A later Put or Delete of the same key,
// in this batch or a later one, overrides it. Empty keys and values are
// allowed. It never blocks.
func (b *Batch) Put(key, val []byte) {
	b.init()
	b.buf = append(b.buf, opPut)
	b.buf = binary.AppendUvarint(b.buf, uint64(len(key)))
	b.buf = append(b.buf, key...)
	b.buf = binary.AppendUvarint(b.buf, uint64(len(val)))
	b.buf = append(b.buf, val...)
	b.n++
}

// Delete records that key is removed. Deleting a key that is not set is
// allowed and costs a few bytes in the log. It never blocks.
func (b *Batch) Delete(key []byte) {
	b.init()
	b.buf = append(b.buf, opDelete)
	b.buf = binary.AppendUvarint(b.buf, uint64(len(key)))
	b.buf = append(b.buf, key...)
	b.n++
}

// trim records that the log removed its segments below id: the writer
// commits one before it removes a dead segment, so that Open can tell a
// segment the log removed from one deleted behind its back.
func (b *Batch) trim(id uint64) {
	b.init()
	b.buf = append(b.buf, opTrim)
	b.buf = binary.AppendUvarint(b.buf, id)
	b.n++
}

// Grow makes room for n more bytes of operations (an operation takes the
// length of its key and value plus up to 21 bytes), so that the Puts and
// Deletes that follow need not allocate. It never blocks.
func (b *Batch) Grow(n int) {
	if len(b.buf) == 0 && cap(b.buf) < recPrefixLen+n {
		b.buf = make([]byte, 0, recPrefixLen+n) // one allocation for a new batch
	}
	b.init()
	b.buf = slices.Grow(b.buf, n)
}

// Reset empties the batch and keeps its memory for reuse.
func (b *Batch) Reset() {
	b.buf = b.buf[:0]
	b.n = 0
	clear(b.keys) // a reused batch does not hold on to its old keys
	b.keys = b.keys[:0]
}

// Len returns the number of operations in the batch.
func (b *Batch) Len() int { return b.n }

// Size returns the number of bytes the batch takes in the log, framing
// included.
func (b *Batch) Size() int {
	if len(b.buf) < recPrefixLen {
		return recPrefixLen
	}
	return len(b.buf)
}

// record returns the batch as an unsealed record (count set; length, seq,
// synced and CRC left for the writer). It aliases the batch.
func (b *Batch) record() []byte {
	b.init()
	binary.LittleEndian.PutUint32(b.buf[recHeaderLen+16:], uint32(b.n))
	return b.buf
}

// PutSized is Put of a value of n bytes that the caller writes into the
// returned slice (of length n) instead of copying one in, so that a large
// value is made once, in the batch. Fill the slice before the next call on
// b: a later Put or Delete may move the batch's bytes. The slice stays
// readable after Commit; the caller that keeps it must not Reset and reuse
// b, whose bytes the next batch would overwrite. It never blocks.
func (b *Batch) PutSized(key []byte, n int) []byte { return putSized(b, key, n) }

// PutSizedString is PutSized with the key as a string. When the batch is
// committed with [Log.Commit], the log's index keeps that string as the key
// rather than a copy of its own: one allocation fewer per Put, for a caller
// that holds the key as a string anyway. (A batch given to CommitAsync is
// merged with others and its keys are copied, as Put's are.) It never
// blocks.
func (b *Batch) PutSizedString(key string, n int) []byte {
	b.keys = append(b.keys, key)
	return putSized(b, key, n)
}

func putSized[K []byte | string](b *Batch, key K, n int) []byte {
	b.Grow(1 + 2*binary.MaxVarintLen64 + len(key) + n)
	b.buf = append(b.buf, opPut)
	b.buf = binary.AppendUvarint(b.buf, uint64(len(key)))
	b.buf = append(b.buf, key...)
	b.buf = binary.AppendUvarint(b.buf, uint64(n))
	start := len(b.buf)
	b.buf = b.buf[:start+n]
	b.n++
	return b.buf[start : start+n : start+n]
}
