package amqp

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// idSource stamps message IDs: a random 64-bit start per engine, then a
// counter. Two engines' IDs collide only if their ranges overlap, which for
// n engines publishing m messages each has a probability of about
// n*n*m / 2^64 (a thousand engines with a billion messages each: 1 in 20,000).
type idSource struct{ n atomic.Uint64 }

func newIDSource() *idSource {
	s := new(idSource)
	s.n.Store(rand.Uint64())
	return s
}

func (s *idSource) next() uint64 {
	for {
		if v := s.n.Add(1); v != 0 { // 0 means "no ID"
			return v
		}
	}
}

// toTable converts headers or binding arguments, already validated by the
// MQ, into AMQP field values with the field types that the core's headers
// exchange assumes (see headers.go in tinymq): the client library would send
// an int as a 32-bit long-int and refuse the unsigned types.
func toTable(m map[string]any) (amqp091.Table, error) {
	if m == nil {
		return nil, nil
	}
	t := make(amqp091.Table, len(m))
	for k, v := range m {
		fv, err := toField(v)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", k, err)
		}
		t[k] = fv
	}
	return t, nil
}

func toField(v any) (any, error) {
	switch v := v.(type) {
	case nil, bool, int8, int16, int32, int64, float32, float64, string, []byte, time.Time:
		return v, nil
	case uint8:
		if v <= math.MaxInt8 {
			return int8(v), nil // short-short-int, as the core types it
		}
		return v, nil // unsigned short-short-int: the value must survive
	case uint16:
		return int32(v), nil
	case int:
		return int64(v), nil
	case uint32:
		return int64(v), nil
	case uint:
		if uint64(v) > math.MaxInt64 {
			return nil, fmt.Errorf("%d does not fit a long-long-int", v)
		}
		return int64(v), nil
	case uint64:
		if v > math.MaxInt64 {
			return nil, fmt.Errorf("%d does not fit a long-long-int", v)
		}
		return int64(v), nil
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			fv, err := toField(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			a[i] = fv
		}
		return a, nil
	case map[string]any:
		return toTable(v)
	case amqp091.Table:
		return toTable(v)
	}
	return nil, fmt.Errorf("%T has no AMQP field type", v)
}

// fromField turns a received field value into what WithHeaders takes: tables
// become map[string]any, recursively.
func fromField(v any) any {
	switch v := v.(type) {
	case amqp091.Table:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = fromField(e)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = fromField(e)
		}
		return a
	}
	return v
}

// userHeaders returns the headers the publisher gave: without the broker's
// dead-lettering headers and the engine's own; nil when none are left.
func userHeaders(h amqp091.Table) map[string]any {
	var m map[string]any
	for k, v := range h {
		if deathHeader(k) || strings.HasPrefix(k, hdrPrefix) {
			continue
		}
		if m == nil {
			m = make(map[string]any, len(h))
		}
		m[k] = fromField(v)
	}
	return m
}

// deathHeader reports whether k is one of the headers that the broker's
// dead-lettering sets.
func deathHeader(k string) bool {
	return k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// xdeath is one entry of the x-death header.
type xdeath struct {
	queue, reason, exchange, key string
	count                        int64
	time                         time.Time
}

func xdeaths(h amqp091.Table) []xdeath {
	arr, _ := h["x-death"].([]any)
	out := make([]xdeath, 0, len(arr))
	for _, e := range arr {
		t, ok := e.(amqp091.Table)
		if !ok {
			continue
		}
		d := xdeath{}
		d.queue, _ = t["queue"].(string)
		d.reason, _ = t["reason"].(string)
		d.exchange, _ = t["exchange"].(string)
		if keys, _ := t["routing-keys"].([]any); len(keys) > 0 {
			d.key, _ = keys[0].(string)
		}
		d.count = asInt64(t["count"])
		d.time, _ = t["time"].(time.Time)
		out = append(out, d)
	}
	return out
}

func asInt64(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int16:
		return int64(v)
	case int8:
		return int64(v)
	case uint8:
		return int64(v)
	case uint16:
		return int64(v)
	case uint32:
		return int64(v)
	case int:
		return int64(v)
	}
	return 0
}

// retriesIn counts the retry waits a message went through for queue: the
// x-death counts of that queue's retry wait queues, of this layout and of the
// earlier one (see wait.go).
func retriesIn(deaths []xdeath, queue string) int {
	prefix := retryPrefix + queue + "."
	n := 0
	for _, d := range deaths {
		if d.reason == "expired" && strings.HasPrefix(d.queue, prefix) && isWaitSuffix(d.queue[len(prefix):]) {
			n += int(d.count)
		}
	}
	return n
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// attempt returns the attempt number of a delivery to queue: one more than
// the retries recorded in x-death, or the engine's own header when the
// broker did not keep x-death (it is set on each retry for this queue).
func attempt(h amqp091.Table, deaths []xdeath, queue string) int {
	n := 1 + retriesIn(deaths, queue)
	if q, _ := h[hdrQueue].(string); q == queue {
		if a := int(asInt64(h[hdrAttempt])); a > n {
			n = a
		}
	}
	return n
}

// toDeaths builds Msg.Deaths from x-death, the latest first, leaving out the
// engine's wait queues. A death that happened after a retry names the
// exchange the message was published to, from the engine's header, rather
// than its internal requeue exchange.
func toDeaths(h amqp091.Table, deaths []xdeath, id uint64) []tinymq.Death {
	var out []tinymq.Death
	for _, d := range deaths {
		if strings.HasPrefix(d.queue, retryPrefix) || strings.HasPrefix(d.queue, delayPrefix) {
			continue
		}
		ex := d.exchange
		if ex == requeueExchange || ex == waitExchange {
			ex, _ = h[hdrExchange].(string)
		}
		attempts := retriesIn(deaths, d.queue)
		if d.reason == string(tinymq.ReasonRejected) {
			attempts++
		}
		out = append(out, tinymq.Death{
			Reason:     tinymq.DeathReason(d.reason),
			Exchange:   ex,
			Queue:      d.queue,
			RoutingKey: d.key,
			Attempts:   attempts,
			Count:      int(d.count),
			MessageID:  id,
			Time:       d.time,
		})
	}
	return out
}

// toMsg builds what the consumer of queue gets from a delivery.
func (e *engine) toMsg(queue string, d *amqp091.Delivery) *tinymq.Msg {
	id, _ := strconv.ParseUint(d.MessageId, 10, 64)
	deaths := xdeaths(d.Headers)
	ex := d.Exchange
	switch ex {
	case requeueExchange:
		ex, _ = d.Headers[hdrExchange].(string)
	case "":
		ex = DefaultExchange
	}
	return &tinymq.Msg{
		ID:          id,
		Exchange:    ex,
		Queue:       queue,
		RoutingKey:  d.RoutingKey,
		Headers:     userHeaders(d.Headers),
		Data:        tinymq.Encoded{Body: d.Body, Codec: e.codec},
		Attempt:     attempt(d.Headers, deaths, queue),
		Deaths:      toDeaths(d.Headers, deaths, id),
		Redelivered: d.Redelivered,
	}
}

func isNoRoute(err error) bool { return errors.Is(err, tinymq.ErrNoRoute) }
