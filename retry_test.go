package tinymq_test

// Where these tests need time (backoffs, TTLs, delays), they run in a
// synctest bubble: it passes on a fake clock, exactly and at once.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

func TestRetryBackoffIsExponentialCappedAndDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var at []time.Duration
		var attempts []int
		m := tinymq.New()
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Since(start))
			attempts = append(attempts, msg.Attempt)
			return fmt.Errorf("smtp down (%d)", msg.Attempt)
		}, 1, tinymq.WithQueueName("email"), tinymq.WithBindingKey("user.#"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 250 * time.Millisecond}),
			tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "hello", tinymq.WithRoutingKey("user.created")))
		m.Stop() // waits for every retry and the dead letter
		require.Len(t, dead, 1)

		assert.Equal(t, []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 550 * time.Millisecond}, at,
			"backoff 100ms, then 200ms, then capped at 250ms")
		assert.Equal(t, []int{1, 2, 3, 4}, attempts)
		d := <-dead
		assert.Equal(t, "hello", d.Data)
		assert.Equal(t, "dlx", d.Exchange)
		assert.Equal(t, "user.created", d.RoutingKey, "an empty dead-letter key keeps the message's own")
		require.Len(t, d.Deaths, 1)
		death := d.Deaths[0]
		assert.Equal(t, tinymq.ReasonRejected, death.Reason)
		assert.Equal(t, "ev", death.Exchange)
		assert.Equal(t, "email", death.Queue)
		assert.Equal(t, "user.created", death.RoutingKey)
		assert.Equal(t, 4, death.Attempts)
		assert.Equal(t, "smtp down (4)", death.LastError)
		assert.Equal(t, start.Add(550*time.Millisecond), death.Time)

		st := m.Stats().Queues["email"]
		assert.Equal(t, uint64(4), st.Delivered)
		assert.Equal(t, uint64(4), st.Failed)
		assert.Equal(t, uint64(3), st.Retried)
		assert.Equal(t, uint64(1), st.DeadLettered)
		assert.Equal(t, 0, st.Depth)
	})
}

func TestRetryJitterStaysWithinItsFraction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		var mu sync.Mutex
		first := map[int]time.Time{}
		var waits []time.Duration
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			defer mu.Unlock()
			if msg.Attempt == 1 {
				first[msg.Data.(int)] = time.Now()
				return errors.New("fail once")
			}
			waits = append(waits, time.Since(first[msg.Data.(int)]))
			return nil
		}, 4, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, Jitter: 0.5})))
		require.NoError(t, m.Start(context.Background()))
		for i := range n {
			require.NoError(t, m.Publish("ev", i))
		}
		m.Stop()
		require.Len(t, waits, n)
		distinct := map[time.Duration]bool{}
		for _, w := range waits {
			assert.GreaterOrEqual(t, w, 500*time.Millisecond)
			assert.LessOrEqual(t, w, time.Second)
			distinct[w] = true
		}
		assert.Greater(t, len(distinct), n/2, "jitter spreads the retries")
	})
}

func TestRetryDoesNotHoldTheWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var order []string
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			order = append(order, fmt.Sprintf("%v#%d", msg.Data, msg.Attempt)) // one worker: no lock needed
			if msg.Data == "a" && msg.Attempt == 1 {
				return errors.New("fail")
			}
			return nil
		}, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.Publish("ev", "b"))
		synctest.Wait()
		assert.Equal(t, []string{"a#1", "b#1"}, order, "b is not held behind a's backoff")
		assert.Equal(t, 1, m.Stats().Queues["ev#1"].Scheduled)
		m.Stop() // waits the hour for a's retry
		assert.Equal(t, []string{"a#1", "b#1", "a#2"}, order)
	})
}

func TestPermanentErrorsAndPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls sync.Map
		m := tinymq.New()
		dead := deadLetters(t, m)
		bad := errors.New("malformed")
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			n, _ := calls.LoadOrStore(msg.Data, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			switch msg.Data {
			case "permanent":
				return tinymq.Permanent(bad)
			case "panic":
				panic("boom")
			}
			return nil
		}, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3}), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "permanent"))
		require.NoError(t, m.Publish("ev", "panic"))
		m.Stop()
		require.Len(t, dead, 2)
		count := func(k string) int32 { v, _ := calls.Load(k); return v.(*atomic.Int32).Load() }
		assert.Equal(t, int32(1), count("permanent"), "a permanent error skips the retries")
		assert.Equal(t, int32(3), count("panic"), "a panic is retried like an error")
		got := map[any]tinymq.Death{}
		for range 2 {
			d := <-dead
			got[d.Data] = d.Deaths[0]
		}
		assert.Equal(t, "malformed", got["permanent"].LastError)
		assert.Equal(t, 1, got["permanent"].Attempts)
		assert.Contains(t, got["panic"].LastError, "boom")
		assert.Equal(t, 3, got["panic"].Attempts)
	})
	assert.ErrorIs(t, tinymq.Permanent(errors.New("x")), tinymq.ErrPermanent)
	e := errors.New("cause")
	assert.ErrorIs(t, tinymq.Permanent(e), e)
	assert.Equal(t, "cause", tinymq.Permanent(e).Error())
	assert.NoError(t, tinymq.Permanent(nil))
}

// A retried *Msg is "a copy of it as the consumer left it", in its own queue
// only; a Delivery consumer owns its copy, so its changes never come back.
// The other queue of the same keyed publish sees the original.
func TestRetryDeliversACopyThatStaysInItsQueue(t *testing.T) {
	t.Run("a copy", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var seen []*tinymq.Msg
			m := tinymq.New()
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
				seen = append(seen, msg) // kept after returning, as a consumer may
				if msg.Attempt == 1 {
					return errors.New("once")
				}
				return nil
			}, 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2})))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", "x"))
			m.Stop()
			require.Len(t, seen, 2)
			assert.NotSame(t, seen[0], seen[1])
			assert.Equal(t, 1, seen[0].Attempt, "the kept Msg did not change")
			assert.Equal(t, 2, seen[1].Attempt)
			assert.Equal(t, seen[0].ID, seen[1].ID)
		})
	})
	t.Run("in its queue", func(t *testing.T) {
		retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})
		t.Run("Msg", func(t *testing.T) {
			m := tinymq.New()
			second := make(chan tinymq.Msg, 20)
			other := make(chan tinymq.Msg, 20)
			gate := make(chan struct{})
			require.NoError(t, m.RegisterQueue("ev", tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
				if msg.Attempt == 1 {
					msg.RoutingKey = "mut0"
					msg.Headers = map[string]any{"h": "mut0"}
					return errors.New("again")
				}
				second <- *msg
				return nil
			}, 1, tinymq.WithQueueName("q0"), tinymq.WithBindingKey("k"), retry))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Direct, func(ctx context.Context, msg *tinymq.Msg) error {
				select {
				case <-gate:
				case <-ctx.Done():
				}
				other <- *msg
				return nil
			}, 1, tinymq.WithQueueName("q1"), tinymq.WithBindingKey("k"), retry))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			for n := range 10 {
				require.NoError(t, m.Publish("ev", &numbered{N: n}, tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"h": "v"})))
			}
			for _, msg := range recv(t, second, 10) {
				assert.Equal(t, 2, msg.Attempt)
				assert.Equal(t, "mut0", msg.RoutingKey, "a retry delivers a copy of the Msg as the consumer left it")
				assert.Equal(t, "mut0", msg.Headers["h"])
			}
			close(gate)
			for _, msg := range recv(t, other, 10) {
				assert.Equal(t, 1, msg.Attempt)
				assert.Equal(t, "k", msg.RoutingKey, "another queue's change leaked")
				assert.Equal(t, "v", msg.Headers["h"], "another queue's change leaked")
				assert.Equal(t, "q1", msg.Queue)
			}
		})
		t.Run("Delivery", func(t *testing.T) {
			m := tinymq.New()
			second := make(chan tinymq.Delivery[*numbered], 20)
			require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Direct, func(_ context.Context, d tinymq.Delivery[*numbered]) error {
				if d.Attempt == 1 {
					d.RoutingKey = "mut"
					d.Attempt = 50
					d.ID = 0
					d.Queue = "mut"
					return errors.New("again")
				}
				second <- d
				return nil
			}, 2, tinymq.WithQueueName("q0"), tinymq.WithBindingKey("k"), retry))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			for n := range 10 {
				require.NoError(t, m.Publish("ev", &numbered{N: n}, tinymq.WithRoutingKey("k")))
			}
			for _, d := range recv(t, second, 10) {
				assert.Equal(t, 2, d.Attempt)
				assert.Equal(t, "k", d.RoutingKey)
				assert.Equal(t, "q0", d.Queue)
				assert.Equal(t, uint64(d.Data.N+1), d.ID)
			}
		})
	})
}

// One keyed publish to three queues with different retry policies: each
// queue counts its own attempts, and only the queue that gave up
// dead-letters its copy, with its own death record.
func TestRetriesOfOnePublishAreIsolatedPerQueue(t *testing.T) {
	for _, f := range consumerForms() {
		if !f.meta {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			dead := hDeadQueue(t, m, 100)
			var mu sync.Mutex
			attempts := map[string][]int{}
			hdr := map[string]any{"h": "v", "n": int64(3)}
			for i, policy := range []int{3, 2, 1} {
				q := fmt.Sprintf("q%d", i)
				require.NoError(t, f.register(m, "ev", tinymq.Topic, func(_ context.Context, c formCall) error {
					mu.Lock()
					attempts[fmt.Sprintf("%s/%d", q, c.N)] = append(attempts[fmt.Sprintf("%s/%d", q, c.N)], c.Attempt)
					mu.Unlock()
					if c.Queue != q || c.RoutingKey != "a.b" || c.Headers["h"] != "v" || len(c.Deaths) != 0 {
						return tinymq.Permanent(fmt.Errorf("%s saw %+v", q, c))
					}
					switch q {
					case "q0":
						return errors.New("q0 fails")
					case "q1":
						if c.Attempt == 1 {
							return errors.New("q1 fails once")
						}
					}
					return nil
				}, 2, tinymq.WithQueueName(q), tinymq.WithBindingKey("a.*"), tinymq.WithDeadLetter("dlx", ""),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: policy, InitialBackoff: time.Millisecond})))
			}
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			const n = 20
			for i := range n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}, tinymq.WithRoutingKey("a.b"), tinymq.WithHeaders(hdr)))
			}
			for _, d := range recv(t, dead, n) {
				if assert.Len(t, d.Deaths, 1) {
					assert.Equal(t, "q0", d.Deaths[0].Queue)
					assert.Equal(t, 3, d.Deaths[0].Attempts)
					assert.Equal(t, "q0 fails", d.Deaths[0].LastError)
					assert.Equal(t, "a.b", d.Deaths[0].RoutingKey)
				}
				assert.Equal(t, "a.b", d.RoutingKey)
				assert.Equal(t, "v", d.Headers["h"])
			}
			stopWithin(t, m)
			for i := range n {
				assert.Equal(t, []int{1, 2, 3}, attempts[fmt.Sprintf("q0/%d", i)])
				assert.Equal(t, []int{1, 2}, attempts[fmt.Sprintf("q1/%d", i)])
				assert.Equal(t, []int{1}, attempts[fmt.Sprintf("q2/%d", i)])
			}
			st := m.Stats()
			assert.Equal(t, hCounts{Delivered: 3 * n, Failed: 3 * n, Retried: 2 * n, DeadLettered: n}, hCountsOf(st.Queues["q0"]))
			assert.Equal(t, hCounts{Delivered: 2 * n, Succeeded: n, Failed: n, Retried: n}, hCountsOf(st.Queues["q1"]))
			assert.Equal(t, hCounts{Delivered: n, Succeeded: n}, hCountsOf(st.Queues["q2"]))
			assert.Equal(t, map[string]any{"h": "v", "n": int64(3)}, hdr, "published headers untouched")
		})
	}
}

// ErrPermanent anywhere in the chain (wrapped, joined, in a multi-error, in a
// panic value, behind a *PanicError) skips the retries; anything else is
// retried up to MaxAttempts.
func TestPermanentAnywhereInTheChainSkipsRetries(t *testing.T) {
	base := errors.New("base")
	perm := tinymq.Permanent(base)
	type tc struct {
		fail      func() error // returns the error, or panics
		permanent bool
	}
	cases := map[string]tc{
		"Permanent":                  {func() error { return perm }, true},
		"wrapped":                    {func() error { return fmt.Errorf("a: %w", fmt.Errorf("b: %w", perm)) }, true},
		"joined":                     {func() error { return errors.Join(errors.New("x"), perm) }, true},
		"two %w":                     {func() error { return fmt.Errorf("%w, %w", errors.New("x"), perm) }, true},
		"multi, deep":                {func() error { return multiErr{errors.New("x"), multiErr{errors.New("y"), fmt.Errorf("z: %w", perm)}} }, true},
		"own Is":                     {func() error { return fmt.Errorf("w: %w", saysPermanentErr{}) }, true},
		"returned PanicError":        {func() error { return &tinymq.PanicError{Value: perm} }, true},
		"PanicError joined":          {func() error { return errors.Join(errors.New("x"), &tinymq.PanicError{Value: perm}) }, true},
		"panic(Permanent)":           {func() error { panic(perm) }, true},
		"panic(wrapped Permanent)":   {func() error { panic(fmt.Errorf("w: %w", perm)) }, true},
		"plain error":                {func() error { return base }, false},
		"panic(string)":              {func() error { panic("boom") }, false},
		"Permanent text, not chain":  {func() error { return errors.New(perm.Error()) }, false},
		"PanicError of plain error":  {func() error { return &tinymq.PanicError{Value: base} }, false},
		"joined without a permanent": {func() error { return errors.Join(errors.New("x"), base) }, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m, d := deadAfterRetries(t, c.fail)
			st := waitSettled(t, m, "q", 1)
			want := 3
			if c.permanent {
				want = 1
			}
			assert.Equal(t, want, d.Deaths[0].Attempts)
			assert.Equal(t, uint64(want), st.Delivered)
			assert.Equal(t, uint64(want-1), st.Retried)
			assert.Equal(t, uint64(1), st.DeadLettered)
		})
	}
}

// A retry into a full queue does not push it past its limit: with
// RejectPublish the retry is refused and the message dead-lettered with
// reason maxlen; Depth never exceeds the limit.
func TestRetryIntoAFullQueueKeepsTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		dead := deadLetters(t, m)
		first := true
		release := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			if first {
				first = false
				<-release
				return errors.New("fail once")
			}
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithMaxLen(2, tinymq.RejectPublish), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "fails"))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", "a"))
		require.NoError(t, m.Publish("ev", "b")) // the queue is full
		close(release)
		synctest.Wait()
		st := m.Stats().Queues["q"]
		assert.LessOrEqual(t, st.Depth, 2)
		m.Stop()
		d := <-dead
		assert.Equal(t, "fails", d.Data)
		assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
		assert.Equal(t, "fail once", d.Deaths[0].LastError)
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Overflowed)
	})
}

// multiErr wraps several errors (Unwrap() []error).
type multiErr []error

func (e multiErr) Error() string { return "multi" }

func (e multiErr) Unwrap() []error { return e }

// saysPermanentErr matches ErrPermanent through its own Is.
type saysPermanentErr struct{}

func (saysPermanentErr) Error() string { return "says permanent" }

func (saysPermanentErr) Is(target error) bool { return target == tinymq.ErrPermanent }
