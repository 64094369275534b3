package tinymq

import (
	"bytes"
	"reflect"
	"testing"
	"time"
)

// A declared durable queue's q/ record decodes to what was encoded, always
// encodes to the same bytes (so that only a change rewrites it), and a
// truncated one is refused.
func TestQueueRecordRoundTrips(t *testing.T) {
	rec := queueRecord{retry: RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Second, MaxBackoff: time.Minute, Multiplier: 1.5, Jitter: 0.25},
		ttl: time.Hour, maxLen: 7, overflow: DropHead, dlx: "dlx", dlxKey: "k", expiry: 3 * time.Second, filtered: true,
		bindings: []BindingSpec{{Queue: "q", Exchange: "a", Kind: Direct, Keys: []string{"x", "y"}},
			{Queue: "q", Exchange: "h", Kind: Headers, Args: []map[string]any{nil, {"x-match": "any", "n": int32(3), "z": map[string]any{"b": 1, "a": []any{"s", uint8(2)}}}}},
			{Queue: "q", Exchange: "f", Kind: Fanout}}}
	v := rec.encode()
	for range 20 {
		if !bytes.Equal(v, rec.encode()) {
			t.Fatal("the encoding depends on map order")
		}
	}
	got, err := decodeQueueRecord("q", v)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Fatalf("got %#v\nwant %#v", got, rec)
	}
	for i := range v {
		if _, err := decodeQueueRecord("q", v[:i]); err == nil {
			t.Fatalf("a record cut at %d bytes decoded", i)
		}
	}
}
