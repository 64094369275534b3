package admin

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// hostileStrings are the strings whose JSON is longest per byte.
var hostileStrings = []string{
	"",
	"plain",
	strings.Repeat("<", 400),
	strings.Repeat("\x01", 300),
	strings.Repeat("\u2028", 200),
	strings.Repeat("\"\\&>", 100),
	strings.Repeat("é", 300),
	"\xff\xfe invalid UTF-8 \xc3",
}

func TestJSONLenIsAnUpperBound(t *testing.T) {
	for _, s := range hostileStrings {
		c := clip(s)
		assert.True(t, utf8.ValidString(c), "%q", c)
		assert.LessOrEqual(t, len(c), maxStringBytes)
		b, err := json.Marshal(c)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(b), jsonLen(c), "%q", c)
	}
	assert.Equal(t, "plain", clip("plain"))
}

// The fixed costs bound every item's JSON apart from its strings: items
// with the longest numbers and the worst strings must fit their estimate.
func TestItemCostsAreUpperBounds(t *testing.T) {
	worst := clip(strings.Repeat("<", 400))
	const big = math.MaxUint64
	h := newHistory()
	st := tinymq.Stats{Queues: map[string]tinymq.QueueStats{"q": {Depth: math.MinInt}}}
	for i := range historyPoints {
		// The longest numbers: a depth at its most negative, rates of
		// counters that grow by the most they can.
		at := time.Unix(1000, 0).Add(time.Duration(i) * historyStep)
		st.Queues["q"] = tinymq.QueueStats{Depth: math.MinInt, Accepted: uint64(i%2) * big, Delivered: uint64(i%2) * big}
		h.observe(at, st)
	}
	hv := h.queue("q")
	q := queueView{Name: worst, Concurrency: math.MinInt, Consumers: math.MinInt, Paused: true, Durable: true,
		MaxAttempts: math.MinInt, MessageTTLMillis: -math.MaxFloat64, ExpiryMillis: -math.MaxFloat64,
		MaxLen: math.MinInt, Overflow: worst, DeadLetterExchange: worst, DeadLetterKey: worst, Filtered: true,
		DeliveryTimeoutMillis: -math.MaxFloat64, RateLimit: -math.MaxFloat64, RateBurst: math.MinInt, GroupOrdering: true,
		PayloadType: worst, Depth: math.MinInt, Ready: math.MinInt, Scheduled: math.MinInt, InFlight: math.MinInt,
		Abandoned: math.MinInt,
		Counters:  counters{big, big, big, big, big, big, big, big, big, big, big, big, big, big, big}, History: hv,
		Rates: &queueRates{-math.MaxFloat64, -math.MaxFloat64, -math.MaxFloat64, -math.MaxFloat64,
			-math.MaxFloat64, -math.MaxFloat64},
		ConsumerTime: consumerTime{big, -math.MaxFloat64, -math.MaxFloat64, -math.MaxFloat64, -math.MaxFloat64,
			-math.MaxFloat64}}
	b, err := json.Marshal(q)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b)+1, queueFixedBytes+hv.size()+5*jsonLen(worst), "queue")
	assert.Equal(t, q.cost(), queueFixedBytes+hv.size()+5*jsonLen(worst))
	t.Logf("queue: %d bytes of JSON, %d estimated", len(b)+1, q.cost())

	x := exchangeView{Name: worst, Kind: worst, Alternate: worst, Published: big, Unroutable: big,
		DedupWindowMillis: -math.MaxFloat64, Duplicates: big,
		Rates: &exchangeRates{-math.MaxFloat64, -math.MaxFloat64}, BindingCount: math.MinInt, Bindings: []bindingView{}}
	b, err = json.Marshal(x)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b)+1, exchangeFixedBytes+3*jsonLen(worst), "exchange")
	t.Logf("exchange: %d bytes of JSON, %d estimated", len(b)+1, exchangeFixedBytes+3*jsonLen(worst))

	d := deadLetterView{Time: worst, Reason: worst, Exchange: worst, Queue: worst, RoutingKey: worst,
		Attempts: math.MinInt, Count: math.MinInt, MessageID: big, LastError: worst, DeadLetterExchange: worst,
		Dropped: true, DropCause: worst}
	b, err = json.Marshal(d)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b)+1, deadLetterFixedBytes+8*jsonLen(worst), "dead letter")

	long := strings.Repeat("<&>", 200)
	table := map[string]any{}
	for i := range 50 {
		table[string(rune('A'+i))+long] = []any{long, []byte(long), math.NaN(), map[string]any{"k": long}, nil,
			time.Unix(1<<40, 0), int8(-1), uint64(math.MaxUint64), float32(1.5), true}
	}
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = long
	}
	args := []map[string]any{table, {}, {"x-match": "any"}}
	for range 10 {
		args = append(args, table)
	}
	bv, cost := bindingOf(tinymq.BindingSpec{Queue: long, Keys: keys, Args: args})
	b, err = json.Marshal(bv)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b)+1, cost, "binding")
	assert.Len(t, bv.Args[0], maxArgEntries+1, "entries beyond the limit are counted, not listed")
	assert.Len(t, bv.Keys, maxKeysShown)
	assert.Len(t, bv.Args, maxTablesShown)
	assert.True(t, bv.Truncated)
	assert.Less(t, cost, exchangeBudget, "one binding always fits a page of bindings")
	for k, v := range bv.Args[0] {
		assert.LessOrEqual(t, len(k), maxStringBytes)
		assert.LessOrEqual(t, len(v), maxStringBytes)
	}
}

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{
		{nil, "null"},
		{"pdf", `"pdf"`},
		{[]byte("b\n"), `"b\n"`},
		{true, "true"},
		{int32(-3), "-3"},
		{uint64(math.MaxUint64), "18446744073709551615"},
		{math.NaN(), "NaN"},
		{float32(0.1), "0.1"},
		{time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC), "2024-05-06T07:08:09Z"},
		{[]any{"a", int64(1)}, `["a", 1]`},
		{map[string]any{"b": 1, "a": []any{}}, `{"a": [], "b": 1}`},
		{struct{}{}, "(struct {})"},
	} {
		assert.Equal(t, tc.want, formatValue(tc.in), "%#v", tc.in)
	}
	deep := any("x")
	for range 100 {
		deep = []any{deep}
	}
	assert.Equal(t, "[[[[[[…]]]]]]", formatValue(deep))
}

func TestSampler(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var st tinymq.Stats
	s := newSampler(10 * time.Second)

	_, ok := s.observe(t0, st)
	assert.False(t, ok, "no base at first")
	_, ok = s.observe(t0.Add(500*time.Millisecond), st)
	assert.False(t, ok, "a base younger than a tenth of the window is noise")
	base, ok := s.observe(t0.Add(2*time.Second), st)
	require.True(t, ok)
	assert.Equal(t, t0, base.at)

	// Requests every 100ms for a minute: the base stays about a window old,
	// and the sampler keeps a bounded number of snapshots.
	for d := 2 * time.Second; d < time.Minute; d += 100 * time.Millisecond {
		base, ok = s.observe(t0.Add(d), st)
		require.True(t, ok)
		age := d - base.at.Sub(t0)
		assert.GreaterOrEqual(t, age, min(d, 10*time.Second), "at %v", d)
		// At most the window plus the longest gap between kept snapshots
		// (2s, at the start).
		assert.LessOrEqual(t, age, 12*time.Second, "at %v", d)
		assert.LessOrEqual(t, len(s.samples), maxSamples+1)
	}

	// After a long pause the base is the last snapshot, however old.
	base, ok = s.observe(t0.Add(time.Hour), st)
	require.True(t, ok)
	assert.Greater(t, base.at.Sub(t0), time.Minute-time.Second)
	assert.Less(t, base.at.Sub(t0), time.Minute)
}

func TestPerSecond(t *testing.T) {
	assert.InDelta(t, 2.5, perSecond(15, 10, 2*time.Second), 1e-12)
	assert.Zero(t, perSecond(10, 15, time.Second), "a counter that went down")
	assert.Zero(t, perSecond(15, 10, 0))
	assert.InDelta(t, 0.333, perSecond(1, 0, 3*time.Second), 1e-12)
}
