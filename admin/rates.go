package admin

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/tinymq/tinymq"
)

// maxSamples bounds how many snapshots a sampler keeps, whatever the request
// rate: a new one is kept only when window/maxSamples has passed since the
// last one kept. Each costs about 100 bytes per queue.
const maxSamples = 8

// sample is the part of one Stats snapshot that rates are computed from.
type sample struct {
	at        time.Time
	exchanges map[string]exchangeCounters
	queues    map[string]rateCounters
}

type exchangeCounters struct {
	published, unroutable uint64
}

// rateCounters are the queue counters that have rates.
type rateCounters struct {
	accepted, delivered, succeeded, failed, deadLettered, dropped uint64
}

// sampler keeps the latest snapshots, oldest first. It is fed by requests, so
// it needs no goroutine of its own.
type sampler struct {
	window time.Duration

	mu      sync.Mutex
	samples []sample // oldest first; at most maxSamples+1
}

func newSampler(window time.Duration) *sampler {
	return &sampler{window: window}
}

// observe records the snapshot st taken at now, if it is time to keep one,
// and returns the one to compute rates against: the newest snapshot at least
// the window old, or else the oldest one kept. ok is false when there is
// none at least a tenth of the window (at least 100ms) old, where rates
// would be mostly noise.
func (s *sampler) observe(now time.Time, st tinymq.Stats) (base sample, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Drop snapshots that an older-than-window one makes useless: keep
	// samples[0] only while samples[1] is younger than the window.
	for len(s.samples) >= 2 && now.Sub(s.samples[1].at) >= s.window {
		s.samples = slices.Delete(s.samples, 0, 1)
	}
	minAge := max(s.window/10, 100*time.Millisecond)
	if len(s.samples) > 0 && now.Sub(s.samples[0].at) >= minAge {
		base, ok = s.samples[0], true
	}
	if n := len(s.samples); n == 0 || now.Sub(s.samples[n-1].at) >= s.window/maxSamples {
		if n > maxSamples {
			s.samples = slices.Delete(s.samples, 0, 1)
		}
		s.samples = append(s.samples, sampleOf(now, st))
	}
	return base, ok
}

// perSecond returns the rate of a counter that went from old to cur in dt,
// rounded to 0.001. A counter that went down (a hostile engine, a queue
// deleted and declared again) counts as 0.
func perSecond(cur, old uint64, dt time.Duration) float64 {
	if cur <= old || dt <= 0 {
		return 0
	}
	return math.Round(float64(cur-old)/dt.Seconds()*1000) / 1000
}

// sampleOf takes the counters out of a Stats snapshot.
func sampleOf(at time.Time, st tinymq.Stats) sample {
	s := sample{
		at:        at,
		exchanges: make(map[string]exchangeCounters, len(st.Exchanges)),
		queues:    make(map[string]rateCounters, len(st.Queues)),
	}
	for name, ex := range st.Exchanges {
		s.exchanges[name] = exchangeCounters{published: ex.Published, unroutable: ex.Unroutable}
	}
	for name, q := range st.Queues {
		s.queues[name] = rateCounters{accepted: q.Accepted, delivered: q.Delivered, succeeded: q.Succeeded,
			failed: q.Failed, deadLettered: q.DeadLettered, dropped: q.Dropped}
	}
	return s
}
