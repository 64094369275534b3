package amqp

import (
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

func TestToTableUsesTheCoreFieldTypes(t *testing.T) {
	ts := time.Unix(1700000000, 0)
	in := map[string]any{
		"int": 1, "int8": int8(-1), "uint8": uint8(7), "uint8big": uint8(200), "int16": int16(2),
		"uint16": uint16(3), "int32": int32(4), "uint32": uint32(5), "int64": int64(6), "uint": uint(8),
		"uint64": uint64(9), "f32": float32(1.5), "f64": 2.5, "s": "x", "b": []byte("y"), "t": ts,
		"nil": nil, "bool": true,
		"arr":   []any{1, "a", []any{uint16(2)}},
		"table": map[string]any{"n": 1, "in": map[string]any{"u": uint32(1)}},
	}
	got, err := toTable(in)
	require.NoError(t, err)
	want := amqp091.Table{
		"int": int64(1), "int8": int8(-1), "uint8": int8(7), "uint8big": uint8(200), "int16": int16(2),
		"uint16": int32(3), "int32": int32(4), "uint32": int64(5), "int64": int64(6), "uint": int64(8),
		"uint64": int64(9), "f32": float32(1.5), "f64": 2.5, "s": "x", "b": []byte("y"), "t": ts,
		"nil": nil, "bool": true,
		"arr":   []any{int64(1), "a", []any{int32(2)}},
		"table": amqp091.Table{"n": int64(1), "in": amqp091.Table{"u": int64(1)}},
	}
	assert.Equal(t, want, got)
	require.NoError(t, got.Validate(), "the client library accepts every value")

	_, err = toTable(map[string]any{"big": uint64(1 << 63)})
	assert.Error(t, err)
	_, err = toTable(map[string]any{"chan": make(chan int)})
	assert.Error(t, err)
}

func TestUserHeadersHideTheBrokersAndTheEngines(t *testing.T) {
	h := amqp091.Table{
		"tenant": "acme", "n": int64(1), "nested": amqp091.Table{"a": []any{amqp091.Table{"b": "c"}}},
		"x-death": []any{}, "x-first-death-queue": "q", "x-last-death-reason": "expired",
		hdrWait: "w", hdrQueue: "q", hdrExchange: "e", hdrAttempt: int64(2),
	}
	assert.Equal(t, map[string]any{
		"tenant": "acme", "n": int64(1), "nested": map[string]any{"a": []any{map[string]any{"b": "c"}}},
	}, userHeaders(h))
	assert.Nil(t, userHeaders(amqp091.Table{"x-death": []any{}, hdrQueue: "q"}))
}

func TestAttemptsAndDeathsComeFromXDeath(t *testing.T) {
	when := time.Unix(1700000000, 0)
	h := amqp091.Table{
		hdrExchange: "orders",
		"x-death": []any{
			amqp091.Table{"count": int64(1), "reason": "rejected", "queue": "work", "exchange": requeueExchange,
				"routing-keys": []any{"new"}, "time": when},
			amqp091.Table{"count": int64(2), "reason": "expired", "queue": retryQueueName("work", 100), "exchange": waitExchange,
				"routing-keys": []any{"new"}, "time": when},
			amqp091.Table{"count": int64(1), "reason": "expired", "queue": retryQueueName("work.other", 100), "exchange": waitExchange,
				"routing-keys": []any{"new"}, "time": when},
			amqp091.Table{"count": int64(1), "reason": "expired", "queue": delayQueueName("orders", 5), "exchange": waitExchange,
				"routing-keys": []any{"new"}, "time": when},
		},
	}
	deaths := xdeaths(h)
	assert.Equal(t, 3, attempt(h, deaths, "work"), "two retries of work")
	assert.Equal(t, 2, attempt(h, deaths, "work.other"), "work.other's own retries only")
	assert.Equal(t, 1, attempt(h, deaths, "dlq"))
	assert.Equal(t, []tinymq.Death{{
		Reason: tinymq.ReasonRejected, Exchange: "orders", Queue: "work", RoutingKey: "new",
		Attempts: 3, Count: 1, MessageID: 42, Time: when,
	}}, toDeaths(h, deaths, 42))

	// Without x-death (a broker that does not keep the client's), the
	// engine's header still counts, for its own queue only.
	h2 := amqp091.Table{hdrQueue: "work", hdrAttempt: int64(3)}
	assert.Equal(t, 3, attempt(h2, nil, "work"))
	assert.Equal(t, 1, attempt(h2, nil, "dlq"))
}

func TestRetryWaitsAreTheDistinctBackoffs(t *testing.T) {
	p := tinymq.RetryPolicy{MaxAttempts: 10, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Multiplier: 2}
	assert.Equal(t, []int64{100, 200, 400, 800, 1000}, retryWaits(p))
	q := newQueue(nil, tinymq.QueueSpec{QueueInfo: tinymq.QueueInfo{Name: "q"}, Retry: p})
	for attempt, want := range map[int]string{1: "tinymq.retry.q.100ms", 2: "tinymq.retry.q.200ms", 5: "tinymq.retry.q.1000ms", 9: "tinymq.retry.q.1000ms"} {
		got, _ := q.waitFor(attempt)
		assert.Equal(t, want, got, "attempt %d", attempt)
	}
	assert.Contains(t, q.waitQs, "tinymq.retry.q.400", "the earlier layout's, for DeleteQueue and PurgeQueue")
	assert.Equal(t, []int64{50}, retryWaits(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 50 * time.Millisecond,
		MaxBackoff: time.Second, Multiplier: 2}))
	assert.Equal(t, int64(1), millis(time.Microsecond))
	assert.Equal(t, int64(2), millis(1500*time.Microsecond))
}

func TestIDsAreNeverZero(t *testing.T) {
	s := &idSource{}
	s.n.Store(^uint64(0) - 1)
	assert.Equal(t, ^uint64(0), s.next())
	assert.Equal(t, uint64(1), s.next(), "0 is skipped")
}

// TestJitteredWaitsAreRoundedToABoundedSetOfLevels: a jittered wait is
// rounded to the nearest of at most jitterBuckets levels spread over
// [d*(1-Jitter), d], each the TTL of a wait queue of its own, so that a
// policy has a bounded number of wait queues and every message of one waits
// as long.
func TestJitteredWaitsAreRoundedToABoundedSetOfLevels(t *testing.T) {
	assert.Equal(t, []int64{1000}, jitterLevels(1000, 0))
	levels := jitterLevels(1000, 0.8)
	assert.Len(t, levels, jitterBuckets)
	assert.Equal(t, int64(200), levels[0])
	assert.Equal(t, int64(1000), levels[len(levels)-1])
	assert.Equal(t, []int64{1, 2}, jitterLevels(2, 1), "no duplicates when the range is narrow")
	assert.Equal(t, int64(200), nearestLevel(levels, 201))
	assert.Equal(t, int64(1000), nearestLevel(levels, 990))

	p := tinymq.RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Second, MaxBackoff: 4 * time.Second, Multiplier: 2, Jitter: 0.8}
	q := newQueue(nil, tinymq.QueueSpec{QueueInfo: tinymq.QueueInfo{Name: "q"}, Retry: p})
	seen := map[string]bool{}
	for range 2000 {
		for attempt := 1; attempt < 10; attempt++ {
			name, ms := q.waitFor(attempt)
			seen[name] = true
			assert.Equal(t, retryQueueName("q", ms), name)
			assert.Contains(t, q.waitQs, name)
		}
	}
	assert.LessOrEqual(t, len(seen), 3*jitterBuckets, "3 distinct backoffs")
	assert.Greater(t, len(seen), 2*jitterBuckets, "the levels are all used")
	assert.Equal(t, 5, attempt(amqp091.Table{}, []xdeath{
		{queue: "tinymq.retry.q.1000ms", reason: "expired", count: 2},
		{queue: "tinymq.retry.q.1000", reason: "expired", count: 2}, // the earlier layout
	}, "q"))
}
