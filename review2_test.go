package tinymq_test

// Review 2: attacks on the ID reservations joined to a publish's batch, on
// freeze (a consumer's error asked once), and on the topic matcher's
// remembering walk. Every identifier here starts with r2.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/wal"
)

// r2Short bounds the waits of tests that are expected to settle quickly, so
// that a failure does not cost the full wait.
const r2Short = 3 * time.Second

func r2Quiet() tinymq.Option {
	return tinymq.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// r2Settled waits until the queue's failed deliveries are all accounted for
// (retried, dead-lettered or dropped) and reports its stats.
func r2Settled(t *testing.T, m *tinymq.MQ, queue string, failed uint64) tinymq.QueueStats {
	t.Helper()
	var st tinymq.QueueStats
	ok := assert.Eventually(t, func() bool {
		st = m.Stats().Queues[queue]
		return st.Failed >= failed && st.Failed == st.Retried+st.DeadLettered+st.Dropped+st.Undelivered && st.InFlight == 0
	}, r2Short, time.Millisecond)
	if !ok {
		t.Logf("queue %s never settled: %+v", queue, st)
	}
	return st
}

// r2GoexitIs is an error whose Is ends the calling goroutine.
type r2GoexitIs struct{}

func (r2GoexitIs) Error() string { return "r2GoexitIs" }
func (r2GoexitIs) Is(error) bool { runtime.Goexit(); return false }

// r2GoexitError is an error whose Error ends the calling goroutine.
type r2GoexitError struct{}

func (r2GoexitError) Error() string { runtime.Goexit(); return "" }

// A consumer that panics with an error value whose methods call
// runtime.Goexit: the panic becomes a *PanicError whose Unwrap returns that
// value, so the MQ must not run the value's methods outside the worker's
// guard. The failure must be counted and settled like any other: retried
// (Is is asked when a retry is possible), or dead-lettered (Error is asked
// for the death record).
func TestReview2PanicValueWithHostileMethods(t *testing.T) {
	for name, c := range map[string]struct {
		v           error
		maxAttempts int
	}{
		"Is calls Goexit, retry":          {r2GoexitIs{}, 2},
		"Error calls Goexit, dead letter": {r2GoexitError{}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			m := tinymq.New(r2Quiet())
			dead := make(chan *tinymq.Msg, 10)
			require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dead), 1))
			var calls atomic.Int32
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				if calls.Add(1) == 1 {
					panic(c.v)
				}
				return nil
			}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: c.maxAttempts, InitialBackoff: time.Millisecond})))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			require.NoError(t, m.Publish("ev", 1))
			require.NoError(t, m.Publish("ev", 2))
			var st tinymq.QueueStats
			ended := assert.Eventually(t, func() bool {
				st = m.Stats().Queues["q"]
				return st.Accepted == 2 && st.Succeeded+st.DeadLettered+st.Dropped == st.Accepted
			}, r2Short, time.Millisecond)
			assert.True(t, ended, "the panicked message never ended (retried and succeeded, or dead-lettered): %+v", st)
			assert.Equal(t, uint64(1), st.Failed)
			assert.Equal(t, st.Failed, st.Retried+st.DeadLettered+st.Dropped, "every failure settled: %+v", st)
		})
	}
}

// r2OnceErr is an error whose Is answers once and ends the goroutine after:
// freeze promises that the MQ asks a consumer's error only once.
type r2OnceErr struct{ calls atomic.Int32 }

func (e *r2OnceErr) Error() string { return "r2OnceErr" }
func (e *r2OnceErr) Is(error) bool {
	if e.calls.Add(1) > 1 {
		runtime.Goexit()
	}
	return false
}

// A consumer returns an error wrapping a *PanicError (found in the chain, so
// its stack is logged) whose Value is the consumer's own error. freeze keeps
// the *PanicError in the consumerError it makes, and settle's errors.Is goes
// through it into the Value's Is again, outside the guard.
func TestReview2FrozenErrorIsNotAskedAgain(t *testing.T) {
	m := tinymq.New(r2Quiet())
	dead := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dead), 1))
	inner := &r2OnceErr{}
	var calls atomic.Int32
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		if calls.Add(1) == 1 {
			return fmt.Errorf("ctx: %w", &tinymq.PanicError{Value: inner, Stack: []byte("stack")})
		}
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	require.NoError(t, m.Publish("ev", 1))
	st := r2Settled(t, m, "q", 1)
	if assert.Equal(t, uint64(1), st.Retried, "the failed message was not settled: %+v", st) {
		assert.Eventually(t, func() bool { return m.Stats().Queues["q"].Succeeded == 1 }, r2Short, time.Millisecond, "the retry never came")
	}
	assert.Equal(t, int32(1), inner.calls.Load(), "the consumer's error was asked again after freeze")
}

// r2Multi wraps several errors (Unwrap() []error).
type r2Multi []error

func (e r2Multi) Error() string   { return "multi" }
func (e r2Multi) Unwrap() []error { return e }

// r2SaysPermanent matches ErrPermanent through its own Is.
type r2SaysPermanent struct{}

func (r2SaysPermanent) Error() string        { return "says permanent" }
func (r2SaysPermanent) Is(target error) bool { return target == tinymq.ErrPermanent }

// ErrPermanent anywhere in the chain (wrapped, joined, in a multi-error, in a
// panic value, behind a *PanicError) skips the retries; anything else is
// retried up to MaxAttempts.
func TestReview2PermanentAnywhereSkipsRetries(t *testing.T) {
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
		"multi, deep":                {func() error { return r2Multi{errors.New("x"), r2Multi{errors.New("y"), fmt.Errorf("z: %w", perm)}} }, true},
		"own Is":                     {func() error { return fmt.Errorf("w: %w", r2SaysPermanent{}) }, true},
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
			m := tinymq.New(r2Quiet())
			dead := deadLetters(t, m)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				return c.fail()
			}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			require.NoError(t, m.Publish("ev", 1))
			d := recv(t, dead, 1)[0]
			st := r2Settled(t, m, "q", 1)
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

// A *PanicError returned inside an error chain is still found: its stack is
// logged with the failure.
func TestReview2PanicErrorInChainIsLoggedWithStack(t *testing.T) {
	for name, wrap := range map[string]func(error) error{
		"%w":     func(e error) error { return fmt.Errorf("ctx: %w", e) },
		"joined": func(e error) error { return errors.Join(errors.New("x"), e) },
		"multi":  func(e error) error { return r2Multi{errors.New("x"), fmt.Errorf("y: %w", e)} },
	} {
		t.Run(name, func(t *testing.T) {
			logger, records := logRecords()
			m := tinymq.New(tinymq.WithLogger(logger))
			var calls atomic.Int32
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				calls.Add(1)
				return wrap(&tinymq.PanicError{Value: "boom", Stack: []byte("R2STACKMARK")})
			}, 1, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1})))
			require.NoError(t, m.Start(context.Background()))
			require.NoError(t, m.Publish("ev", 1))
			r2Settled(t, m, "q", 1)
			stopWithin(t, m)
			found := false
			for _, r := range records(t) {
				if s, ok := r["stack"].(string); ok && strings.Contains(s, "R2STACKMARK") {
					found = true
				}
			}
			assert.True(t, found, "the *PanicError's stack was not logged")
		})
	}
}

// r2TopicMatch is a reference topic matcher with memoisation (the plain
// recursion is exponential on the adversarial patterns).
func r2TopicMatch(pattern, key string) bool {
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ".")
	}
	p, k := split(pattern), split(key)
	memo := map[[2]int]bool{}
	var match func(i, j int) bool
	match = func(i, j int) bool {
		if v, ok := memo[[2]int{i, j}]; ok {
			return v
		}
		var r bool
		switch {
		case i == len(p):
			r = j == len(k)
		case p[i] == "#":
			r = match(i+1, j) || (j < len(k) && match(i, j+1))
		case j == len(k):
			r = false
		case p[i] == "*" || p[i] == k[j]:
			r = match(i+1, j+1)
		}
		memo[[2]int{i, j}] = r
		return r
	}
	return match(0, 0)
}

// Topic routing through the public API against the reference, on random
// bindings (several per queue) and keys, and on adversarial ones that make
// the trie's plain walk run out of budget and switch to the remembering one.
func TestReview2TopicRoutingMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	randKey := func(alphabet []string, maxWords int) string {
		n := rng.IntN(maxWords + 1)
		ws := make([]string, n)
		for i := range ws {
			ws[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return strings.Join(ws, ".")
	}
	type round struct {
		patterns [][]string // per queue
		keys     []string
	}
	var rounds []round
	for range 10 {
		var r round
		for range 8 {
			var ps []string
			for range 1 + rng.IntN(3) {
				ps = append(ps, randKey([]string{"a", "b", "", "*", "#", "#", "*"}, 6))
			}
			r.patterns = append(r.patterns, ps)
		}
		for range 80 {
			r.keys = append(r.keys, randKey([]string{"a", "b", ""}, 9))
		}
		rounds = append(rounds, r)
	}
	// Adversarial: many "#" between repeated words, long keys of that word.
	adv := round{patterns: [][]string{
		{strings.Repeat("#.a.", 9) + "#.b"},
		{strings.Repeat("#.a.", 9) + "#"},
		{"*.#.*.#.*.#.*.#.*.#.*.#.*.#"},
		{strings.Repeat("#.a.", 6) + "#.b", strings.Repeat("#.*.", 5) + "b"},
		{"#.#.#.#.#.#.a.#.#.#.#", "a.#.a.#.a"},
		{strings.Repeat("#.", 20) + "b.#"},
	}}
	for n := 1; n <= 100; n += 9 {
		adv.keys = append(adv.keys, strings.Repeat("a.", n)+"a", strings.Repeat("a.", n)+"b", strings.Repeat("a.", n/2)+"b."+strings.Repeat("a.", n/2)+"a")
	}
	rounds = append(rounds, adv)

	for ri, r := range rounds {
		m := tinymq.New(r2Quiet())
		type hit struct{ queue, key int }
		var mu sync.Mutex
		got := map[hit]int{}
		total := 0
		for qi, ps := range r.patterns {
			err := m.RegisterQueue("t", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
				mu.Lock()
				defer mu.Unlock()
				got[hit{qi, msg.Data.(int)}]++
				total++
				return nil
			}, 1, tinymq.WithQueueName(fmt.Sprint("q", qi)), tinymq.WithBindingKey(ps[0]))
			require.NoError(t, err, "round %d, pattern %q", ri, ps[0])
			for _, p := range ps[1:] {
				require.NoError(t, m.Bind(fmt.Sprint("q", qi), "t", tinymq.Topic, tinymq.WithBindingKey(p)), "pattern %q", p)
			}
		}
		require.NoError(t, m.Start(context.Background()))
		want := map[hit]int{}
		for ki, k := range r.keys {
			n := 0
			for qi, ps := range r.patterns {
				if slices.ContainsFunc(ps, func(p string) bool { return r2TopicMatch(p, k) }) {
					want[hit{qi, ki}] = 1
					n++
				}
			}
			err := m.Publish("t", ki, tinymq.WithRoutingKey(k))
			if n == 0 {
				require.ErrorIs(t, err, tinymq.ErrNoRoute, "round %d, key %q", ri, k)
			} else {
				require.NoError(t, err, "round %d, key %q", ri, k)
			}
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return total >= len(want)
		}, wait, time.Millisecond)
		stopWithin(t, m)
		mu.Lock()
		for h, c := range want {
			if got[h] != c {
				t.Errorf("round %d: queue %d (patterns %q), key %q: delivered %d times, want %d", ri, h.queue, r.patterns[h.queue], r.keys[h.key], got[h], c)
			}
		}
		for h, c := range got {
			if want[h] == 0 {
				t.Errorf("round %d: queue %d (patterns %q), key %q: delivered %d times, want none", ri, h.queue, r.patterns[h.queue], r.keys[h.key], c)
			}
		}
		mu.Unlock()
	}
}

// r2IDs records, per exchange, which payload each message ID carried.
type r2IDs struct {
	mu       sync.Mutex
	ids      map[string]map[uint64]int
	problems []string
}

func (r *r2IDs) consumer(ex string) tinymq.ConsumerFunc {
	return func(_ context.Context, msg *tinymq.Msg) error {
		var n int
		switch d := msg.Data.(type) {
		case int:
			n = d
		case tinymq.Encoded:
			if err := d.Decode(&n); err != nil {
				return tinymq.Permanent(err)
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.ids[ex] == nil {
			r.ids[ex] = map[uint64]int{}
		}
		if prev, ok := r.ids[ex][msg.ID]; ok && prev != n {
			r.problems = append(r.problems, fmt.Sprintf("%s: ID %d carried %d and %d", ex, msg.ID, prev, n))
		}
		r.ids[ex][msg.ID] = n
		return nil
	}
}

// Many concurrent publishers crossing the half-block point (where one of them
// joins the next reservation to its own batch) and whole blocks, restarts at
// different points of a block, both sync policies, a Shutdown that leaves
// durable messages for the next run: IDs never repeat.
func TestReview2IDsUniqueManyPublishersAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	rec := &r2IDs{ids: map[string]map[uint64]int{}}
	register := func(m *tinymq.MQ) {
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev"), 4, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev-mem"), 2, tinymq.WithQueueName("evm")))
		require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, rec.consumer("mem"), 2, tinymq.WithQueueName("m")))
	}
	const publishers = 16
	durablePer := []int{150, 37, 260, 5} // per publisher and run: restarts land anywhere in a block
	published := 0
	for run, per := range durablePer {
		var opts []tinymq.Option
		opts = append(opts, tinymq.WithDataDir(dir), r2Quiet())
		if run%2 == 1 {
			opts = append(opts, tinymq.WithSync(5*time.Millisecond))
		}
		m := tinymq.New(opts...)
		register(m)
		require.NoError(t, m.Start(context.Background()))
		var wg sync.WaitGroup
		for p := range publishers {
			wg.Go(func() {
				for i := range per {
					n := run*1_000_000 + p*10_000 + i
					if !assert.NoError(t, m.Publish("ev", n)) {
						return
					}
					for j := range 4 { // the in-memory exchange crosses several blocks per run
						if !assert.NoError(t, m.Publish("mem", n*10+j)) {
							return
						}
					}
				}
			})
		}
		wg.Wait()
		published += publishers * per
		if run == 2 {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = m.Shutdown(ctx) // what is left of the durable queue comes back next run
		}
		stopWithin(t, m)
	}
	m := tinymq.New(tinymq.WithDataDir(dir), r2Quiet())
	register(m)
	require.NoError(t, m.Start(context.Background()))
	r2Drained(t, m, "d")
	stopWithin(t, m)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Empty(t, rec.problems)
	assert.Len(t, rec.ids["ev"], published, "every durable message delivered under its own ID")
}

// The publish whose batch carries the reservation ahead fails (the disk is
// full): the reservation must not count, and after a restart no ID repeats,
// neither of the messages on disk nor of those published before the failure.
func TestReview2IDsUniqueAfterFailedReservationCommit(t *testing.T) {
	dir := t.TempDir()
	var fail atomic.Bool
	restore := tinymq.SetWALFaults(&wal.Faults{WriteErr: func(string) error {
		if fail.Load() {
			return syscall.ENOSPC
		}
		return nil
	}})
	rec := &r2IDs{ids: map[string]map[uint64]int{}}
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Hour), r2Quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev"), 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
	restore() // the log is open
	// Not started: nothing is consumed, so each Publish is exactly one write
	// (the first one two: its reservation, then the message).
	const before = 2049 // IDs 1..2049; the reservation ahead joins ID 2050's batch
	for i := range before {
		require.NoError(t, m.Publish("ev", i))
	}
	fail.Store(true)
	require.ErrorIs(t, m.Publish("ev", -1), tinymq.ErrLog)
	fail.Store(false)
	require.ErrorIs(t, m.Publish("ev", -2), tinymq.ErrLog, "the log stays failed")
	stopWithin(t, m)

	m = tinymq.New(tinymq.WithDataDir(dir), r2Quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, rec.consumer("ev"), 2, tinymq.WithQueueName("d"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	for i := range 3000 {
		require.NoError(t, m.Publish("ev", 100_000+i))
	}
	r2Drained(t, m, "d")
	stopWithin(t, m)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Empty(t, rec.problems)
	assert.Len(t, rec.ids["ev"], before+3000)
	for id, n := range rec.ids["ev"] {
		if n >= 100_000 {
			assert.Greater(t, id, uint64(before), "a new ID reuses one of the previous run")
		}
	}
}

// r2HookCodec is JSONCodec that runs hook before encoding an r2Trigger.
type r2HookCodec struct {
	tinymq.JSONCodec
	hook func()
}

type r2Trigger struct{ N int }

func (c r2HookCodec) Marshal(v any) ([]byte, error) {
	if _, ok := v.(r2Trigger); ok {
		c.hook()
	}
	return c.JSONCodec.Marshal(v)
}

// The codec is user code that may call back into the MQ. A publish that
// reaches a durable queue through an alternate exchange encodes its data
// inside logMessage; if its ID is the one that reserves the next block ahead,
// it holds the exchange's reserveMu while the codec runs. A codec that
// publishes to the same exchange (synchronously: here from a goroutine it
// waits for, with a bound) then blocks on reserveMu as soon as the IDs run
// past the reservation: the publish and the codec wait for each other.
func TestReview2CodecPublishingDuringReservationDoesNotFreeze(t *testing.T) {
	var m *tinymq.MQ
	nestedDone := make(chan struct{})
	finished := make(chan bool, 1)
	codec := r2HookCodec{hook: func() {
		go func() {
			defer close(nestedDone)
			for i := range 2100 { // past the block reserved so far
				if err := m.Publish("front", i, tinymq.WithRoutingKey("mem")); err != nil {
					return
				}
			}
		}()
		select {
		case <-nestedDone:
			finished <- true
		case <-time.After(r2Short):
			finished <- false // give up, so that the test unwinds
		}
	}}
	m = tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Hour), tinymq.WithCodec(codec), r2Quiet())
	var memCount atomic.Int64
	require.NoError(t, m.RegisterQueue("back", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("durable"), tinymq.WithDurable()))
	require.NoError(t, m.DeclareExchange("front", tinymq.Direct, tinymq.WithAlternateExchange("back")))
	require.NoError(t, m.RegisterQueue("front", tinymq.Direct, func(context.Context, *tinymq.Msg) error {
		memCount.Add(1)
		return nil
	}, 1, tinymq.WithQueueName("mem"), tinymq.WithBindingKey("mem")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 2049 { // IDs 1..2049: the next one reserves ahead
		require.NoError(t, m.Publish("front", i, tinymq.WithRoutingKey("mem")))
	}
	outer := make(chan error, 1)
	go func() { outer <- m.Publish("front", r2Trigger{1}) }() // no binding: to "back", durable
	select {
	case ok := <-finished:
		assert.True(t, ok, "the codec's publishes to its own exchange froze while the codec ran")
	case <-time.After(wait):
		t.Fatal("the codec never ran")
	}
	select {
	case err := <-outer:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("the outer publish never returned")
	}
	closedWithin(t, nestedDone, "the codec's publishes")
	require.Eventually(t, func() bool { return memCount.Load() == 2049+2100 }, wait, time.Millisecond)
	stopWithin(t, m)
}

// r2Drained waits until queue has nothing waiting and nothing in a consumer.
func r2Drained(t *testing.T, m *tinymq.MQ, queue string) {
	t.Helper()
	require.Eventually(t, func() bool {
		st := m.Stats().Queues[queue]
		return st.Depth == 0 && st.InFlight == 0
	}, wait, time.Millisecond)
}
