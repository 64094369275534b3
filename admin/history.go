package admin

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tinymq/tinymq"
)

// The history behind the page's sparklines: for every queue, and for the
// totals, the depth and the published and delivered rates at each of the
// last historyPoints steps of historyStep. Like the rates it is fed by
// requests, so it needs no goroutine: the first request in each step writes
// that step's point, and a step in which no request came stays empty (null
// in the JSON). Memory is bounded by the number of queues: about 800 bytes
// each, and the series of a queue that no longer exists is forgotten at the
// next step.

const (
	historyPoints = 60
	historyStep   = 5 * time.Second // 60 points: the last five minutes
)

// point is one step of a series; NaN: no data.
type point struct {
	depth, published, delivered float32
}

var noPoint = point{float32(math.NaN()), float32(math.NaN()), float32(math.NaN())}

// series is one queue's (or the totals') history, a ring indexed by step
// number modulo historyPoints.
type series struct {
	points [historyPoints]point
	// The counters at the last step written, for the next step's rates.
	prevAt                  time.Time
	prevAccepted, prevDeliv uint64
}

func newSeries() *series {
	s := new(series)
	for i := range s.points {
		s.points[i] = noPoint
	}
	return s
}

// record writes the point of step k from the counters read at now.
func (s *series) record(k int64, now time.Time, depth int, accepted, delivered uint64) {
	p := point{depth: float32(depth), published: float32(math.NaN()), delivered: float32(math.NaN())}
	if !s.prevAt.IsZero() {
		dt := now.Sub(s.prevAt)
		p.published = float32(perSecond(accepted, s.prevAccepted, dt))
		p.delivered = float32(perSecond(delivered, s.prevDeliv, dt))
	}
	s.points[k%historyPoints] = p
	s.prevAt, s.prevAccepted, s.prevDeliv = now, accepted, delivered
}

// history keeps the series. Its mutex is a leaf: held only while series are
// read or written, never while the MQ is called.
type history struct {
	mu     sync.Mutex
	step   int64 // the newest step written (Unix time / historyStep); 0: none
	total  *series
	queues map[string]*series
}

func newHistory() *history {
	return &history{total: newSeries(), queues: make(map[string]*series)}
}

// historyView is a history as JSON: each series oldest first, the newest
// point last, null for a step with no data. The totals' also say the step
// and when the newest one began.
type historyView struct {
	StepMillis int64  `json:"step_ms,omitempty"`
	End        string `json:"end,omitempty"`
	// Depth, Published and Delivered are JSON arrays, encoded once.
	Depth     rawJSON `json:"depth"`
	Published rawJSON `json:"published_per_sec"`
	Delivered rawJSON `json:"delivered_per_sec"`
}

// rawJSON is JSON encoded in advance (an array of numbers and nulls).
type rawJSON []byte

// MarshalJSON returns r, or null for an empty one.
func (r rawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

// size is the length of the history's JSON apart from its field names.
func (v historyView) size() int {
	return len(v.Depth) + len(v.Published) + len(v.Delivered) + len(v.End) + 30
}

// observe writes the step of now from st, if it is the first request in
// it, and returns the totals' history.
func (h *history) observe(now time.Time, st tinymq.Stats) historyView {
	k := now.UnixNano() / int64(historyStep)
	h.mu.Lock()
	defer h.mu.Unlock()
	if k > h.step {
		// Steps with no request stay empty.
		for i := max(h.step+1, k-historyPoints+1); i <= k; i++ {
			h.total.points[i%historyPoints] = noPoint
			for _, s := range h.queues {
				s.points[i%historyPoints] = noPoint
			}
		}
		var depth int
		var published, delivered uint64
		for name, qs := range st.Queues {
			s := h.queues[name]
			if s == nil {
				s = newSeries()
				h.queues[name] = s
			}
			s.record(k, now, qs.Depth, qs.Accepted, qs.Delivered)
			depth += qs.Depth
			delivered += qs.Delivered
		}
		for _, es := range st.Exchanges {
			published += es.Published
		}
		// Deleted queues' deliveries stay in the total, so that it does
		// not go down.
		delivered += st.Deleted.Delivered
		h.total.record(k, now, depth, published, delivered)
		for name := range h.queues {
			if _, ok := st.Queues[name]; !ok {
				delete(h.queues, name)
			}
		}
		h.step = k
	}
	v := h.viewLocked(h.total)
	v.StepMillis = historyStep.Milliseconds()
	if h.step > 0 {
		v.End = formatTime(time.Unix(0, h.step*int64(historyStep)))
	}
	return v
}

// queue returns the history of the queue name (all null if it has none).
func (h *history) queue(name string) historyView {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.queues[name]
	if s == nil {
		s = emptySeries
	}
	return h.viewLocked(s)
}

var emptySeries = newSeries()

// viewLocked encodes s, its newest point last. h.mu is held.
func (h *history) viewLocked(s *series) historyView {
	var v historyView
	v.Depth = encodeSeries(s, h.step, func(p point) float32 { return p.depth })
	v.Published = encodeSeries(s, h.step, func(p point) float32 { return p.published })
	v.Delivered = encodeSeries(s, h.step, func(p point) float32 { return p.delivered })
	return v
}

// encodeSeries encodes one field of s as a JSON array, oldest first, ending
// at step newest.
func encodeSeries(s *series, newest int64, field func(point) float32) rawJSON {
	b := make([]byte, 0, historyPoints*4)
	b = append(b, '[')
	for i := range int64(historyPoints) {
		if i > 0 {
			b = append(b, ',')
		}
		k := newest - historyPoints + 1 + i
		if k < 0 {
			b = append(b, "null"...)
			continue
		}
		b = appendNumber(b, field(s.points[k%historyPoints]))
	}
	return append(b, ']')
}

// appendNumber appends f rounded to 0.01, or null for NaN: at most 12 bytes.
func appendNumber(b []byte, f float32) []byte {
	v := float64(f)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return append(b, "null"...)
	case math.Abs(v) < 1e9:
		return strconv.AppendFloat(b, math.Round(v*100)/100, 'f', -1, 64)
	}
	return strconv.AppendFloat(b, v, 'g', 6, 64)
}
