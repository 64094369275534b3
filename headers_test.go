package tinymq_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

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
// at once rather than walked (or written to a log) whole, and a table that
// contains itself is refused without overflowing the stack.
func TestHeadersBoundedInExpandedSize(t *testing.T) {
	m := headersMQ(t)
	fanSelf := map[string]any{}
	fanSelf["a"], fanSelf["b"] = fanSelf, fanSelf // a cycle that doubles with each turn
	slice := make([]any, 2)
	slice[0], slice[1] = slice, slice
	big := []any{strings.Repeat("x", 600<<10)}
	many := make(map[string]any, 1<<16+1)
	for i := range 1<<16 + 1 {
		many[strconv.Itoa(i)] = i
	}
	tests := []struct {
		name string
		h    map[string]any
		want error // nil: accepted
	}{
		{"maps shared along a chain 22 deep", sharedChain(22), tinymq.ErrInvalidHeaders},
		{"maps shared along a chain 30 deep", sharedChain(30), tinymq.ErrInvalidHeaders},
		{"a map holding itself twice", fanSelf, tinymq.ErrInvalidHeaders},
		{"a slice holding itself twice", map[string]any{"s": slice}, tinymq.ErrInvalidHeaders},
		{"more than 65536 values", many, tinymq.ErrInvalidHeaders},
		{"more than 1 MiB of strings", map[string]any{"a": strings.Repeat("x", 1<<20)}, tinymq.ErrInvalidHeaders},
		{"an array of 600 KiB shared by two keys", map[string]any{"a": big, "b": big}, tinymq.ErrInvalidHeaders},
		{"maps shared along a chain 10 deep (1024 leaves)", sharedChain(10), nil},
		{"1 MiB of keys and strings in all", map[string]any{"a": strings.Repeat("x", 1<<20-1)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, m.Publish("fan", 1, tinymq.WithHeaders(tt.h)), tt.want)
			want := tinymq.ErrInvalidBinding
			if tt.want == nil {
				want = nil
			}
			require.ErrorIs(t, m.Bind("hq", "hdr", tinymq.Headers, tinymq.WithBindingArgs(tt.h)), want, "as binding arguments")
		})
	}
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
