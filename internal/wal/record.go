package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Segment header and record layout; doc.go has the specification.
const (
	headerLen     = 32 // segment header
	recHeaderLen  = 8  // body length + CRC
	bodyPrefixLen = 20 // seq + synced + op count
	recPrefixLen  = recHeaderLen + bodyPrefixLen
	minBodyLen    = bodyPrefixLen
	maxBodyLen    = 1 << 30

	// formatVersion is the version of the segments this code writes. Version
	// 2 added trim records (opTrim); version 1 segments, which the log wrote
	// before, are still read (see recoverer.checkOldest).
	formatVersion = 2

	opPut    byte = 1
	opDelete byte = 2
	opTrim   byte = 3 // the segments below a given id were removed (see Log.removeDead)
)

var (
	magic      = [6]byte{'T', 'M', 'Q', 'W', 'A', 'L'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Decoding errors. They never leave the package bare: recovery turns them into
// a cut tail or a *CorruptError.
var (
	errShort      = errors.New("truncated record")
	errLength     = errors.New("record length out of range")
	errChecksum   = errors.New("checksum mismatch")
	errBody       = errors.New("malformed record body")
	errHeader     = errors.New("bad segment header")
	errHeaderCRC  = errors.New("segment header checksum mismatch")
	errSeq        = errors.New("record out of sequence")
	errNotMinimal = errors.New("non-minimal varint")
)

// segHeader is the fixed header at the start of each segment file.
type segHeader struct {
	id       uint64 // equals the number in the file name
	firstSeq uint64 // seq of the segment's first record
	salt     uint32 // random per segment, seeds every record CRC
	version  uint16 // format version it was written in (encode writes formatVersion)
}

func (h segHeader) encode() []byte {
	b := make([]byte, headerLen)
	copy(b, magic[:])
	binary.LittleEndian.PutUint16(b[6:], formatVersion)
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint64(b[16:], h.firstSeq)
	binary.LittleEndian.PutUint32(b[24:], h.salt)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

func decodeHeader(b []byte) (segHeader, error) {
	if len(b) < headerLen {
		return segHeader{}, errShort
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:]) {
		return segHeader{}, errHeaderCRC
	}
	if [6]byte(b[:6]) != magic {
		return segHeader{}, fmt.Errorf("%w: magic %q", errHeader, b[:6])
	}
	v := binary.LittleEndian.Uint16(b[6:])
	if v < 1 || v > formatVersion {
		return segHeader{}, fmt.Errorf("%w: format version %d, want 1 to %d", errHeader, v, formatVersion)
	}
	return segHeader{
		id:       binary.LittleEndian.Uint64(b[8:]),
		firstSeq: binary.LittleEndian.Uint64(b[16:]),
		salt:     binary.LittleEndian.Uint32(b[24:]),
		version:  v,
	}, nil
}

// recordCRC is the CRC-32C of salt (4 bytes, little-endian), the length field
// and the body of rec.
func recordCRC(salt uint32, rec []byte) uint32 {
	// The salt's 4 bytes by table, as crc32.Update would do them: a [4]byte
	// passed to crc32.Update would escape, an allocation per record.
	c := ^uint32(0)
	for i := range 4 {
		c = castagnoli[byte(c)^byte(salt>>(8*i))] ^ (c >> 8)
	}
	c = crc32.Update(^c, castagnoli, rec[0:4])
	return crc32.Update(c, castagnoli, rec[recHeaderLen:])
}

// sealRecord fills in the length, seq, synced watermark and CRC of rec, a
// record whose op count and ops are already in place (see Batch).
func sealRecord(rec []byte, seq, synced uint64, salt uint32) {
	binary.LittleEndian.PutUint32(rec[0:], uint32(len(rec)-recHeaderLen))
	binary.LittleEndian.PutUint64(rec[recHeaderLen:], seq)
	binary.LittleEndian.PutUint64(rec[recHeaderLen+8:], synced)
	binary.LittleEndian.PutUint32(rec[4:], recordCRC(salt, rec))
}

// op is one decoded operation. key and val alias the decoded buffer.
type op struct {
	kind   byte
	key    []byte
	val    []byte
	valOff int    // offset of val from the start of the record
	seg    uint64 // opTrim: the oldest segment id the log still holds
}

// cost is the encoded size of the op, the unit of the live-bytes accounting.
func (o op) cost() int64 { return opCost(len(o.key), len(o.val)) }

func opCost(klen, vlen int) int64 {
	return int64(1 + uvarintLen(uint64(klen)) + klen + uvarintLen(uint64(vlen)) + vlen)
}

// record is a decoded record: one committed batch.
type record struct {
	seq    uint64
	synced uint64 // every record up to this seq was synced when this one was written
	ops    []op
}

// decodeRecord decodes the record at the start of buf, checked against salt,
// and returns it with its encoded length. The ops alias buf and reuse the
// capacity of ops. It never panics and never allocates more than the ops slice
// (FuzzDecodeRecord).
func decodeRecord(buf []byte, salt uint32, ops []op) (record, int, error) {
	if len(buf) < recHeaderLen {
		return record{}, 0, errShort
	}
	n := binary.LittleEndian.Uint32(buf)
	if n < minBodyLen || n > maxBodyLen {
		return record{}, 0, errLength
	}
	if uint64(len(buf)-recHeaderLen) < uint64(n) {
		return record{}, 0, errShort
	}
	end := recHeaderLen + int(n)
	rec := buf[:end]
	if binary.LittleEndian.Uint32(buf[4:]) != recordCRC(salt, rec) {
		return record{}, 0, errChecksum
	}
	r, err := decodeBody(rec, ops)
	return r, end, err
}

// decodeBody decodes the body of rec, a whole record whose CRC is known good.
func decodeBody(rec []byte, ops []op) (record, error) {
	if len(rec) < recPrefixLen {
		return record{}, errShort
	}
	r := record{
		seq:    binary.LittleEndian.Uint64(rec[recHeaderLen:]),
		synced: binary.LittleEndian.Uint64(rec[recHeaderLen+8:]),
		ops:    ops[:0],
	}
	if r.synced >= r.seq {
		return record{}, fmt.Errorf("%w: synced watermark %d not below seq %d", errBody, r.synced, r.seq)
	}
	count := binary.LittleEndian.Uint32(rec[recHeaderLen+16:])
	p := recPrefixLen
	for range count {
		if p >= len(rec) {
			return record{}, fmt.Errorf("%w: %d ops announced, fewer present", errBody, count)
		}
		o := op{kind: rec[p]}
		p++
		if o.kind == opTrim {
			v, m := binary.Uvarint(rec[p:])
			if m <= 0 {
				return record{}, fmt.Errorf("%w: bad segment id", errBody)
			}
			if m != uvarintLen(v) {
				return record{}, errNotMinimal
			}
			o.seg, p = v, p+m
			r.ops = append(r.ops, o)
			continue
		}
		if o.kind != opPut && o.kind != opDelete {
			return record{}, fmt.Errorf("%w: op kind %d", errBody, o.kind)
		}
		var err error
		if o.key, p, err = readBytes(rec, p); err != nil {
			return record{}, err
		}
		if o.kind == opPut {
			if o.val, p, err = readBytes(rec, p); err != nil {
				return record{}, err
			}
			o.valOff = p - len(o.val)
		}
		r.ops = append(r.ops, o)
	}
	if p != len(rec) {
		return record{}, fmt.Errorf("%w: %d trailing bytes", errBody, len(rec)-p)
	}
	return r, nil
}

// readBytes reads a uvarint length and that many bytes at b[p:].
func readBytes(b []byte, p int) ([]byte, int, error) {
	v, m := binary.Uvarint(b[p:])
	if m <= 0 {
		return nil, 0, fmt.Errorf("%w: bad length", errBody)
	}
	if m != uvarintLen(v) {
		return nil, 0, errNotMinimal
	}
	p += m
	if v > uint64(len(b)-p) {
		return nil, 0, fmt.Errorf("%w: length %d past the end", errBody, v)
	}
	return b[p : p+int(v)], p + int(v), nil
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
