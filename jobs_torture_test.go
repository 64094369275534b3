package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// tortured is the payload of the torture: N is its deduplication ID, shared
// by several publishers, and says what the consumers do with it; P and I,
// its publisher and that publisher's publish, make it unique.
type tortured struct{ N, P, I int }

func (p tortured) key() string { return fmt.Sprintf("%d/%d", p.P, p.I) }

// tortureGroup is the group of publish i of publisher p: each publisher has
// groups of its own, so that a group's publish order is its publisher's,
// and one publish in five has no group.
func tortureGroup(p, i int) string {
	if i%5 == 4 {
		return ""
	}
	return fmt.Sprintf("p%d-%d", p, i%7)
}

// tortureFates records, queue by queue, the payloads (by key) whose consumer
// succeeded and those that reached the dead-letter queue.
type tortureFates struct {
	mu        sync.Mutex
	succeeded map[string]map[string]int
	dead      map[string]map[string]int
}

func (f *tortureFates) add(to map[string]map[string]int, queue, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if to[queue] == nil {
		to[queue] = map[string]int{}
	}
	to[queue][key]++
}

// Torture: publishers with duplicate IDs, grouped and not, into a
// deduplicating exchange whose queues have delivery timeouts, rate limits,
// group ordering, retries and dead letters, with consumers that block past
// their deadline, panic or fail, racing Stop: every ID is routed at most
// once, every queue keeps its ledger (in the group-ordered queue without a
// timeout each message ends exactly once, succeeded or dead-lettered, as
// Stats counts it), and in both group-ordered queues each group's first
// deliveries, retries and successes come in publish order.
func TestTimeoutRateLimitAndDedupTortureKeepsTheLedger(t *testing.T) {
	const pubs, per, ids = 4, 150, 200
	queues := []string{"timed", "paced", "ordered", "ordered-timed", "dead"}
	for round := range 3 {
		fates := &tortureFates{succeeded: map[string]map[string]int{}, dead: map[string]map[string]int{}}
		logs := map[string]*groupLog{"ordered": newGroupLog(), "ordered-timed": newGroupLog()}
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			fates.add(fates.dead, msg.Deaths[0].Queue, msg.Data.(tortured).key())
			return nil
		}, 1, tinymq.WithQueueName("dead")))
		// consume is the consumers' behaviour, by N: 0 blocks past the
		// deadline in a queue with a timeout, fails once in one without; 1
		// panics; 2 fails; the rest succeed.
		consume := func(queue string, timed bool) tinymq.ConsumerFunc {
			log := logs[queue]
			return func(ctx context.Context, msg *tinymq.Msg) error {
				p := msg.Data.(tortured)
				if log != nil {
					_, end := log.beginCtx(ctx, msg.Group(), p.I, msg.Attempt)
					defer end()
				}
				switch p.N % 6 {
				case 0:
					if !timed {
						if msg.Attempt == 1 {
							return errors.New("torture")
						}
						break
					}
					<-ctx.Done()
					time.Sleep(time.Millisecond) // past the deadline
					return nil
				case 1:
					panic("torture")
				case 2:
					return errors.New("torture")
				}
				if log != nil {
					log.succeededCtx(ctx, msg.Group(), p.I)
				}
				if !timed {
					fates.add(fates.succeeded, queue, p.key())
				}
				return nil
			}
		}
		retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})
		timeout := tinymq.WithDeliveryTimeout(5 * time.Millisecond)
		dlx := tinymq.WithDeadLetter("dlx", "")
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consume("timed", true), 3, tinymq.WithQueueName("timed"),
			timeout, retry, dlx))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consume("paced", true), 2, tinymq.WithQueueName("paced"),
			tinymq.WithRateLimit(2000, 20), timeout, retry, dlx))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consume("ordered", false), 3, tinymq.WithQueueName("ordered"),
			tinymq.WithGroupOrdering(), tinymq.WithRateLimit(4000, 40), retry, dlx))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, consume("ordered-timed", true), 3, tinymq.WithQueueName("ordered-timed"),
			tinymq.WithGroupOrdering(), timeout, retry, dlx))
		require.NoError(t, m.Start(context.Background()))

		// Stop races the publishers once they made a third, two thirds or
		// all of their publishes, by round.
		stopAt := int64(round+1) * pubs * per / 3
		stop := make(chan struct{})
		var made, nils atomic.Int64
		var wg sync.WaitGroup
		for p := range pubs {
			wg.Go(func() {
				for i := range per {
					n := (p*per + i) % ids // IDs repeat across publishers
					opts := []tinymq.PublishOption{tinymq.WithDeduplicationID(fmt.Sprint(n))}
					if g := tortureGroup(p, i); g != "" {
						opts = append(opts, tinymq.WithMessageGroup(g))
					}
					err := m.Publish("ev", tortured{n, p, i}, opts...)
					if err == nil {
						nils.Add(1)
					} else if !errors.Is(err, tinymq.ErrStopped) {
						t.Errorf("Publish: %v", err)
					}
					if made.Add(1) == stopAt {
						close(stop)
					}
				}
			})
		}
		closedWithin(t, stop, "the publishes before Stop")
		stopWithin(t, m)
		wg.Wait()

		st := m.Stats()
		for _, q := range queues {
			assertLedger(t, q, st.Queues[q])
			assert.Zero(t, st.Queues[q].Abandoned, "%s", q)
		}
		accepted := st.Queues["timed"].Accepted
		assert.LessOrEqual(t, accepted, uint64(ids), "each ID at most once")
		for _, q := range queues[1:4] {
			assert.Equal(t, accepted, st.Queues[q].Accepted, "%s: every routed message", q)
		}
		assert.Equal(t, uint64(nils.Load()), accepted+st.Exchanges["ev"].Duplicates)

		fates.mu.Lock()
		for _, q := range queues[:4] {
			dead := fates.dead[q]
			assert.Equal(t, st.Queues[q].DeadLettered, uint64(len(dead)), "%s: dead letters", q)
			for k, n := range dead {
				assert.Equal(t, 1, n, "%s: %s dead-lettered %d times", q, k, n)
			}
		}
		ordered := st.Queues["ordered"]
		assert.Equal(t, ordered.Succeeded, uint64(len(fates.succeeded["ordered"])), "ordered: successes")
		for k, n := range fates.succeeded["ordered"] {
			assert.Equal(t, 1, n, "ordered: %s succeeded %d times", k, n)
			assert.Zero(t, fates.dead["ordered"][k], "ordered: %s succeeded and was dead-lettered", k)
		}
		fates.mu.Unlock()

		for q, log := range logs {
			log.mu.Lock()
			if q == "ordered" {
				// An abandoned call may still run beside its group's next
				// message: only a queue without a timeout hands a group's
				// messages to its consumers strictly one at a time.
				assert.Zero(t, log.overlaps, "%s: two messages of one group in consumers at once", q)
			}
			for g, calls := range log.calls {
				if g == "" {
					continue
				}
				assertTortureOrder(t, q, g, calls, log.successes[g], q == "ordered")
			}
			log.mu.Unlock()
		}
	}
}

// assertTortureOrder checks a group's calls and successes in a torture
// queue: first deliveries in publish order (I), each message's attempts
// together and counting up, and successes in publish order. With exact
// (a queue without a timeout) every call is in the log and every success
// is one; otherwise the Late calls are left out, and a success recorded may
// still have timed out, so a message may succeed twice in a row.
func assertTortureOrder(t *testing.T, q, g string, calls []groupCall, successes []int, exact bool) {
	t.Helper()
	prev := groupCall{N: -1}
	for _, c := range calls {
		if c.Late {
			continue
		}
		switch {
		case c.N > prev.N:
			if exact && c.Attempt != 1 {
				assert.Fail(t, "a message's first delivery is not attempt 1", "%s: group %s: %+v in %+v", q, g, c, calls)
				return
			}
		case c.N == prev.N && c.Attempt > prev.Attempt:
			if exact && c.Attempt != prev.Attempt+1 {
				assert.Fail(t, "a message's attempts out of turn", "%s: group %s: %+v in %+v", q, g, c, calls)
				return
			}
		default:
			assert.Fail(t, "a group's calls out of publish order", "%s: group %s: %+v after %+v in %+v", q, g, c, prev, calls)
			return
		}
		prev = c
	}
	for i := 1; i < len(successes); i++ {
		if successes[i] < successes[i-1] || (exact && successes[i] == successes[i-1]) {
			assert.Fail(t, "a group's successes out of publish order", "%s: group %s: %v", q, g, successes)
			return
		}
	}
}
