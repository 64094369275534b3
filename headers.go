package tinymq

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// This file holds AMQP field values and the headers exchange's matching rule.
//
// Go values map to AMQP 0-9-1 field types as a RabbitMQ client would send them:
//
//	nil                 V  void
//	bool                t  boolean
//	int8, uint8         b  short-short-int
//	int16               s  short-int
//	int32, uint16       I  long-int
//	int, int64, uint32,
//	uint, uint64        l  long-long-int (values above MaxInt64 are rejected)
//	float32             f  float
//	float64             d  double
//	string              S  long string
//	[]byte              x  byte array
//	time.Time           T  timestamp (whole seconds)
//	[]any               A  array
//	map[string]any      F  table
//
// RabbitMQ's headers exchange compares a binding argument with a header by
// Erlang's == on the two values, ignoring their field types. So 1 (int32) equals
// 1 (int64) and 1.0 (float64), a string equals a []byte of the same bytes, and a
// timestamp equals the integer of its Unix seconds. Inside arrays and tables the
// elements are {type, value} pairs, so there the types must be equal too. A
// binding argument of type void (nil) matches any header of that name, whatever
// its value. Nested tables are compared by key, not in wire order.

const maxKeyLen = 255

// fieldTag returns the AMQP field type of v, or 0 when v has none.
func fieldTag(v any) byte {
	switch v := v.(type) {
	case nil:
		return 'V'
	case bool:
		return 't'
	case int8, uint8:
		return 'b'
	case int16:
		return 's'
	case int32, uint16:
		return 'I'
	case int, int64, uint32:
		return 'l'
	case uint:
		if uint64(v) > math.MaxInt64 {
			return 0
		}
		return 'l'
	case uint64:
		if v > math.MaxInt64 {
			return 0
		}
		return 'l'
	case float32:
		return 'f'
	case float64:
		return 'd'
	case string:
		return 'S'
	case []byte:
		return 'x'
	case time.Time:
		return 'T'
	case []any:
		return 'A'
	case map[string]any:
		return 'F'
	}
	return 0
}

// maxDepth bounds how deeply arrays and tables may nest in headers and
// binding arguments.
const maxDepth = 32

// Headers and binding arguments are bounded in size as well as depth, counted
// as they are stored and compared: a table or array that appears in several
// places (a shared sub-map) counts once per place. maxHeaderValues bounds the
// values, nested ones included; maxHeaderBytes the bytes of keys, strings and
// byte arrays. Without them a few maps shared along a chain (m0 holding m1
// under two keys, m1 holding m2 under two keys, ...) stand for a table that
// doubles with each level, which a durable queue's log would write out whole.
const (
	maxHeaderValues = 1 << 16
	maxHeaderBytes  = 1 << 20
)

// validateTable reports an error for a value of t, or an element of one,
// that has no AMQP field type, or for a t that nests deeper than maxDepth,
// contains itself, or is larger than maxHeaderValues or maxHeaderBytes. It
// looks at each table and array once however many times it appears, so it
// costs time linear in the number of distinct values, and it allocates only
// beyond a few nested tables and arrays, and to describe an error.
func validateTable(t map[string]any, depth int) error {
	var c headerCheck
	sz, err := c.table(t, depth)
	if err != nil {
		return err
	}
	return sz.check()
}

// headerSize is the expanded size of a value: how many values it holds
// (itself included) and how many bytes of keys, strings and byte arrays.
// Sizes saturate just above the limits, so that sums cannot overflow.
type headerSize struct {
	values, bytes int
	height        int // tables and arrays nested in it, itself included
}

func (s *headerSize) add(o headerSize) {
	s.values = min(s.values+o.values, maxHeaderValues+1)
	s.bytes = min(s.bytes+o.bytes, maxHeaderBytes+1)
}

func (s headerSize) check() error {
	if s.values > maxHeaderValues {
		return fmt.Errorf("more than %d values in all, counting each place a shared table or array appears", maxHeaderValues)
	}
	if s.bytes > maxHeaderBytes {
		return fmt.Errorf("more than %d bytes of keys, strings and byte arrays in all, counting each place a shared table or array appears", maxHeaderBytes)
	}
	return nil
}

var errCycle = errors.New("contains itself (a cycle)")

// headerCheck remembers the size of each table and array it has checked,
// by identity, so that one shared by several keys is walked once, and the
// ones being walked, so that one containing itself is an error rather than
// an endless recursion.
type headerCheck struct {
	small [8]seenValue // the first ones, without allocating
	n     int
	more  map[seenKey]*seenValue
}

// seenKey identifies a table (by its map) or an array (by its elements).
type seenKey struct {
	p unsafe.Pointer
	n int // an array's length: two slices of one array differ by it
}

type seenValue struct {
	key  seenKey
	done bool // false while it is being walked
	size headerSize
}

// seen returns the record of k, and false when k is new (the record is then
// made, not done).
func (c *headerCheck) seen(k seenKey) (*seenValue, bool) {
	for i := range c.small[:c.n] {
		if c.small[i].key == k {
			return &c.small[i], true
		}
	}
	if v := c.more[k]; v != nil {
		return v, true
	}
	if c.n < len(c.small) {
		c.small[c.n] = seenValue{key: k}
		c.n++
		return &c.small[c.n-1], false
	}
	if c.more == nil {
		c.more = make(map[seenKey]*seenValue)
	}
	v := &seenValue{key: k}
	c.more[k] = v
	return v, false
}

// value checks v, found depth tables and arrays deep.
func (c *headerCheck) value(v any, depth int) (headerSize, error) {
	var k seenKey
	switch fieldTag(v) {
	case 0:
		return headerSize{}, fmt.Errorf("%T has no AMQP field type", v)
	case 'S':
		return headerSize{values: 1, bytes: len(v.(string))}, nil
	case 'x':
		return headerSize{values: 1, bytes: len(v.([]byte))}, nil
	case 'A':
		a := v.([]any)
		k = seenKey{unsafe.Pointer(unsafe.SliceData(a)), len(a)}
	case 'F':
		k = seenKey{p: reflect.ValueOf(v).UnsafePointer()}
	default:
		return headerSize{values: 1}, nil
	}
	if depth >= maxDepth {
		return headerSize{}, fmt.Errorf("nested more than %d deep", maxDepth)
	}
	rec, ok := c.seen(k)
	if ok {
		if !rec.done {
			return headerSize{}, errCycle
		}
		if depth+rec.size.height > maxDepth {
			return headerSize{}, fmt.Errorf("nested more than %d deep", maxDepth)
		}
		return rec.size, nil
	}
	var sz headerSize
	var err error
	if m, isTable := v.(map[string]any); isTable {
		sz, err = c.table(m, depth+1)
	} else {
		for i, e := range v.([]any) {
			es, err := c.value(e, depth+1)
			if err != nil {
				return headerSize{}, fmt.Errorf("[%d]: %w", i, err)
			}
			sz.add(es)
			sz.height = max(sz.height, es.height)
			if err := sz.check(); err != nil {
				return headerSize{}, err
			}
		}
	}
	if err != nil {
		return headerSize{}, err
	}
	sz.add(headerSize{values: 1})
	sz.height++
	rec.size, rec.done = sz, true // records never move: small is an array, more holds pointers
	return sz, nil
}

// table checks the entries of t, a table found depth tables deep.
func (c *headerCheck) table(t map[string]any, depth int) (headerSize, error) {
	var sz headerSize
	for k, v := range t {
		if len(k) > maxKeyLen {
			return headerSize{}, fmt.Errorf("key %.20q...: %w", k, ErrKeyTooLong)
		}
		vs, err := c.value(v, depth)
		if err != nil {
			return headerSize{}, fmt.Errorf("%q: %w", k, err)
		}
		sz.add(vs)
		sz.add(headerSize{bytes: len(k)})
		sz.height = max(sz.height, vs.height)
		if err := sz.check(); err != nil {
			return headerSize{}, err
		}
	}
	return sz, nil
}

// hasNaN reports whether a validated value holds a NaN, which equals nothing.
func hasNaN(v any) bool {
	switch v := v.(type) {
	case float32:
		return v != v
	case float64:
		return math.IsNaN(v)
	case []any:
		return slices.ContainsFunc(v, hasNaN)
	case map[string]any:
		for _, e := range v {
			if hasNaN(e) {
				return true
			}
		}
	}
	return false
}

// asInt returns v as an integer when it is one; timestamps count as integers of
// seconds, as RabbitMQ stores them. Validated values fit in an int64.
func asInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint64:
		return int64(v), true
	case time.Time:
		return v.Unix(), true
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

func asBytes(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// valuesEqual is Erlang's == on two decoded AMQP field values.
func valuesEqual(a, b any) bool {
	if ai, ok := asInt(a); ok {
		if bi, ok := asInt(b); ok {
			return ai == bi
		}
		if bf, ok := asFloat(b); ok {
			return float64(ai) == bf
		}
		return false
	}
	if af, ok := asFloat(a); ok {
		if bf, ok := asFloat(b); ok {
			return af == bf
		}
		if bi, ok := asInt(b); ok {
			return af == float64(bi)
		}
		return false
	}
	if as, ok := asBytes(a); ok {
		bs, ok := asBytes(b)
		return ok && as == bs
	}
	switch a := a.(type) {
	case nil:
		return b == nil
	case bool:
		bb, ok := b.(bool)
		return ok && a == bb
	case []any:
		bb, ok := b.([]any)
		if !ok || len(a) != len(bb) {
			return false
		}
		for i := range a {
			if !fieldsEqual(a[i], bb[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		bb, ok := b.(map[string]any)
		if !ok || len(a) != len(bb) {
			return false
		}
		for k, av := range a {
			bv, ok := bb[k]
			if !ok || !fieldsEqual(av, bv) {
				return false
			}
		}
		return true
	}
	return false
}

// fieldsEqual compares two {type, value} pairs, as elements of arrays and tables are.
func fieldsEqual(a, b any) bool {
	return fieldTag(a) == fieldTag(b) && valuesEqual(a, b)
}

type xMatch uint8

const (
	matchAll xMatch = iota
	matchAny
	matchAllWithX
	matchAnyWithX
)

// headersBinding is one binding of a headers exchange, parsed once at bind time.
type headersBinding struct {
	mode xMatch
	keys []string
	vals []any // nil entry: presence only (void)
}

func parseHeadersBinding(args map[string]any) (headersBinding, error) {
	b := headersBinding{mode: matchAll}
	if err := validateTable(args, 0); err != nil {
		return b, fmt.Errorf("%w: %w", ErrInvalidBinding, err)
	}
	for k, v := range args {
		if hasNaN(v) {
			return b, fmt.Errorf("%w: argument %q holds NaN, which matches no header", ErrInvalidBinding, k)
		}
	}
	if xm, ok := args["x-match"]; ok {
		s, ok := xm.(string)
		if !ok {
			return b, fmt.Errorf("%w: x-match is %T, want a string", ErrInvalidBinding, xm)
		}
		switch s {
		case "all":
			b.mode = matchAll
		case "any":
			b.mode = matchAny
		case "all-with-x":
			b.mode = matchAllWithX
		case "any-with-x":
			b.mode = matchAnyWithX
		default:
			return b, fmt.Errorf("%w: x-match %q, want all, any, all-with-x or any-with-x", ErrInvalidBinding, s)
		}
	}
	withX := b.mode == matchAllWithX || b.mode == matchAnyWithX
	for k, v := range args {
		if k == "x-match" || (!withX && strings.HasPrefix(k, "x-")) {
			continue
		}
		b.keys = append(b.keys, k)
		b.vals = append(b.vals, v)
	}
	return b, nil
}

// match reports whether headers h satisfy the binding, as RabbitMQ's headers
// exchange decides it: with all, every argument must match (no arguments: any
// message matches); with any, at least one must (no arguments: none matches).
func (b *headersBinding) match(h map[string]any) bool {
	all := b.mode == matchAll || b.mode == matchAllWithX
	for i, k := range b.keys {
		v, ok := h[k]
		ok = ok && (b.vals[i] == nil || valuesEqual(b.vals[i], v))
		if all && !ok {
			return false
		}
		if !all && ok {
			return true
		}
	}
	return all
}
