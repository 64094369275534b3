package amqp

import (
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// This file is the engine's helper queues: the retry wait queues of a queue
// (tinymq.retry.<queue>.<ms>ms) and the delay queues of an exchange
// (tinymq.delay.<exchange>.<ms>ms). Each holds messages for one wait, its
// x-message-ttl, then dead-letters them on: a retry back to its queue through
// tinymq.requeue, a delay into its exchange. Every message of a helper queue
// waits as long (none carries an expiration of its own), so the broker, which
// expires messages at the head of a queue only, expires each at its time.
//
// A retry policy with jitter has several wait queues per backoff step: the
// jittered wait is rounded to the nearest of at most jitterBuckets values
// spread evenly over [d*(1-Jitter), d], each the TTL of a queue of its own.
// A queue with a policy of n distinct backoffs thus has at most
// n*jitterBuckets wait queues, created on first use.
//
// Helper queues have an x-expires, so that the broker deletes those no longer
// used: their TTL plus the engine's lease (helperLease, an hour). Publishing
// is no use of a queue for the broker (a declaration is), so the engine
// declares a helper queue again before it publishes to it when its last
// declaration is more than half a lease old (or was made on another
// connection): a message published then leaves the queue, its TTL later, at
// least half a lease before the queue could expire. The cost is one
// queue.declare per helper queue in use per half hour.
//
// Upgrade: the engine's earlier layout named helper queues without the "ms"
// suffix (tinymq.retry.<queue>.<ms>, tinymq.delay.<exchange>.<ms>) and gave
// them no x-expires; declaring those names with x-expires would fail with
// PRECONDITION_FAILED. The new names never collide with the old, so an MQ of
// this version runs beside one of the earlier (a rolling deploy): a message
// waiting in an old queue still comes back (its dead-lettering needs no
// declaration), and its attempts still count. The old queues stay on the
// broker, empty once their messages left; DeleteQueue and PurgeQueue include
// them, and an operator may delete the rest (rabbitmqctl delete_queue).

// jitterBuckets bounds the wait queues of one jittered backoff step: the
// jittered wait is off by at most d*Jitter/(2*(jitterBuckets-1)) (about 57 ms
// for a 1 s backoff with Jitter 0.8), and a policy's helper queues stay few.
const jitterBuckets = 8

// defaultHelperLease is how long a helper queue outlives its TTL unused: an
// hour, long enough that renewing the lease costs one declaration per queue
// per half hour, short enough that a backoff or a delay nobody uses any more
// leaves the broker within the hour.
const defaultHelperLease = time.Hour

// helperSuffix ends the names of the helper queues with an x-expires, which
// tells them apart from the earlier layout's.
const helperSuffix = "ms"

// helper is a helper queue the engine declared, and when.
type helper struct {
	at  time.Time // its last declaration
	gen uint64    // the connection generation it was made on
}

// helpers is the record of the helper queues declared by this engine, for
// renewing their lease and for Stats. Its mu is a leaf.
type helpers struct {
	mu sync.Mutex
	m  map[string]helper
}

// fresh reports whether name was declared on connection gen less than half
// a lease ago.
func (h *helpers) fresh(name string, gen uint64, lease time.Duration, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.m[name]
	return ok && d.gen == gen && now.Sub(d.at) < lease/2
}

func (h *helpers) note(name string, gen uint64, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string]helper)
	}
	h.m[name] = helper{at: at, gen: gen}
}

// recent reports whether name was declared within the last lease: Stats reads
// the depth of those only, since its passive declaration is a use too and
// would otherwise keep an unused helper queue forever.
func (h *helpers) recent(name string, lease time.Duration, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.m[name]
	return ok && now.Sub(d.at) < lease
}

func (h *helpers) forget(names []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range names {
		delete(h.m, n)
	}
}

// lease is the engine's helper lease.
func (e *engine) lease() time.Duration {
	if e.cfg.helperLease > 0 {
		return e.cfg.helperLease
	}
	return defaultHelperLease
}

// helperSteps are the declarations of a helper queue of TTL ms that
// dead-letters into dlx: the queue, and its binding to the wait exchange.
func (e *engine) helperSteps(name string, ms int64, dlx string) []step {
	return []step{
		{kind: stepQueue, name: name, args: e.helperQueueArgs(amqp091.Table{
			"x-message-ttl":          ms,
			"x-dead-letter-exchange": dlx,
			"x-expires":              ms + millis(e.lease()),
		})},
		{kind: stepBind, name: name, exchange: waitExchange, args: amqp091.Table{"x-match": "all", hdrWait: name}},
	}
}

// ensureHelper declares the helper queue (see helperSteps) unless this engine
// did on the current connection less than half a lease ago, which renews its
// x-expires. It waits for the broker as a declaration does. The declarations
// are not recorded: each connection declares a helper queue again at its
// first use.
func (e *engine) ensureHelper(name string, ms int64, dlx string) error {
	e.mu.Lock()
	gen := e.connGen
	e.mu.Unlock()
	if gen != 0 && e.helpers.fresh(name, gen, e.lease(), time.Now()) {
		return nil
	}
	e.declMu.Lock()
	defer e.declMu.Unlock()
	steps := e.helperSteps(name, ms, dlx)
	return e.operate(func(conn *amqp091.Connection) error {
		at := time.Now()
		if _, err := applySteps(conn, steps); err != nil {
			if !conn.IsClosed() {
				return declareError(steps[0], err)
			}
			return err
		}
		e.mu.Lock()
		gen := e.connGen
		same := e.pubConn == conn
		e.mu.Unlock()
		if same {
			e.helpers.note(name, gen, at)
		}
		return nil
	})
}

// retryQueueName is the wait queue of queue for a wait of ms.
func retryQueueName(queue string, ms int64) string {
	return retryPrefix + queue + "." + strconv.FormatInt(ms, 10) + helperSuffix
}

// oldRetryQueueName is the earlier layout's wait queue (see above).
func oldRetryQueueName(queue string, ms int64) string {
	return retryPrefix + queue + "." + strconv.FormatInt(ms, 10)
}

func delayQueueName(exchange string, ms int64) string {
	return delayPrefix + exchange + "." + strconv.FormatInt(ms, 10) + helperSuffix
}

// isWaitSuffix reports whether s ends a wait queue's name: a wait in ms,
// with the suffix (this layout) or without (the earlier one).
func isWaitSuffix(s string) bool {
	return isDigits(strings.TrimSuffix(s, helperSuffix))
}

// jitterLevels returns the waits, in ms, that a jittered wait of base ms
// is rounded to: at most jitterBuckets values from base*(1-jitter) to base,
// evenly spread, ascending; base alone without jitter.
func jitterLevels(base int64, jitter float64) []int64 {
	if jitter <= 0 {
		return []int64{base}
	}
	lo := max(int64(math.Round(float64(base)*(1-jitter))), 1)
	levels := make([]int64, 0, jitterBuckets)
	for i := range jitterBuckets {
		v := lo + (base-lo)*int64(i)/int64(jitterBuckets-1)
		if len(levels) == 0 || levels[len(levels)-1] != v {
			levels = append(levels, v)
		}
	}
	return levels
}

// nearestLevel returns the level nearest to ms.
func nearestLevel(levels []int64, ms int64) int64 {
	best := levels[0]
	for _, l := range levels[1:] {
		if abs(l-ms) < abs(best-ms) {
			best = l
		}
	}
	return best
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
