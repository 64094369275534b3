package tinymq

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/tinymq/tinymq/internal/guard"
)

// Codec turns published Data into bytes and back, for messages that leave
// memory: those of durable queues ([WithDurable]) and those of a broker engine
// ([WithEngine]). Its methods may be called from many goroutines at once.
// [JSONCodec] is the default; set another with [WithCodec].
type Codec interface {
	// Marshal encodes v.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into the value v points to.
	Unmarshal(data []byte, v any) error
	// ContentType names the encoding, as a MIME type ("application/json").
	ContentType() string
}

// JSONCodec encodes with encoding/json. It is the default [Codec].
type JSONCodec struct{}

// Marshal encodes v as JSON. A []byte becomes a base64 string, as
// encoding/json makes it.
func (JSONCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok && b != nil {
		// encoding/json's own encoding of a []byte, without its reflection
		// and buffer pool: the common payload of a durable queue.
		return appendJSONBytes(make([]byte, 0, jsonBytesLen(len(b))), b), nil
	}
	return json.Marshal(v)
}

// jsonBytesLen is the length of JSONCodec's encoding of a []byte of n bytes.
func jsonBytesLen(n int) int { return base64.StdEncoding.EncodedLen(n) + 2 }

// appendJSONBytes appends JSONCodec's encoding of b, a non-nil []byte.
func appendJSONBytes(out, b []byte) []byte {
	out = append(out, '"')
	out = base64.StdEncoding.AppendEncode(out, b)
	return append(out, '"')
}

// inPlaceBytes is the size from which a durable publish of a []byte encodes
// it straight into its log record (see jsonBytes). Below it the body gets an
// allocation of its own and the record's batch is reused: as few
// allocations, and no batch allocated per publish.
const inPlaceBytes = 64 << 10

// jsonBytes returns data when c is JSONCodec and data a []byte of at least
// inPlaceBytes: its encoding, of a length known in advance, can then be
// written straight into a log record, and no user code runs for it.
func jsonBytes(c Codec, data any) ([]byte, bool) {
	switch c.(type) {
	case JSONCodec, *JSONCodec:
		b, ok := data.([]byte)
		return b, ok && len(b) >= inPlaceBytes
	}
	return nil, false
}

// dataSize returns the size of data when it is known without encoding it:
// the length of a []byte, a string, a json.RawMessage, or an Encoded's Body.
func dataSize(data any) (int, bool) {
	switch v := data.(type) {
	case []byte:
		return len(v), true
	case string:
		return len(v), true
	case json.RawMessage:
		return len(v), true
	case Encoded:
		return len(v.Body), true
	}
	return 0, false
}

// Unmarshal decodes JSON data into v.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// ContentType returns "application/json".
func (JSONCodec) ContentType() string { return "application/json" }

// Encoded is the Data of a message that was stored or sent in encoded form
// (a durable queue or a broker engine), as an untyped consumer receives it:
// the codec's bytes of the published value, and the codec to decode them
// with. A [Handler] consumer of a concrete type never sees it: Handler
// decodes it into its type (a consumer of any gets the Encoded).
// A consumer gets an Encoded on such a queue every time, before and after a
// restart alike, so what it receives cannot depend on a crash.
type Encoded struct {
	// Body is what Codec.Marshal made of the published value.
	Body []byte
	// Codec decodes Body.
	Codec Codec
}

// Decode decodes the payload into the value v points to. A nil Codec is
// [JSONCodec]. Errors wrap [ErrPayloadType].
func (e Encoded) Decode(v any) (err error) {
	c := e.Codec
	if c == nil {
		c = JSONCodec{}
	}
	defer func() { // the codec is user code
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: codec panicked: %s", ErrPayloadType, guard.ValueText(r))
		}
	}()
	if err := c.Unmarshal(e.Body, v); err != nil {
		return fmt.Errorf("%w: decoding: %w", ErrPayloadType, err)
	}
	return nil
}
