package admin

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tinymq/tinymq"
)

// Bounds on what one response holds. Names are user input: a queue may be
// called anything, bind any number of keys, and fail with any error text.
const (
	// maxStringBytes is the longest string (name, key, error) sent, in bytes
	// of UTF-8; longer ones are cut and end in "…".
	maxStringBytes = 256
	// maxResponseBytes bounds the JSON of one overview.
	maxResponseBytes = 1 << 20
	// fixedBytes is an upper bound on the overview's own fields (time,
	// refresh, counts, brackets); items get the rest of maxResponseBytes.
	fixedBytes = 512
	// maxArgEntries bounds the entries shown of one binding-argument table.
	maxArgEntries = 32
)

// overview is the JSON of /api/overview; the README documents every field.
type overview struct {
	Time          string `json:"time"`
	RefreshMillis int64  `json:"refresh_ms"`
	// RateSeconds is the interval the rates cover; null until known.
	RateSeconds   *float64         `json:"rate_seconds"`
	ExchangeCount int              `json:"exchange_count"`
	QueueCount    int              `json:"queue_count"`
	Exchanges     []exchangeView   `json:"exchanges"`
	Queues        []queueView      `json:"queues"`
	DeadLetters   []deadLetterView `json:"dead_letters"`
	Truncated     bool             `json:"truncated"`
}

type exchangeView struct {
	Name       string         `json:"name"`
	Kind       string         `json:"kind"`
	Alternate  string         `json:"alternate"`
	Published  uint64         `json:"published"`
	Unroutable uint64         `json:"unroutable"`
	Rates      *exchangeRates `json:"rates"`
	Bindings   []bindingView  `json:"bindings"`
}

type exchangeRates struct {
	Published  float64 `json:"published_per_sec"`
	Unroutable float64 `json:"unroutable_per_sec"`
}

type bindingView struct {
	Queue string              `json:"queue"`
	Keys  []string            `json:"keys"`
	Args  []map[string]string `json:"args"`
}

type queueView struct {
	Name               string       `json:"name"`
	Concurrency        int          `json:"concurrency"`
	MaxAttempts        int          `json:"max_attempts"`
	MessageTTLMillis   float64      `json:"message_ttl_ms"`
	MaxLen             int          `json:"max_len"`
	Overflow           string       `json:"overflow"`
	DeadLetterExchange string       `json:"dead_letter_exchange"`
	DeadLetterKey      string       `json:"dead_letter_key"`
	Filtered           bool         `json:"filtered"`
	Depth              int          `json:"depth"`
	Ready              int          `json:"ready"`
	Scheduled          int          `json:"scheduled"`
	InFlight           int          `json:"in_flight"`
	Counters           counters     `json:"counters"`
	Rates              *queueRates  `json:"rates"`
	ConsumerTime       consumerTime `json:"consumer_time"`
}

// counters are the counters of tinymq.QueueStats.
type counters struct {
	Accepted     uint64 `json:"accepted"`
	Delivered    uint64 `json:"delivered"`
	Succeeded    uint64 `json:"succeeded"`
	Failed       uint64 `json:"failed"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Expired      uint64 `json:"expired"`
	Overflowed   uint64 `json:"overflowed"`
	Rejected     uint64 `json:"rejected"`
	Dropped      uint64 `json:"dropped"`
	Undelivered  uint64 `json:"undelivered"`
}

func countersOf(q tinymq.QueueStats) counters {
	return counters{Accepted: q.Accepted, Delivered: q.Delivered, Succeeded: q.Succeeded, Failed: q.Failed,
		Retried: q.Retried, DeadLettered: q.DeadLettered, Expired: q.Expired, Overflowed: q.Overflowed,
		Rejected: q.Rejected, Dropped: q.Dropped, Undelivered: q.Undelivered}
}

// queueRates are per-second rates of the queue's main counters. Published is
// the rate of Accepted: messages published into the queue.
type queueRates struct {
	Published    float64 `json:"published_per_sec"`
	Delivered    float64 `json:"delivered_per_sec"`
	Succeeded    float64 `json:"succeeded_per_sec"`
	Failed       float64 `json:"failed_per_sec"`
	DeadLettered float64 `json:"dead_lettered_per_sec"`
	Dropped      float64 `json:"dropped_per_sec"`
}

type consumerTime struct {
	Samples    uint64  `json:"samples"`
	MeanMillis float64 `json:"mean_ms"`
	P50Millis  float64 `json:"p50_ms"`
	P90Millis  float64 `json:"p90_ms"`
	P99Millis  float64 `json:"p99_ms"`
	MaxMillis  float64 `json:"max_ms"`
}

type deadLetterView struct {
	Time               string `json:"time"`
	Reason             string `json:"reason"`
	Exchange           string `json:"exchange"`
	Queue              string `json:"queue"`
	RoutingKey         string `json:"routing_key"`
	Attempts           int    `json:"attempts"`
	Count              int    `json:"count"`
	MessageID          uint64 `json:"message_id"`
	LastError          string `json:"last_error"`
	DeadLetterExchange string `json:"dead_letter_exchange"`
	Dropped            bool   `json:"dropped"`
	DropCause          string `json:"drop_cause"`
}

// Upper bounds on the JSON of each item apart from its strings: field names,
// punctuation and numbers (at most 24 bytes each).
const (
	queueFixedBytes      = 1500
	exchangeFixedBytes   = 300
	bindingFixedBytes    = 50
	deadLetterFixedBytes = 500
)

// errCollect is returned when the MQ (its engine) panicked while being read.
var errCollect = errors.New("admin: reading the MQ panicked")

// overview reads the MQ and builds a bounded overview. The MQ's calls are
// made without holding any lock of the handler's.
func (h *handler) overview() (ov overview, err error) {
	var (
		topo    tinymq.Topology
		st      tinymq.Stats
		dead    []tinymq.DeadLetter
		sampled time.Time
	)
	func() {
		// An engine is user code: a panic in it fails this request only.
		defer func() {
			if recover() != nil {
				err = errCollect
			}
		}()
		topo = h.mq.Topology()
		st = h.mq.Stats()
		sampled = time.Now()
		dead = h.mq.RecentDeadLetters()
	}()
	if err != nil {
		return overview{}, err
	}

	cur := sampleOf(sampled, st)
	base, haveBase := h.samples.observe(sampled, cur)
	dt := sampled.Sub(base.at)

	ov = overview{
		Time:          formatTime(sampled),
		RefreshMillis: h.cfg.refresh.Milliseconds(),
		ExchangeCount: len(topo.Exchanges),
		QueueCount:    len(topo.Queues),
		Exchanges:     []exchangeView{},
		Queues:        []queueView{},
		DeadLetters:   []deadLetterView{},
	}
	if haveBase {
		secs := math.Round(dt.Seconds()*1000) / 1000
		ov.RateSeconds = &secs
	}
	budget := maxResponseBytes - fixedBytes

	for _, qi := range topo.Queues {
		qs := st.Queues[qi.Name]
		qv := queueView{
			Name:               clip(qi.Name),
			Concurrency:        qi.Concurrency,
			MaxAttempts:        qi.MaxAttempts,
			MessageTTLMillis:   millis(qi.MessageTTL),
			MaxLen:             qi.MaxLen,
			Overflow:           overflowName(qi.Overflow),
			DeadLetterExchange: clip(qi.DeadLetterExchange),
			DeadLetterKey:      clip(qi.DeadLetterKey),
			Filtered:           qi.Filtered,
			Depth:              qs.Depth,
			Ready:              qs.Ready,
			Scheduled:          qs.Scheduled,
			InFlight:           qs.InFlight,
			Counters:           countersOf(qs),
			ConsumerTime: consumerTime{
				Samples:    qs.ConsumerTime.Samples,
				MeanMillis: millis(qs.ConsumerTime.Mean),
				P50Millis:  millis(qs.ConsumerTime.P50),
				P90Millis:  millis(qs.ConsumerTime.P90),
				P99Millis:  millis(qs.ConsumerTime.P99),
				MaxMillis:  millis(qs.ConsumerTime.Max),
			},
		}
		if haveBase {
			// A queue missing from the base did not exist then: its
			// counters started at zero since.
			old, c := base.queues[qi.Name], qv.Counters
			qv.Rates = &queueRates{
				Published:    perSecond(c.Accepted, old.Accepted, dt),
				Delivered:    perSecond(c.Delivered, old.Delivered, dt),
				Succeeded:    perSecond(c.Succeeded, old.Succeeded, dt),
				Failed:       perSecond(c.Failed, old.Failed, dt),
				DeadLettered: perSecond(c.DeadLettered, old.DeadLettered, dt),
				Dropped:      perSecond(c.Dropped, old.Dropped, dt),
			}
		}
		cost := queueFixedBytes + jsonLen(qv.Name) + jsonLen(qv.Overflow) + jsonLen(qv.DeadLetterExchange) +
			jsonLen(qv.DeadLetterKey)
		if cost > budget {
			ov.Truncated = true
			break
		}
		budget -= cost
		ov.Queues = append(ov.Queues, qv)
	}

	for _, ei := range topo.Exchanges {
		es := st.Exchanges[ei.Name]
		ev := exchangeView{
			Name:       clip(ei.Name),
			Kind:       ei.Kind.String(),
			Alternate:  clip(ei.Alternate),
			Published:  es.Published,
			Unroutable: es.Unroutable,
			Bindings:   []bindingView{},
		}
		if haveBase {
			old := base.exchanges[ei.Name]
			ev.Rates = &exchangeRates{
				Published:  perSecond(es.Published, old.published, dt),
				Unroutable: perSecond(es.Unroutable, old.unroutable, dt),
			}
		}
		cost := exchangeFixedBytes + jsonLen(ev.Name) + jsonLen(ev.Kind) + jsonLen(ev.Alternate)
		if cost > budget {
			ov.Truncated = true
			break
		}
		budget -= cost
		for _, b := range ei.Bindings {
			bv, cost := bindingOf(b)
			if cost > budget {
				ov.Truncated = true
				break
			}
			budget -= cost
			ev.Bindings = append(ev.Bindings, bv)
		}
		ov.Exchanges = append(ov.Exchanges, ev)
	}

	for _, d := range dead {
		dv := deadLetterView{
			Time:               formatTime(d.Time),
			Reason:             clip(string(d.Reason)),
			Exchange:           clip(d.Exchange),
			Queue:              clip(d.Queue),
			RoutingKey:         clip(d.RoutingKey),
			Attempts:           d.Attempts,
			Count:              d.Count,
			MessageID:          d.MessageID,
			LastError:          clip(d.LastError),
			DeadLetterExchange: clip(d.DeadLetterExchange),
			Dropped:            d.Dropped,
			DropCause:          clip(d.DropCause),
		}
		cost := deadLetterFixedBytes + jsonLen(dv.Time) + jsonLen(dv.Reason) + jsonLen(dv.Exchange) +
			jsonLen(dv.Queue) + jsonLen(dv.RoutingKey) + jsonLen(dv.LastError) +
			jsonLen(dv.DeadLetterExchange) + jsonLen(dv.DropCause)
		if cost > budget {
			ov.Truncated = true
			break
		}
		budget -= cost
		ov.DeadLetters = append(ov.DeadLetters, dv)
	}
	return ov, nil
}

// bindingOf describes one binding and returns an upper bound on its JSON.
func bindingOf(b tinymq.BindingSpec) (bindingView, int) {
	bv := bindingView{Queue: clip(b.Queue), Keys: []string{}, Args: []map[string]string{}}
	cost := bindingFixedBytes + jsonLen(bv.Queue)
	for _, k := range b.Keys {
		k = clip(k)
		bv.Keys = append(bv.Keys, k)
		cost += jsonLen(k) + 1
	}
	for _, table := range b.Args {
		m := make(map[string]string, min(len(table), maxArgEntries+1))
		cost += 3
		keys := slices.Sorted(maps.Keys(table))
		for i, k := range keys {
			if i == maxArgEntries {
				m["…"] = fmt.Sprintf("%d more", len(keys)-maxArgEntries)
				cost += jsonLen("…") + jsonLen(m["…"]) + 2
				break
			}
			ck, cv := clip(k), formatValue(table[k])
			m[ck] = cv
			cost += jsonLen(ck) + jsonLen(cv) + 2
		}
		bv.Args = append(bv.Args, m)
	}
	return bv, cost
}

// formatValue renders an AMQP field value (binding argument) as text of at
// most maxStringBytes: JSON cannot carry every one of them as is (NaN,
// []byte, nested tables of any depth).
func formatValue(v any) string {
	var b strings.Builder
	writeValue(&b, v, 0)
	return clip(b.String())
}

func writeValue(b *strings.Builder, v any, depth int) {
	if b.Len() > maxStringBytes {
		return
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case string:
		b.WriteString(strconv.Quote(clip(v)))
	case []byte:
		b.WriteString(strconv.Quote(clip(string(v))))
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float32:
		b.WriteString(strconv.FormatFloat(float64(v), 'g', -1, 32))
	case float64:
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		fmt.Fprint(b, v)
	case time.Time:
		b.WriteString(formatTime(v))
	case []any:
		if depth > 4 {
			b.WriteString("[…]")
			return
		}
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() > maxStringBytes {
				break
			}
			writeValue(b, e, depth+1)
		}
		b.WriteByte(']')
	case map[string]any:
		if depth > 4 {
			b.WriteString("{…}")
			return
		}
		b.WriteByte('{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() > maxStringBytes {
				break
			}
			b.WriteString(strconv.Quote(clip(k)))
			b.WriteString(": ")
			writeValue(b, v[k], depth+1)
		}
		b.WriteByte('}')
	default:
		// Validated bindings hold none; say what it is without calling
		// its methods.
		fmt.Fprintf(b, "(%T)", v)
	}
}

// clip makes s valid UTF-8 of at most maxStringBytes, cutting it at a rune
// boundary and marking the cut with "…".
func clip(s string) string {
	if len(s) <= maxStringBytes && utf8.ValidString(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxStringBytes {
		return s
	}
	cut := maxStringBytes - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// jsonLen is an upper bound on the length of s (valid UTF-8) encoded as a
// JSON string by encoding/json, quotes included: it escapes control
// characters, quotes, backslashes and <, >, & (as \u003c), and U+2028/U+2029.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c < 0x20, c == '"', c == '\\', c == '<', c == '>', c == '&':
			n += 6
		case c >= 0x80:
			n += 2 // a 3-byte U+2028 becomes 6 bytes
		default:
			n++
		}
	}
	return n
}

// millis converts d to milliseconds, rounded to the microsecond.
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/1e3) / 1e3
}

// formatTime formats t in UTC as RFC 3339, or "" for a zero time or one that
// RFC 3339 cannot hold.
func formatTime(t time.Time) string {
	if t.IsZero() || t.Year() < 0 || t.Year() > 9999 {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// overflowName names a queue's overflow behaviour as RabbitMQ does.
func overflowName(o tinymq.Overflow) string {
	switch o {
	case 0:
		return ""
	case tinymq.DropHead:
		return "drop-head"
	case tinymq.RejectPublish:
		return "reject-publish"
	case tinymq.Block:
		return "block"
	}
	return "overflow(" + strconv.Itoa(int(o)) + ")"
}
