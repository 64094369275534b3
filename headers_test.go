package tinymq_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// sharedChain returns a table of depth levels where each level holds the
// next under two keys: depth+1 maps standing for a table of 2^depth leaves.
func sharedChain(depth int) map[string]any {
	m := map[string]any{"leaf": "x"}
	for range depth {
		m = map[string]any{"a": m, "b": m}
	}
	return m
}

// sharedThroughArrays is sharedChain with each level also holding the next
// in an array: depth+1 maps standing for a table of 3^depth leaves.
func sharedThroughArrays(depth int) map[string]any {
	m := map[string]any{"leaf": "x"}
	for range depth {
		m = map[string]any{"a": m, "b": m, "list": []any{m}}
	}
	return m
}

// intTable returns a table of n integer values.
func intTable(n int) map[string]any {
	h := make(map[string]any, n)
	for i := range n {
		h[strconv.Itoa(i)] = i
	}
	return h
}

// headersMQ is an MQ with a fanout exchange "fan" and a headers exchange
// "hdr", each with a queue that is never started.
func headersMQ(t *testing.T) *tinymq.MQ {
	t.Helper()
	m := tinymq.New()
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	require.NoError(t, m.RegisterQueue("fan", tinymq.Fanout, nop, 1))
	require.NoError(t, m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithQueueName("hq")))
	t.Cleanup(m.Stop)
	return m
}

// Headers and binding arguments are bounded in their expanded size: a table
// that appears in several places counts in each. Shared tables are checked
// once each, so tables that stand for an exponentially large one are refused
// at once rather than walked (or written to a log) whole, also on the way to
// a headers exchange's matching, and a table that contains itself, however
// far round, is refused without overflowing the stack.
func TestHeadersBoundedInExpandedSize(t *testing.T) {
	m := headersMQ(t)
	fanSelf := map[string]any{}
	fanSelf["a"], fanSelf["b"] = fanSelf, fanSelf // a cycle that doubles with each turn
	slice := make([]any, 2)
	slice[0], slice[1] = slice, slice
	throughArray := map[string]any{}
	throughArray["arr"] = []any{1, throughArray}
	long := map[string]any{} // a cycle through 10 tables
	cur := long
	for range 10 {
		next := map[string]any{}
		cur["n"] = next
		cur = next
	}
	cur["back"] = long
	big := []any{strings.Repeat("x", 600<<10)}
	bigBytes := []byte(strings.Repeat("x", 600<<10))
	bigString := map[string]any{"s": strings.Repeat("x", 600<<10)}
	many := intTable(1<<16 + 1)
	shared := intTable(40000)
	tests := []struct {
		name string
		h    map[string]any
		want error // nil: accepted
	}{
		{"maps shared along a chain 22 deep", sharedChain(22), tinymq.ErrInvalidHeaders},
		{"maps shared along a chain 30 deep", sharedChain(30), tinymq.ErrInvalidHeaders},
		{"maps and arrays shared along a chain 30 deep", sharedThroughArrays(30), tinymq.ErrInvalidHeaders},
		{"maps and arrays shared along a chain 20 deep, under a key a binding matches", map[string]any{"k": sharedThroughArrays(20)}, tinymq.ErrInvalidHeaders},
		{"a map holding itself twice", fanSelf, tinymq.ErrInvalidHeaders},
		{"a slice holding itself twice", map[string]any{"s": slice}, tinymq.ErrInvalidHeaders},
		{"a map holding itself through an array", map[string]any{"a": throughArray}, tinymq.ErrInvalidHeaders},
		{"a cycle through 10 maps", map[string]any{"c": long}, tinymq.ErrInvalidHeaders},
		{"more than 65536 values", many, tinymq.ErrInvalidHeaders},
		{"a table of 40000 values in two places", map[string]any{"one": shared, "two": shared}, tinymq.ErrInvalidHeaders},
		{"a table of 40000 values twice in an array", map[string]any{"one": []any{shared, shared}}, tinymq.ErrInvalidHeaders},
		{"more than 1 MiB of strings", map[string]any{"a": strings.Repeat("x", 1<<20)}, tinymq.ErrInvalidHeaders},
		{"an array of 600 KiB shared by two keys", map[string]any{"a": big, "b": big}, tinymq.ErrInvalidHeaders},
		{"two byte arrays of 600 KiB", map[string]any{"s": []any{bigBytes, bigBytes}}, tinymq.ErrInvalidHeaders},
		{"a table of a 600 KiB string in two places", map[string]any{"a": bigString, "b": bigString}, tinymq.ErrInvalidHeaders},
		{"a key of 1.1 MiB", map[string]any{strings.Repeat("k", 1100<<10): 1}, tinymq.ErrInvalidHeaders},
		{"maps shared along a chain 10 deep (1024 leaves)", sharedChain(10), nil},
		{"maps and arrays shared along a chain 5 deep (243 leaves)", sharedThroughArrays(5), nil},
		{"a table of 40000 values", map[string]any{"one": shared}, nil},
		{"1 MiB of keys and strings in all", map[string]any{"a": strings.Repeat("x", 1<<20-1)}, nil},
	}
	var accepted uint64
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			require.ErrorIs(t, m.Publish("fan", 1, tinymq.WithHeaders(tt.h)), tt.want)
			require.ErrorIs(t, m.Publish("hdr", 1, tinymq.WithHeaders(tt.h)), tt.want, "to a headers exchange")
			want := tinymq.ErrInvalidBinding
			if tt.want == nil {
				want = nil
				accepted++
			}
			require.ErrorIs(t, m.Bind("hq", "hdr", tinymq.Headers, tinymq.WithBindingArgs(tt.h)), want, "as binding arguments")
			assert.Less(t, time.Since(start), 2*time.Second, "checked at once, not walked")
		})
	}
	assert.Equal(t, accepted, m.Stats().Exchanges["fan"].Published, "nothing refused reached a queue")
}

// A table shared within the limits is accepted and delivered as published.
func TestHeadersSharedTableDelivered(t *testing.T) {
	got := make(chan *tinymq.Msg, 1)
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("fan", tinymq.Fanout, sink(got), 1))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	shared := map[string]any{"k": []any{"v", int64(1)}}
	require.NoError(t, m.Publish("fan", 1, tinymq.WithHeaders(map[string]any{"a": shared, "b": shared})))
	h := recv(t, got, 1)[0].Headers
	require.Equal(t, map[string]any{"a": shared, "b": shared}, h)
}

// Publishers may share one header table, with tables shared inside it, on
// many goroutines at once: checking and logging it only read it, and a
// durable queue gives it back equal (types included) after a restart.
func TestConcurrentPublishersMayShareOneHeaderTable(t *testing.T) {
	dir := t.TempDir()
	sub := map[string]any{"x": int32(1), "t": time.Unix(1700000000, 5).UTC(), "b": []byte("bytes")}
	h := map[string]any{"a": sub, "b": sub, "arr": []any{sub, sub, "s"}}
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 2, tinymq.WithQueueName("mem")))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				assert.NoError(t, m.Publish("ev", "p", tinymq.WithHeaders(h)))
			}
		})
	}
	wg.Wait()
	m.Stop() // before Start: the durable copies stay in the log

	got := make(chan *tinymq.Msg, 160)
	m = tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	msgs := recv(t, got, 160)
	stopWithin(t, m)
	for _, msg := range msgs {
		a, ok := msg.Headers["a"].(map[string]any)
		require.True(t, ok, "%T", msg.Headers["a"])
		assert.Equal(t, int32(1), a["x"])
		assert.True(t, a["t"].(time.Time).Equal(sub["t"].(time.Time)))
		assert.Equal(t, []byte("bytes"), a["b"])
		assert.Equal(t, msg.Headers["a"], msg.Headers["b"])
		assert.Len(t, msg.Headers["arr"], 3)
	}
}
