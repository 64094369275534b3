package tinymq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tinymq/tinymq/internal/wal"
)

// This file encodes what durable queues keep in the write-ahead log. Keys:
//
//	m/<exchange>\x00<id, 8 bytes big-endian>   a message, once per publish
//	a/<len(queue)><queue><message key>         the queue acknowledged it
//	s/<len(queue)><queue><message key>         its state in the queue (retries)
//	x/<exchange>                               IDs reserved for the exchange
//	d/<queue>                                  the queue was deleted (a tombstone)
//	q/<queue>                                  the durable queue is declared: its settings and bindings
//	i/<len(exchange)><exchange><dedup ID>      WithDeduplicationID's ID, accepted at (see putDedup)
//
// A message's value lists the durable queues it was routed to; it is deleted,
// with its a/ and s/ keys, when the last of them acknowledges it. A d/ value
// maps each exchange to the highest message ID it had stamped when the queue
// was deleted: no message of that exchange up to that ID is the queue's any
// more (a queue of that name declared later gets higher IDs only). The
// delete writes it in one batch with the removal of the queue's q/ record
// and the acknowledgements of its waiting messages. Recovery deletes what no
// longer matters (see durableLog.recover): messages that no queue holds,
// tombstones that no message is left for, and a/ and s/ keys whose message
// is gone. Values start with a format version byte. Header values keep their
// exact Go type, so that a consumer sees the same Msg before and after a
// restart. An i/ record joins the batch of the message it came with, so that
// the ID is recorded exactly when the message is; its value holds when it
// was accepted and the window then in force, and recovery deletes it once
// that window has passed (the MQ deletes it too when it forgets the ID).

const recordVersion = 1

// groupRecordVersion starts the record of a message with a group
// (WithMessageGroup): version 1's fields, the group ID (a string) after the
// deaths. Messages without a group keep version 1.
const groupRecordVersion = 2

var errBadRecord = errors.New("tinymq: malformed log record")

// storedMsg is a message as the log keeps it.
type storedMsg struct {
	publishedAt int64 // UnixNano: replay order
	visibleAt   int64 // UnixNano when it joins its queues (after any delay)
	expiration  time.Duration
	routingKey  string
	headers     map[string]any
	deaths      []Death
	body        []byte
	queues      []string
	group       string // WithMessageGroup, or ""
}

// queueState is a message's state in one queue, once it has been retried.
type queueState struct {
	attempt int
	dueAt   int64 // UnixNano of the next attempt
	lastErr string
}

// appendMsgKey appends the key of message id of exchange to b.
func appendMsgKey(b []byte, exchange string, id uint64) []byte {
	b = append(b, "m/"...)
	b = append(b, exchange...)
	b = append(b, 0)
	return binary.BigEndian.AppendUint64(b, id)
}

// parseMsgKey returns the exchange and ID of a message key.
func parseMsgKey(k string) (exchange string, id uint64, ok bool) {
	if len(k) < 2+1+8 || k[:2] != "m/" || k[len(k)-9] != 0 {
		return "", 0, false
	}
	return k[2 : len(k)-9], binary.BigEndian.Uint64([]byte(k[len(k)-8:])), true
}

// queueKey is the a/ or s/ key of message key mk in queue.
func queueKey(prefix, queue, mk string) []byte {
	b := make([]byte, 0, 2+binary.MaxVarintLen64+len(queue)+len(mk))
	b = append(b, prefix...)
	b = binary.AppendUvarint(b, uint64(len(queue)))
	b = append(b, queue...)
	return append(b, mk...)
}

// parseQueueKey splits an a/ or s/ key into its queue and message key, which
// share k's bytes.
func parseQueueKey(k string) (queue, mk string, ok bool) {
	if len(k) < 2 {
		return "", "", false
	}
	rest := k[2:]
	n, w := uvarintString(rest)
	if w <= 0 || uint64(len(rest)-w) < n {
		return "", "", false
	}
	return rest[w : w+int(n)], rest[w+int(n):], true
}

// uvarintString is binary.Uvarint for a string, without a copy.
func uvarintString(s string) (uint64, int) {
	var x uint64
	var shift uint
	for i := 0; i < len(s) && i < binary.MaxVarintLen64; i++ {
		c := s[i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				return 0, -(i + 1) // overflow
			}
			return x | uint64(c)<<shift, i + 1
		}
		x |= uint64(c&0x7f) << shift
		shift += 7
	}
	return 0, 0
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// putIn puts the encoding of s under key into b, sized once and written in
// place: head is scratch room for the small fields before the body. The
// log's index keeps key itself (see wal.Batch.PutSizedString): the string
// that the message's Msgs and refs hold is the index's too. With raw
// non-nil, the body is JSONCodec's encoding of raw, written straight into b
// (s.body is ignored). It returns, with raw, the bytes of b that hold the
// body's encoding (nil without raw: the body is s.body); and the head buffer
// for reuse.
func (s *storedMsg) putIn(b *wal.Batch, key string, head, raw []byte) (body, headBuf []byte) {
	head = s.appendHead(head[:0])
	n := len(s.body)
	if raw != nil {
		n = jsonBytesLen(len(raw))
	}
	tail := uvarintLen(uint64(len(s.queues)))
	for _, q := range s.queues {
		tail += uvarintLen(uint64(len(q))) + len(q)
	}
	size := len(head) + uvarintLen(uint64(n)) + n + tail
	b.Grow(1 + 2*binary.MaxVarintLen64 + len(key) + size + 256) // room too for a dead letter's acknowledgement
	v := b.PutSizedString(key, size)
	w := append(v[:0], head...)
	w = binary.AppendUvarint(w, uint64(n))
	if raw != nil {
		start := len(w)
		w = appendJSONBytes(w, raw)
		body = w[start:len(w):len(w)]
	} else { // body stays nil: returning s.body would move what s points to (its queues) to the heap
		w = append(w, s.body...)
	}
	if w = s.appendTail(w); len(w) != size || &w[0] != &v[0] {
		panic("tinymq: a log record's size was miscounted") // a bug: v would not hold the record
	}
	return body, head
}

// appendHead appends the encoding of s up to its body.
func (s *storedMsg) appendHead(b []byte) []byte {
	if s.group != "" {
		b = append(b, groupRecordVersion)
	} else {
		b = append(b, recordVersion)
	}
	b = binary.AppendVarint(b, s.publishedAt)
	b = binary.AppendVarint(b, s.visibleAt)
	b = binary.AppendVarint(b, int64(s.expiration))
	b = appendString(b, s.routingKey)
	if s.headers == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = appendTable(b, s.headers)
	}
	b = binary.AppendUvarint(b, uint64(len(s.deaths)))
	for _, d := range s.deaths {
		b = appendString(b, string(d.Reason))
		b = appendString(b, d.Exchange)
		b = appendString(b, d.Queue)
		b = appendString(b, d.RoutingKey)
		b = binary.AppendVarint(b, int64(d.Attempts))
		b = binary.AppendVarint(b, int64(d.Count))
		b = binary.AppendUvarint(b, d.MessageID)
		b = appendString(b, d.LastError)
		b = binary.AppendVarint(b, d.Time.UnixNano())
	}
	if s.group != "" {
		b = appendString(b, s.group)
	}
	return b
}

// appendTail appends the encoding of s after its body.
func (s *storedMsg) appendTail(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s.queues)))
	for _, q := range s.queues {
		b = appendString(b, q)
	}
	return b
}

// uvarintLen is the length of binary.AppendUvarint's encoding of x.
func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

func (s *queueState) encode() []byte {
	b := []byte{recordVersion}
	b = binary.AppendVarint(b, int64(s.attempt))
	b = binary.AppendVarint(b, s.dueAt)
	return appendString(b, s.lastErr)
}

// reader decodes what the append functions wrote; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = errBadRecord
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) < 1 {
		r.fail()
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if uint64(len(r.b)) < n {
		r.fail()
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string { return string(r.bytes()) }

// count reads a length that must fit what is left (at least min bytes each).
func (r *reader) count(min int) int {
	n := r.uvarint()
	if n > uint64(len(r.b)/max(min, 1)) {
		r.fail()
		return 0
	}
	return int(n)
}

// msgDecoder decodes stored messages, one after another, and shares between
// them what repeats: a message's routing key and queue list are most often
// those of the message before, and then cost no allocation. Shared values
// are never written to.
type msgDecoder struct {
	routingKey string
	queues     []string
	queuesRaw  []byte // the encoding of queues
}

// decode decodes b into s, which must be zero. With meta, it decodes only
// what recovery needs (publishedAt, visibleAt, expiration and queues) and
// checks the rest without keeping it, allocating nothing but a queue list
// that differs from the message before's; s keeps none of b's bytes.
// Otherwise it decodes everything, and s.body shares b's bytes.
func (dec *msgDecoder) decode(s *storedMsg, b []byte, meta bool) error {
	r := &reader{b: b}
	version := r.byte()
	if version != recordVersion && version != groupRecordVersion {
		return fmt.Errorf("%w: unknown message record version", errBadRecord)
	}
	s.publishedAt = r.varint()
	s.visibleAt = r.varint()
	s.expiration = time.Duration(r.varint())
	if rk := r.bytes(); !meta {
		if string(rk) != dec.routingKey {
			dec.routingKey = string(rk)
		}
		s.routingKey = dec.routingKey
	}
	if r.byte() == 1 {
		if meta {
			r.skipTable(0)
		} else {
			s.headers = r.table(0)
		}
	}
	if nd := r.count(9); nd > 0 && meta {
		for range nd {
			for range 4 { // reason, exchange, queue, routing key
				r.bytes()
			}
			r.varint() // attempts
			r.varint() // count
			r.uvarint()
			r.bytes() // last error
			r.varint()
		}
	} else if nd > 0 {
		s.deaths = make([]Death, nd)
		for i := range s.deaths {
			d := &s.deaths[i]
			d.Reason = DeathReason(r.string())
			d.Exchange = r.string()
			d.Queue = r.string()
			d.RoutingKey = r.string()
			d.Attempts = int(r.varint())
			d.Count = int(r.varint())
			d.MessageID = r.uvarint()
			d.LastError = r.string()
			d.Time = time.Unix(0, r.varint())
		}
	}
	if version == groupRecordVersion { // recovery needs the group too: meta keeps it
		s.group = r.string()
	}
	if body := r.bytes(); len(body) > 0 && !meta {
		s.body = body
	}
	// The queue list ends the record.
	if r.err == nil && bytes.Equal(r.b, dec.queuesRaw) && dec.queuesRaw != nil {
		s.queues = dec.queues
		return nil
	}
	raw := r.b
	nq := r.count(1)
	if nq > 0 {
		s.queues = make([]string, 0, nq)
	}
	for range nq {
		q := r.bytes()
		// Queue names are few: share one string per name with the list before.
		if i := slices.IndexFunc(dec.queues, func(p string) bool { return p == string(q) }); i >= 0 {
			s.queues = append(s.queues, dec.queues[i])
		} else {
			s.queues = append(s.queues, string(q))
		}
	}
	if r.err != nil {
		return r.err
	}
	dec.queues, dec.queuesRaw = s.queues, append(dec.queuesRaw[:0], raw...)
	return nil
}

func decodeQueueState(b []byte) (queueState, error) {
	r := &reader{b: b}
	if r.byte() != recordVersion {
		return queueState{}, errBadRecord
	}
	s := queueState{attempt: int(r.varint()), dueAt: r.varint(), lastErr: r.string()}
	return s, r.err
}

// Go type tags of header values: validateValue has checked that each value
// is one of these.
const (
	tagNil = iota + 1
	tagFalse
	tagTrue
	tagInt
	tagInt8
	tagInt16
	tagInt32
	tagInt64
	tagUint
	tagUint8
	tagUint16
	tagUint32
	tagUint64
	tagFloat32
	tagFloat64
	tagString
	tagBytes
	tagTime
	tagArray
	tagTable
)

func appendTable(b []byte, t map[string]any) []byte {
	b = binary.AppendUvarint(b, uint64(len(t)))
	for k, v := range t {
		b = appendString(b, k)
		b = appendValue(b, v)
	}
	return b
}

func appendValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, tagNil)
	case bool:
		if v {
			return append(b, tagTrue)
		}
		return append(b, tagFalse)
	case int:
		return binary.AppendVarint(append(b, tagInt), int64(v))
	case int8:
		return binary.AppendVarint(append(b, tagInt8), int64(v))
	case int16:
		return binary.AppendVarint(append(b, tagInt16), int64(v))
	case int32:
		return binary.AppendVarint(append(b, tagInt32), int64(v))
	case int64:
		return binary.AppendVarint(append(b, tagInt64), v)
	case uint:
		return binary.AppendUvarint(append(b, tagUint), uint64(v))
	case uint8:
		return binary.AppendUvarint(append(b, tagUint8), uint64(v))
	case uint16:
		return binary.AppendUvarint(append(b, tagUint16), uint64(v))
	case uint32:
		return binary.AppendUvarint(append(b, tagUint32), uint64(v))
	case uint64:
		return binary.AppendUvarint(append(b, tagUint64), v)
	case float32:
		return binary.LittleEndian.AppendUint32(append(b, tagFloat32), math.Float32bits(v))
	case float64:
		return binary.LittleEndian.AppendUint64(append(b, tagFloat64), math.Float64bits(v))
	case string:
		return appendString(append(b, tagString), v)
	case []byte:
		return appendString(append(b, tagBytes), string(v))
	case time.Time:
		return binary.AppendVarint(append(b, tagTime), v.UnixNano())
	case []any:
		b = binary.AppendUvarint(append(b, tagArray), uint64(len(v)))
		for _, e := range v {
			b = appendValue(b, e)
		}
		return b
	case map[string]any:
		return appendTable(append(b, tagTable), v)
	}
	return append(b, tagNil) // unreachable for validated headers
}

func (r *reader) table(depth int) map[string]any {
	if depth > maxDepth {
		r.fail()
		return nil
	}
	n := r.count(2)
	t := make(map[string]any, n)
	for range n {
		k := r.string()
		t[k] = r.value(depth)
	}
	return t
}

// skipTable and skipValue check what table and value decode, and keep
// none of it.
func (r *reader) skipTable(depth int) {
	if depth > maxDepth {
		r.fail()
		return
	}
	for range r.count(2) {
		r.bytes()
		r.skipValue(depth)
	}
}

func (r *reader) skipValue(depth int) {
	switch tag := r.byte(); tag {
	case tagNil, tagFalse, tagTrue:
	case tagInt, tagInt8, tagInt16, tagInt32, tagInt64, tagTime:
		r.varint()
	case tagUint, tagUint8, tagUint16, tagUint32, tagUint64:
		r.uvarint()
	case tagFloat32, tagFloat64:
		n := 4
		if tag == tagFloat64 {
			n = 8
		}
		if len(r.b) < n {
			r.fail()
			return
		}
		r.b = r.b[n:]
	case tagString, tagBytes:
		r.bytes()
	case tagArray:
		if depth >= maxDepth {
			r.fail()
			return
		}
		for range r.count(1) {
			r.skipValue(depth + 1)
		}
	case tagTable:
		r.skipTable(depth + 1)
	default:
		r.fail()
	}
}

func (r *reader) value(depth int) any {
	switch r.byte() {
	case tagNil:
		return nil
	case tagFalse:
		return false
	case tagTrue:
		return true
	case tagInt:
		return int(r.varint())
	case tagInt8:
		return int8(r.varint())
	case tagInt16:
		return int16(r.varint())
	case tagInt32:
		return int32(r.varint())
	case tagInt64:
		return r.varint()
	case tagUint:
		return uint(r.uvarint())
	case tagUint8:
		return uint8(r.uvarint())
	case tagUint16:
		return uint16(r.uvarint())
	case tagUint32:
		return uint32(r.uvarint())
	case tagUint64:
		return r.uvarint()
	case tagFloat32:
		if len(r.b) < 4 {
			r.fail()
			return nil
		}
		v := math.Float32frombits(binary.LittleEndian.Uint32(r.b))
		r.b = r.b[4:]
		return v
	case tagFloat64:
		if len(r.b) < 8 {
			r.fail()
			return nil
		}
		v := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
		r.b = r.b[8:]
		return v
	case tagString:
		return r.string()
	case tagBytes:
		return append([]byte{}, r.bytes()...)
	case tagTime:
		return time.Unix(0, r.varint())
	case tagArray:
		if depth >= maxDepth {
			r.fail()
			return nil
		}
		n := r.count(1)
		a := make([]any, 0, n)
		for range n {
			a = append(a, r.value(depth+1))
		}
		return a
	case tagTable:
		return r.table(depth + 1)
	}
	r.fail()
	return nil
}

// encodeTombstone encodes a d/ value: for each exchange, the highest message
// ID when the queue was deleted.
func encodeTombstone(upTo map[string]uint64) []byte {
	b := []byte{recordVersion}
	b = binary.AppendUvarint(b, uint64(len(upTo)))
	for ex, id := range upTo {
		b = appendString(b, ex)
		b = binary.AppendUvarint(b, id)
	}
	return b
}

// decodeTombstone decodes a d/ value.
func decodeTombstone(v []byte) (map[string]uint64, error) {
	r := &reader{b: v}
	if r.byte() != recordVersion {
		return nil, errBadRecord
	}
	n := r.count(2)
	up := make(map[string]uint64, n)
	for range n {
		ex := r.string()
		up[ex] = r.uvarint()
	}
	if r.err != nil {
		return nil, errBadRecord
	}
	return up, nil
}

// queueRecord is a declared durable queue as its q/ record keeps it: what
// DeclareQueue or RegisterQueue configured (the consumer, its concurrency
// and the filter function aside: only whether there was a filter) and the
// bindings the queue has, to every exchange. Its value:
//
//	version (1)
//	retry: MaxAttempts, InitialBackoff, MaxBackoff (varints),
//	       Multiplier, Jitter (float64 bits, 8 bytes little-endian each)
//	ttl, maxLen (varints), overflow (1 byte)
//	dead-letter exchange, dead-letter key (strings)
//	expiry (varint), filtered (1 byte)
//	bindings: count, then each: exchange (string), kind (1 byte),
//	          keys (count, strings), args (count, then each: 0 for a nil
//	          table, or 1 and the table, its keys sorted)
//
// Strings are a uvarint length and the bytes; a table is encoded as a
// message's headers are. The encoding of one record is always the same
// bytes (tables are written in key order), so that a declaration is
// rewritten only when it changed.
type queueRecord struct {
	retry       RetryPolicy
	ttl         time.Duration
	maxLen      int
	overflow    Overflow
	dlx, dlxKey string
	expiry      time.Duration
	filtered    bool
	bindings    []BindingSpec // each one's Queue is the record's queue
}

// queueRecordOf is the record of a queue configured by cfg, with bindings.
func queueRecordOf(cfg queueConfig, bindings []BindingSpec) queueRecord {
	return queueRecord{retry: cfg.retry, ttl: cfg.ttl, maxLen: cfg.maxLen, overflow: cfg.overflow,
		dlx: cfg.dlx, dlxKey: cfg.dlxKey, expiry: cfg.expiry, filtered: cfg.filter != nil, bindings: bindings}
}

func (r *queueRecord) encode() []byte {
	b := []byte{recordVersion}
	b = binary.AppendVarint(b, int64(r.retry.MaxAttempts))
	b = binary.AppendVarint(b, int64(r.retry.InitialBackoff))
	b = binary.AppendVarint(b, int64(r.retry.MaxBackoff))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.retry.Multiplier))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.retry.Jitter))
	b = binary.AppendVarint(b, int64(r.ttl))
	b = binary.AppendVarint(b, int64(r.maxLen))
	b = append(b, byte(r.overflow))
	b = appendString(b, r.dlx)
	b = appendString(b, r.dlxKey)
	b = binary.AppendVarint(b, int64(r.expiry))
	if r.filtered {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(r.bindings)))
	for _, s := range r.bindings {
		b = appendString(b, s.Exchange)
		b = append(b, byte(s.Kind))
		b = binary.AppendUvarint(b, uint64(len(s.Keys)))
		for _, k := range s.Keys {
			b = appendString(b, k)
		}
		b = binary.AppendUvarint(b, uint64(len(s.Args)))
		for _, a := range s.Args {
			if a == nil {
				b = append(b, 0)
				continue
			}
			b = appendSortedTable(append(b, 1), a)
		}
	}
	return b
}

// decodeQueueRecord decodes a q/ value of queue.
func decodeQueueRecord(queue string, v []byte) (queueRecord, error) {
	r := &reader{b: v}
	if r.byte() != recordVersion {
		return queueRecord{}, fmt.Errorf("%w: unknown queue record version", errBadRecord)
	}
	var q queueRecord
	q.retry.MaxAttempts = int(r.varint())
	q.retry.InitialBackoff = time.Duration(r.varint())
	q.retry.MaxBackoff = time.Duration(r.varint())
	q.retry.Multiplier = math.Float64frombits(r.uint64())
	q.retry.Jitter = math.Float64frombits(r.uint64())
	q.ttl = time.Duration(r.varint())
	q.maxLen = int(r.varint())
	q.overflow = Overflow(r.byte())
	q.dlx = r.string()
	q.dlxKey = r.string()
	q.expiry = time.Duration(r.varint())
	q.filtered = r.byte() == 1
	n := r.count(3)
	for range n {
		s := BindingSpec{Queue: queue, Exchange: r.string(), Kind: ExchangeType(r.byte())}
		for range r.count(1) {
			s.Keys = append(s.Keys, r.string())
		}
		for range r.count(1) {
			if r.byte() == 0 {
				s.Args = append(s.Args, nil)
				continue
			}
			s.Args = append(s.Args, r.table(0))
		}
		q.bindings = append(q.bindings, s)
	}
	if r.err != nil || len(r.b) != 0 {
		return queueRecord{}, errBadRecord
	}
	return q, nil
}

func (r *reader) uint64() uint64 {
	if len(r.b) < 8 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// appendSortedTable is appendTable with the keys in order, at every depth,
// so that equal tables encode to equal bytes.
func appendSortedTable(b []byte, t map[string]any) []byte {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(len(t)))
	for _, k := range keys {
		b = appendString(b, k)
		b = appendSortedValue(b, t[k])
	}
	return b
}

func appendSortedValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case []any:
		b = binary.AppendUvarint(append(b, tagArray), uint64(len(v)))
		for _, e := range v {
			b = appendSortedValue(b, e)
		}
		return b
	case map[string]any:
		return appendSortedTable(append(b, tagTable), v)
	}
	return appendValue(b, v)
}
