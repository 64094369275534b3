package wal

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
)

const fuzzSalt = 0x5eed5a17

// seedRecords returns a few valid records and near misses for the fuzzer.
func seedRecords() [][]byte {
	seal := func(b *Batch, seq, synced uint64) []byte {
		rec := bytes.Clone(b.record())
		sealRecord(rec, seq, synced, fuzzSalt)
		return rec
	}
	var empty, one, mixed Batch
	one.Put([]byte("key"), []byte("value"))
	mixed.Put([]byte("a"), bytes.Repeat([]byte{0xab}, 200)) // two-byte varint
	mixed.Delete([]byte("b"))
	mixed.Put(nil, nil)
	var trim Batch
	trim.trim(1 << 33)
	r1 := seal(&one, 7, 5)
	return [][]byte{
		seal(&empty, 1, 0),
		r1,
		seal(&mixed, 1<<40, 1<<40-1),
		seal(&trim, 9, 8),
		r1[:len(r1)-1],                 // torn
		append(bytes.Clone(r1), r1...), // two records back to back
		{},
	}
}

// FuzzDecodeRecord checks that decodeRecord never panics, and that whatever
// it accepts is exactly what the encoder produces for the decoded ops. Each
// input is tried as is and with a valid length and CRC patched in, so that
// the fuzzer also reaches the body decoder.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range seedRecords() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check(t, data)
		if len(data) >= recPrefixLen {
			patched := bytes.Clone(data)
			binary.LittleEndian.PutUint32(patched, uint32(len(patched)-recHeaderLen))
			binary.LittleEndian.PutUint32(patched[4:], recordCRC(fuzzSalt, patched))
			check(t, patched)
		}
	})
}

func check(t *testing.T, data []byte) {
	rec, n, err := decodeRecord(data, fuzzSalt, nil)
	if err != nil {
		return
	}
	if n < recPrefixLen || n > len(data) {
		t.Fatalf("decoded length %d of %d bytes", n, len(data))
	}
	var b Batch
	for _, o := range rec.ops {
		switch o.kind {
		case opPut:
			if !bytes.Equal(data[o.valOff:o.valOff+len(o.val)], o.val) {
				t.Fatalf("valOff %d does not point at the value", o.valOff)
			}
			b.Put(o.key, o.val)
		case opDelete:
			b.Delete(o.key)
		case opTrim:
			b.trim(o.seg)
		default:
			t.Fatalf("op kind %d accepted", o.kind)
		}
	}
	enc := b.record()
	sealRecord(enc, rec.seq, rec.synced, fuzzSalt)
	if !bytes.Equal(enc, data[:n]) {
		t.Fatalf("re-encoding differs:\n got %x\nwant %x", enc, data[:n])
	}
	if _, _, err := decodeRecord(data, fuzzSalt+1, nil); err == nil {
		t.Fatalf("record accepted with another segment's salt")
	}
}

// recordCRC folds the salt in without crc32.Update (to save an allocation):
// the result must be what the format specifies, the CRC-32C of the salt's 4
// little-endian bytes, the length field and the body.
func TestRecordCRCMatchesSpec(t *testing.T) {
	rec := make([]byte, 64)
	for i := range rec {
		rec[i] = byte(i * 7)
	}
	for _, salt := range []uint32{0, 1, 0xdeadbeef, 0xffffffff, 0x80000000} {
		spec := append(binary.LittleEndian.AppendUint32(nil, salt), rec[0:4]...)
		spec = append(spec, rec[recHeaderLen:]...)
		assert.Equal(t, crc32.Checksum(spec, castagnoli), recordCRC(salt, rec), "salt %#x", salt)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { recordCRC(7, rec) }))
}
