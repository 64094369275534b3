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
	q := &cqueue{waits: retryWaits(p), waitQs: []string{"a", "b", "c", "d", "e"}}
	for attempt, want := range map[int]string{1: "a", 2: "b", 5: "e", 9: "e"} {
		got, _ := q.waitFor(attempt)
		assert.Equal(t, want, got, "attempt %d", attempt)
	}
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
