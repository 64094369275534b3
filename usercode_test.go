package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/wal"
)

// goexitInIs is an error whose Is ends the calling goroutine.
type goexitInIs struct{}

func (goexitInIs) Error() string { return "goexitInIs" }

func (goexitInIs) Is(error) bool { runtime.Goexit(); return false }

// goexitInError is an error whose Error ends the calling goroutine.
type goexitInError struct{}

func (goexitInError) Error() string { runtime.Goexit(); return "" }

// A consumer that panics with an error value whose methods call
// runtime.Goexit: the panic becomes a *PanicError whose Unwrap returns that
// value, so the MQ must not run the value's methods outside the worker's
// guard. The failure must be counted and settled like any other: retried
// (Is is asked when a retry is possible), or dead-lettered (Error is asked
// for the death record).
func TestPanicValueWithHostileMethodsIsContained(t *testing.T) {
	for name, c := range map[string]struct {
		v           error
		maxAttempts int
	}{
		"Is calls Goexit, retry":          {goexitInIs{}, 2},
		"Error calls Goexit, dead letter": {goexitInError{}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			m := tinymq.New(quiet())
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
			}, settleWait, time.Millisecond)
			assert.True(t, ended, "the panicked message never ended (retried and succeeded, or dead-lettered): %+v", st)
			assert.Equal(t, uint64(1), st.Failed)
			assert.Equal(t, st.Failed, st.Retried+st.DeadLettered+st.Dropped, "every failure settled: %+v", st)
		})
	}
}

// answersOnceErr is an error whose Is answers once and ends the goroutine after:
// freeze promises that the MQ asks a consumer's error only once.
type answersOnceErr struct{ calls atomic.Int32 }

func (e *answersOnceErr) Error() string { return "answersOnceErr" }

func (e *answersOnceErr) Is(error) bool {
	if e.calls.Add(1) > 1 {
		runtime.Goexit()
	}
	return false
}

// A consumer returns an error wrapping a *PanicError (found in the chain, so
// its stack is logged) whose Value is the consumer's own error. freeze keeps
// the *PanicError in the consumerError it makes, and settle's errors.Is goes
// through it into the Value's Is again, outside the guard.
func TestConsumerErrorIsReadOnce(t *testing.T) {
	m := tinymq.New(quiet())
	dead := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dead), 1))
	inner := &answersOnceErr{}
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
	st := waitSettled(t, m, "q", 1)
	if assert.Equal(t, uint64(1), st.Retried, "the failed message was not settled: %+v", st) {
		assert.Eventually(t, func() bool { return m.Stats().Queues["q"].Succeeded == 1 }, settleWait, time.Millisecond, "the retry never came")
	}
	assert.Equal(t, int32(1), inner.calls.Load(), "the consumer's error was asked again after freeze")
}

// hookCodec is JSONCodec that runs hook before encoding an hookTrigger.
type hookCodec struct {
	tinymq.JSONCodec
	hook func()
}

type hookTrigger struct{ N int }

func (c hookCodec) Marshal(v any) ([]byte, error) {
	if _, ok := v.(hookTrigger); ok {
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
func TestCodecPublishingDuringAnIDReservationDoesNotFreeze(t *testing.T) {
	var m *tinymq.MQ
	nestedDone := make(chan struct{})
	finished := make(chan bool, 1)
	codec := hookCodec{hook: func() {
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
		case <-time.After(settleWait):
			finished <- false // give up, so that the test unwinds
		}
	}}
	m = tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(time.Hour), tinymq.WithCodec(codec), quiet())
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
	go func() { outer <- m.Publish("front", hookTrigger{1}) }() // no binding: to "back", durable
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

// stringerCalls is a panic value whose String runs fn: consumer code that the MQ
// runs while it freezes the panic.
type stringerCalls struct{ fn func() string }

func (v stringerCalls) String() string { return v.fn() }

// A panic value's String calls Shutdown (user code calling back in, as a
// logger may). The MQ runs the value's methods in freezeAside, on a goroutine
// that is not one of its own, while the worker waits for it: Shutdown does
// not know it was called from the consumer, so instead of beginning the stop
// and returning ErrCalledFromConsumer at once it waits for every worker,
// including the one waiting for it. The MQ freezes until Shutdown's context
// ends (forever with Stop).
func TestPanicValueWhoseStringCallsShutdownIsContained(t *testing.T) {
	m := tinymq.New(quiet())
	hostile, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan error, 1)
	var once sync.Once
	value := stringerCalls{fn: func() string {
		once.Do(func() { got <- m.Shutdown(hostile) })
		return "r3 value"
	}}
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		panic(value)
	}, 1, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	select {
	case err := <-got:
		assert.ErrorIs(t, err, tinymq.ErrCalledFromConsumer)
	case <-time.After(settleWait):
		t.Errorf("Shutdown called from the panic value's String is still waiting after %v (for the worker that waits for it)", settleWait)
		cancel() // unwedge it, so that the MQ can stop
		select {
		case <-got:
		case <-time.After(wait):
			t.Fatal("Shutdown ignores its context")
		}
	}
	stopWithin(t, m)
	st := m.Stats().Queues["q"]
	assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped+st.Undelivered, "%+v", st)
}

// bombErr is an error whose Error panics with an bombErr: fmt gives up on
// nested panics and panics again, so formatting it panics whatever guard fmt
// has.
type bombErr struct{}

func (bombErr) Error() string { panic(bombErr{}) }

// goexitStringer is a panic value whose String ends the calling goroutine.
type goexitStringer struct{}

func (goexitStringer) String() string { runtime.Goexit(); return "" }

// The frozen error keeps its meaning however hostile the value: a panic is
// reported as a panic (not as a runtime.Goexit that never happened), a
// returned error as a failure that was not a Goexit, and a panic's stack,
// taken before any of the value's methods ran, is logged. Here the value's
// Error panics with a value whose Error panics again: errorText and
// valueText recover the first panic and then format the recovered value with
// %v, which runs the consumer's code again, unguarded, and panics out of
// freeze; freezeAside then falls back to its Goexit text with no stack.
func TestHostilePanicValueKeepsItsMeaning(t *testing.T) {
	for name, c := range map[string]struct {
		fail      func() error
		panicked  bool   // the consumer panicked: a stack must be logged
		lastError string // the Death's LastError must contain it
	}{
		"panic with a self-panicking error": {func() error { panic(bombErr{}) }, true, "panic"},
		"returns a self-panicking error":    {func() error { return bombErr{} }, false, "bombErr"},
		"panic value's String calls Goexit": {func() error { panic(goexitStringer{}) }, true, "Goexit"},
	} {
		t.Run(name, func(t *testing.T) {
			logger, records := logRecords()
			m := tinymq.New(tinymq.WithLogger(logger))
			dead := deadLetters(t, m)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				return c.fail()
			}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1})))
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			require.NoError(t, m.Publish("ev", 1))
			d := recv(t, dead, 1)[0]
			st := waitSettled(t, m, "q", 1)
			assert.Equal(t, uint64(1), st.DeadLettered, "%+v", st)
			text := d.Deaths[0].LastError
			assert.Contains(t, text, c.lastError)
			if c.lastError != "Goexit" {
				assert.NotContains(t, text, "Goexit", "nothing called runtime.Goexit")
			}
			// The counts are updated before the log record is written: wait for it.
			var stack string
			logged := assert.Eventually(t, func() bool {
				for _, r := range records(t) {
					if r["queue"] == "q" && strings.Contains(fmt.Sprint(r["msg"]), "dead-lettered") {
						stack, _ = r["stack"].(string)
						return true
					}
				}
				return false
			}, settleWait, time.Millisecond)
			require.True(t, logged, "the dead-lettering was not logged")
			if c.panicked {
				assert.Contains(t, stack, "TestHostilePanicValueKeepsItsMeaning",
					"the stack of the consumer's panic is not logged (LastError %q)", text)
			}
		})
	}
}

// Edge forms of errors and panics: each failure is settled and counted once,
// retried or not as its chain says, and the Death's LastError says what
// happened.
func TestEdgeErrorsAndPanicsSettleOnce(t *testing.T) {
	var typedNil *nilErr
	for name, c := range map[string]struct {
		fail      func() error
		attempts  int    // deliveries before the dead letter (MaxAttempts 3)
		lastError string // contained in the Death's LastError
	}{
		"Permanent(typed nil)":             {func() error { return tinymq.Permanent(typedNil) }, 1, "panicked"},
		"Join(typed nil)":                  {func() error { return errors.Join(typedNil) }, 3, "panicked"},
		"panic(typed nil error)":           {func() error { panic(typedNil) }, 3, "panic"},
		"panic(nil)":                       {func() error { panic(nil) }, 3, "nil"},
		"returns ErrGoexit":                {func() error { return fmt.Errorf("w: %w", tinymq.ErrGoexit) }, 3, "Goexit"},
		"panic(*PanicError)":               {func() error { panic(&tinymq.PanicError{Value: "inner"}) }, 3, "inner"},
		"panic(Permanent in *PanicError)":  {func() error { panic(&tinymq.PanicError{Value: tinymq.Permanent(errors.New("p"))}) }, 1, "p"},
		"huge error text":                  {func() error { return errors.New(strings.Repeat("h", 1<<20)) }, 3, "hhhh"},
		"Join(Permanent, self-panicking)":  {func() error { return errors.Join(tinymq.Permanent(errors.New("p")), bombErr{}) }, 1, ""},
		"Permanent wrapping panic(string)": {func() error { return tinymq.Permanent(&tinymq.PanicError{Value: "s"}) }, 1, "s"},
	} {
		t.Run(name, func(t *testing.T) {
			m, d := deadAfterRetries(t, c.fail)
			st := waitSettled(t, m, "q", uint64(c.attempts))
			assert.Equal(t, c.attempts, d.Deaths[0].Attempts)
			assert.Equal(t, uint64(c.attempts), st.Failed, "%+v", st)
			assert.Equal(t, uint64(c.attempts-1), st.Retried, "%+v", st)
			assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped, "%+v", st)
			assert.NotEmpty(t, d.Deaths[0].LastError)
			assert.Contains(t, d.Deaths[0].LastError, c.lastError)
		})
	}
}

// cyclic values: a map and a slice that hold themselves.
func cyclicMap() map[string]any {
	m := map[string]any{"a": 1}
	m["self"] = m
	return m
}

func cyclicSlice() []any {
	s := []any{1, nil}
	s[1] = s
	return s
}

func deep(n int) any {
	var v any = 1
	for range n {
		v = []any{v}
	}
	return v
}

// Every exported function and option, fed nil, zero, negative, huge, cyclic
// and malformed values, returns a sentinel error or is accepted as
// documented; none panics.
func TestBadInputNeverPanics(t *testing.T) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	var nilCtx context.Context
	var nilOpt tinymq.Option
	newMQ := func() *tinymq.MQ {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("fan", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithQueueName("h")))
		t.Cleanup(m.Stop)
		return m
	}
	tests := []struct {
		name string
		call func(m *tinymq.MQ) error
		want error // nil: documented acceptance
	}{
		{"New with nil options", func(*tinymq.MQ) error {
			tinymq.New(nilOpt, tinymq.WithLogger(nil), tinymq.WithCodec(nil), tinymq.WithEngine(nil)).Stop()
			return nil
		}, nil},
		{"zero MQ works", func(*tinymq.MQ) error {
			var z tinymq.MQ
			if err := z.RegisterQueue("e", tinymq.Fanout, nop, 1); err != nil {
				return err
			}
			if err := z.Publish("e", 1); err != nil {
				return err
			}
			if err := z.Start(context.Background()); err != nil {
				return err
			}
			z.Stop()
			_ = z.Stats()
			_ = z.Topology()
			return nil
		}, nil},
		{"zero MQ stopped unused", func(*tinymq.MQ) error { var z tinymq.MQ; return z.Shutdown(context.Background()) }, nil},
		{"concurrency MaxInt", func(m *tinymq.MQ) error { return m.RegisterQueue("x", tinymq.Fanout, nop, math.MaxInt) }, tinymq.ErrInvalidConcurrency},
		{"concurrency above MaxConcurrency", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, tinymq.MaxConcurrency+1)
		}, tinymq.ErrInvalidConcurrency},
		{"concurrency MinInt", func(m *tinymq.MQ) error { return m.RegisterQueue("x", tinymq.Fanout, nop, math.MinInt) }, tinymq.ErrInvalidConcurrency},
		{"empty exchange name", func(m *tinymq.MQ) error { return m.RegisterQueue("", tinymq.Fanout, nop, 1) }, tinymq.ErrEmptyName},
		{"nil consumer", func(m *tinymq.MQ) error { return m.RegisterQueue("x", tinymq.Fanout, nil, 1) }, tinymq.ErrNilConsumer},
		{"Handler(nil)", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, tinymq.Handler[int](nil), 1)
		}, tinymq.ErrNilConsumer},
		{"kind 255", func(m *tinymq.MQ) error { return m.RegisterQueue("x", tinymq.ExchangeType(255), nop, 1) }, tinymq.ErrInvalidKind},
		{"nil QueueOption", func(m *tinymq.MQ) error { return m.RegisterQueue("x", tinymq.Fanout, nop, 1, nil) }, tinymq.ErrInvalidOption},
		{"nil BindingOption", func(m *tinymq.MQ) error { return m.Bind("q", "x", tinymq.Fanout, nil) }, tinymq.ErrInvalidOption},
		{"Bind unknown queue", func(m *tinymq.MQ) error { return m.Bind("nope", "x", tinymq.Fanout) }, tinymq.ErrUnknownQueue},
		{"Bind empty exchange", func(m *tinymq.MQ) error { return m.Bind("q", "", tinymq.Fanout) }, tinymq.ErrEmptyName},
		{"DeclareExchange empty name", func(m *tinymq.MQ) error { return m.DeclareExchange("", tinymq.Fanout) }, tinymq.ErrEmptyName},
		{"DeclareExchange bad kind", func(m *tinymq.MQ) error { return m.DeclareExchange("x", 0) }, tinymq.ErrInvalidKind},
		{"DeclareExchange nil option", func(m *tinymq.MQ) error { return m.DeclareExchange("x", tinymq.Fanout, nil) }, tinymq.ErrInvalidOption},
		{"binding key of 1 MiB", func(m *tinymq.MQ) error {
			return m.RegisterQueue("d", tinymq.Direct, nop, 1, tinymq.WithBindingKey(strings.Repeat("k", 1<<20)))
		}, tinymq.ErrKeyTooLong},
		{"cyclic binding args", func(m *tinymq.MQ) error {
			return m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(cyclicMap()))
		}, tinymq.ErrInvalidBinding},
		{"cyclic slice in binding args", func(m *tinymq.MQ) error {
			return m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": cyclicSlice()}))
		}, tinymq.ErrInvalidBinding},
		{"binding args nested 1000 deep", func(m *tinymq.MQ) error {
			return m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": deep(1000)}))
		}, tinymq.ErrInvalidBinding},
		{"NaN binding arg can never match", func(m *tinymq.MQ) error {
			return m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": math.NaN()}))
		}, tinymq.ErrInvalidBinding},
		{"NaN nested in a binding arg", func(m *tinymq.MQ) error {
			return m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(map[string]any{"a": []any{float32(math.NaN())}}))
		}, tinymq.ErrInvalidBinding},
		{"nil binding args match everything", func(m *tinymq.MQ) error {
			return m.RegisterQueue("hdr", tinymq.Headers, nop, 1, tinymq.WithBindingArgs(nil))
		}, nil},
		{"cyclic headers", func(m *tinymq.MQ) error { return m.Publish("fan", 1, tinymq.WithHeaders(cyclicMap())) }, tinymq.ErrInvalidHeaders},
		{"cyclic slice in headers", func(m *tinymq.MQ) error {
			return m.Publish("fan", 1, tinymq.WithHeaders(map[string]any{"a": cyclicSlice()}))
		}, tinymq.ErrInvalidHeaders},
		{"headers nested 1000 deep", func(m *tinymq.MQ) error {
			return m.Publish("fan", 1, tinymq.WithHeaders(map[string]any{"a": deep(1000)}))
		}, tinymq.ErrInvalidHeaders},
		{"headers nested 31 deep are fine", func(m *tinymq.MQ) error {
			return m.Publish("fan", 1, tinymq.WithHeaders(map[string]any{"a": deep(31)}))
		}, nil},
		{"NaN header is a valid double", func(m *tinymq.MQ) error {
			return m.Publish("hdr", 1, tinymq.WithHeaders(map[string]any{"a": math.NaN()}))
		}, nil},
		{"routing key of 1 MiB", func(m *tinymq.MQ) error {
			return m.Publish("fan", 1, tinymq.WithRoutingKey(strings.Repeat("k", 1<<20)))
		}, tinymq.ErrKeyTooLong},
		{"zero PublishOption", func(m *tinymq.MQ) error { return m.Publish("fan", 1, tinymq.PublishOption{}) }, tinymq.ErrInvalidOption},
		{"negative expiration", func(m *tinymq.MQ) error { return m.Publish("fan", 1, tinymq.WithExpiration(-1)) }, tinymq.ErrInvalidOption},
		{"expiration MaxInt64 (never)", func(m *tinymq.MQ) error {
			return m.Publish("fan", 1, tinymq.WithExpiration(math.MaxInt64))
		}, nil},
		{"delay MinInt64", func(m *tinymq.MQ) error { return m.Publish("fan", 1, tinymq.WithDelay(math.MinInt64)) }, tinymq.ErrInvalidOption},
		{"empty publish exchange", func(m *tinymq.MQ) error { return m.Publish("", 1) }, tinymq.ErrUnknownExchange},
		{"nil publish context", func(m *tinymq.MQ) error { return m.PublishContext(nilCtx, "fan", 1) }, tinymq.ErrInvalidOption},
		{"nil data is a valid payload", func(m *tinymq.MQ) error { return m.Publish("fan", nil) }, nil},
		{"nil Start context", func(m *tinymq.MQ) error { return m.Start(nilCtx) }, tinymq.ErrInvalidOption},
		{"nil Shutdown context", func(m *tinymq.MQ) error { return m.Shutdown(nilCtx) }, tinymq.ErrInvalidOption},
		{"retry NaN multiplier", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{Multiplier: math.NaN()}))
		}, tinymq.ErrInvalidOption},
		{"retry infinite multiplier is capped", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{Multiplier: math.Inf(1)}))
		}, nil},
		{"retry NaN jitter", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{Jitter: math.NaN()}))
		}, tinymq.ErrInvalidOption},
		{"retry negative backoff", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{InitialBackoff: -1}))
		}, tinymq.ErrInvalidOption},
		{"retry MaxInt attempts and backoffs", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithRetry(tinymq.RetryPolicy{
				MaxAttempts: math.MaxInt, InitialBackoff: math.MaxInt64, MaxBackoff: math.MaxInt64}))
		}, nil},
		{"queue TTL negative", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMessageTTL(-time.Second))
		}, tinymq.ErrInvalidOption},
		{"queue TTL MaxInt64", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMessageTTL(math.MaxInt64))
		}, nil},
		{"max length MaxInt", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMaxLen(math.MaxInt, tinymq.Block))
		}, nil},
		{"max length negative", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMaxLen(-1, tinymq.Block))
		}, tinymq.ErrInvalidOption},
		{"overflow 200", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithMaxLen(1, 200))
		}, tinymq.ErrInvalidOption},
		{"dead-letter key of 1 MiB", func(m *tinymq.MQ) error {
			return m.RegisterQueue("x", tinymq.Fanout, nop, 1, tinymq.WithDeadLetter("d", strings.Repeat("k", 1<<20)))
		}, tinymq.ErrKeyTooLong},
		{"Permanent(nil) is nil", func(*tinymq.MQ) error { return tinymq.Permanent(nil) }, nil},
		{"Encoded decodes into nil", func(*tinymq.MQ) error { return tinymq.Encoded{Body: []byte("1")}.Decode(nil) }, tinymq.ErrPayloadType},
		{"Encoded with a panicking codec", func(*tinymq.MQ) error {
			return tinymq.Encoded{Body: []byte("1"), Codec: panickyCodec{}}.Decode(new(int))
		}, tinymq.ErrPayloadType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMQ()
			var err error
			require.NotPanics(t, func() { err = tt.call(m) })
			if tt.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.want)
			}
		})
	}
}

type panickyCodec struct{}

func (panickyCodec) Marshal(any) ([]byte, error) { panic("marshal") }

func (panickyCodec) Unmarshal([]byte, any) error { panic("unmarshal") }

func (panickyCodec) ContentType() string { panic("content type") }

func (panickyCodec) String() string { return "panickyCodec" }

func (panickyCodec) Format(fmt.State, rune) { panic("format") }

func (panickyCodec) GoString() string { panic("gostring") }

func (panickyCodec) Error() string { panic("error") }

func (panickyCodec) Is(error) bool { panic("is") }

func (panickyCodec) Unwrap() error { panic("unwrap") }

func (panickyCodec) MarshalText() ([]byte, error) { panic("text") }

func (panickyCodec) MarshalJSON() ([]byte, error) { panic("json") }

func (panickyCodec) LogValue() slog.Value { panic("log value") }

func (panickyCodec) Timeout() bool { panic("timeout") }

func (panickyCodec) Temporary() bool { panic("temporary") }

func (panickyCodec) As(any) bool { panic("as") }

func (panickyCodec) Len() int { panic("len") }

func (panickyCodec) Cap() int { panic("cap") }

func (panickyCodec) Read([]byte) (int, error) { panic("read") }

func (panickyCodec) Write([]byte) (int, error) { panic("write") }

func (panickyCodec) Close() error { panic("close") }

func (panickyCodec) Seek(int64, int) (int64, error) { panic("seek") }

// Deadlines and backoffs past the year 2262 saturate: a TTL of MaxInt64
// means never, not "already expired", and so does a backoff.
func TestHugeDurationsSaturate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		got := make(chan *tinymq.Msg, 10)
		require.NoError(t, m.RegisterQueue("ttl", tinymq.Fanout, sink(got), 1,
			tinymq.WithQueueName("ttl"), tinymq.WithMessageTTL(math.MaxInt64)))
		var calls atomic.Int32
		require.NoError(t, m.RegisterQueue("retry", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			calls.Add(1)
			return errors.New("fail")
		}, 1, tinymq.WithQueueName("retry"), tinymq.WithRetry(tinymq.RetryPolicy{
			MaxAttempts: 3, InitialBackoff: math.MaxInt64 / 2, MaxBackoff: math.MaxInt64, Multiplier: 4})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ttl", "queue TTL MaxInt64"))
		require.NoError(t, m.Publish("ttl", "expiration MaxInt64", tinymq.WithExpiration(math.MaxInt64)))
		require.NoError(t, m.Publish("ttl", "delay and TTL", tinymq.WithDelay(time.Hour), tinymq.WithExpiration(math.MaxInt64)))
		require.NoError(t, m.Publish("retry", 1))
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		require.Len(t, got, 3, "none expired")
		st := m.Stats()
		assert.Equal(t, uint64(0), st.Queues["ttl"].Expired)
		assert.Equal(t, int32(1), calls.Load(), "the retry waits its (saturated) backoff")
		assert.Equal(t, 1, st.Queues["retry"].Scheduled)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := m.Shutdown(ctx)
		require.ErrorIs(t, err, tinymq.ErrUndelivered)
		m.Stop()
	})
}

// scenarioEnv names the re-entrancy scenario a child process runs.
const scenarioEnv = "TINYMQ_SCENARIO"

// scenarios are what hostile user code does from inside the MQ. Each runs in
// a child process (see TestReentrancy), so that a crash or a hang fails that
// scenario instead of the whole run. A scenario passes when it returns.
var scenarios = map[string]func(t *testing.T){
	"consumer returns a typed nil error": func(t *testing.T) {
		m := tinymq.New()
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			var e *nilErr
			return e
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		d := recv(t, dead, 1)[0]
		m.Stop()
		assert.Contains(t, d.Deaths[0].LastError, "typed nil")
		assert.Contains(t, d.Deaths[0].LastError, "*tinymq_test.nilErr")
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Failed)
	},
	"consumer error whose Error method panics": func(t *testing.T) {
		log, records := logRecords()
		m := tinymq.New(tinymq.WithLogger(log))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return panickyCodec{}
		}, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.Failed)
		assert.Equal(t, uint64(1), st.Dropped)
		assert.NotEmpty(t, records(t))
	},
	"logger panics": func(t *testing.T) {
		m := tinymq.New(tinymq.WithLogger(slog.New(panicHandler{})))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 2, tinymq.WithQueueName("q"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
		require.NoError(t, m.Start(context.Background()))
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i))
		}
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(20), st.Failed)
		assert.Equal(t, uint64(10), st.Dropped)
	},
	"logger blocks: Shutdown keeps its deadline": func(t *testing.T) {
		block := make(chan struct{}) // never closed: the child exits with it blocked
		m := tinymq.New(tinymq.WithLogger(slog.New(blockHandler{block})))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		for i := range 5 {
			require.NoError(t, m.Publish("ev", i))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := m.Shutdown(ctx)
		assert.ErrorIs(t, err, tinymq.ErrUndelivered)
		assert.Less(t, time.Since(start), 5*time.Second, "Shutdown returned near its deadline")
	},
	// Each message below has reached its end when the deadline passes, and
	// the MQ's goroutine that ended it is stuck in the logger: the stop
	// cannot complete, and Shutdown says so at its deadline, not later.
	"logger blocks after a failed message's end: Shutdown keeps its deadline": func(t *testing.T) {
		h := gateHandler{entered: make(chan struct{}, 1), block: make(chan struct{})} // never opened
		m := tinymq.New(tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		recv(t, h.entered, 1) // the worker logs the drop
		shutdownKeepsItsDeadline(t, m, 1)
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(1), st.Failed)
		assert.Zero(t, st.Undelivered)
	},
	"logger blocks on an expired message's drop: Shutdown keeps its deadline": func(t *testing.T) {
		h := gateHandler{entered: make(chan struct{}, 1), block: make(chan struct{})}
		m := tinymq.New(tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"),
			tinymq.WithMessageTTL(time.Millisecond)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.PauseQueue("q"))
		require.NoError(t, m.Publish("ev", 1))
		recv(t, h.entered, 1) // the scheduler expires the head and logs its drop
		shutdownKeepsItsDeadline(t, m, 1)
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Expired)
	},
	"logger blocks on a begun message that expired: Shutdown keeps its deadline": func(t *testing.T) {
		h := gateHandler{entered: make(chan struct{}, 1), block: make(chan struct{})}
		m := tinymq.New(tinymq.WithLogger(slog.New(h)))
		// The scheduler blocks first, logging the drop of a's expired head,
		// so that b's message, expired meanwhile, is found by b's worker.
		require.NoError(t, m.DeclareQueue("a", "ea", tinymq.Fanout, tinymq.WithMessageTTL(time.Millisecond)))
		require.NoError(t, m.RegisterQueue("eb", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			t.Error("an expired message reached the consumer")
			return nil
		}, 1, tinymq.WithQueueName("b")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.PauseQueue("b"))
		require.NoError(t, m.Publish("ea", 1))
		recv(t, h.entered, 1) // the scheduler, in the logger
		require.NoError(t, m.Publish("eb", 2, tinymq.WithExpiration(time.Millisecond)))
		<-time.After(20 * time.Millisecond) // b's message expires; the scheduler cannot drop it
		require.NoError(t, m.ResumeQueue("b"))
		recv(t, h.entered, 1) // b's worker, in the logger, dropping its expired message
		// Two of the MQ's goroutines in the logger: the scheduler and b's worker.
		shutdownKeepsItsDeadline(t, m, 2)
		assert.Equal(t, uint64(1), m.Stats().Queues["b"].Expired)
	},
	"logger blocks on an expired queue's delete: Shutdown keeps its deadline": func(t *testing.T) {
		h := gateHandler{entered: make(chan struct{}, 1), block: make(chan struct{})}
		m := tinymq.New(tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithQueueExpiry(time.Millisecond)))
		require.NoError(t, m.Publish("ev", 1))
		require.NoError(t, m.Start(context.Background()))
		recv(t, h.entered, 1) // the scheduler deletes the unused queue and logs it
		shutdownKeepsItsDeadline(t, m, 1)
		assert.Equal(t, uint64(1), m.Stats().Deleted.Removed)
	},
	"logger blocks on the stop's own log line: Shutdown keeps its deadline": func(t *testing.T) {
		h := gateHandler{entered: make(chan struct{}, 1), block: make(chan struct{})}
		m := tinymq.New(tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.PauseQueue("q"))
		require.NoError(t, m.Publish("ev", 1)) // stays in the paused queue: the stop logs it
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- m.Shutdown(ctx) }()
		recv(t, h.entered, 1)
		cancel()
		select {
		case err := <-res:
			require.Error(t, err)
			assert.ErrorIs(t, err, tinymq.ErrUndelivered, "the stop counted the message it stranded before the deadline: lost")
			assert.ErrorIs(t, err, context.Canceled)
			assert.Contains(t, err.Error(), "1 never reached a consumer, 0 were in consumers")
			assert.Contains(t, err.Error(), "1 of the MQ's goroutines still run a logger")
		case <-time.After(5 * time.Second):
			t.Fatal("Shutdown waited past its deadline for a blocked logger")
		}
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Undelivered)
	},
	"logger calls runtime.Goexit": func(t *testing.T) {
		h := &callbackHandler{fn: runtime.Goexit}
		m := tinymq.New(tinymq.WithLogger(slog.New(h)))
		dead := deadLetters(t, m)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
			tinymq.WithMessageTTL(time.Hour), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.RegisterQueue("slow", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			<-ctx.Done()
			return ctx.Err()
		}, 1, tinymq.WithQueueName("slow")))
		require.NoError(t, m.Start(context.Background()))
		for i := range 5 {
			require.NoError(t, m.Publish("ev", i)) // failure, retry, dead letter: each logged
		}
		recv(t, dead, 5)
		require.NoError(t, m.Publish("slow", 1))
		require.NoError(t, m.Publish("slow", 2)) // left undelivered by the deadline: logged by the drain
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		assert.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, uint64(10), st.Failed)
		assert.Equal(t, uint64(5), st.Retried)
		assert.Equal(t, uint64(5), st.DeadLettered)
		slow := m.Stats().Queues["slow"]
		assert.Equal(t, slow.Accepted, slow.Succeeded+slow.DeadLettered+slow.Dropped+slow.Undelivered)
	},
	"logger calls Stop": func(t *testing.T) {
		var m *tinymq.MQ
		h := &callbackHandler{fn: func() { m.Stop() }}
		m = tinymq.New(tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		m.Stop()
		assert.ErrorIs(t, m.Publish("ev", 2), tinymq.ErrStopped)
	},
	"logger calls RegisterQueue while a durable queue is restored": func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		m := tinymq.New(tinymq.WithDataDir(dir))
		durable := []tinymq.QueueOption{tinymq.WithQueueName("q"), tinymq.WithDurable()}
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, durable...))
		require.NoError(t, m.Publish("ev", 1))
		_ = m.Shutdown(context.Background()) // before Start: the message stays on disk

		var once sync.Once
		h := &callbackHandler{fn: func() {
			once.Do(func() {
				assert.NoError(t, m.RegisterQueue("other", tinymq.Fanout, failing, 1, tinymq.WithQueueName("other")))
			})
		}}
		m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(h)))
		got := make(chan *tinymq.Msg, 1)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, durable...)) // logs the recovery
		require.NoError(t, m.Start(context.Background()))
		recv(t, got, 1)
		m.Stop()
		assert.Contains(t, m.Stats().Queues, "other", "the logger's RegisterQueue took effect")
	},
	"codec calls RegisterQueue while a dead letter is encoded for a durable queue": func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		var m *tinymq.MQ
		var once sync.Once
		codec := &callbackCodec{fn: func() {
			once.Do(func() { assert.NoError(t, m.RegisterQueue("other", tinymq.Fanout, failing, 1)) })
		}}
		m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithCodec(codec))
		parked := make(chan *tinymq.Msg, 1)
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(parked), 1, tinymq.WithQueueName("parked"), tinymq.WithDurable()))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1)) // in memory: the codec runs when it dies into "parked"
		recv(t, parked, 1)
		m.Stop()
		assert.Equal(t, uint64(1), m.Stats().Queues["parked"].Succeeded)
	},
	"logger publishes every error line, after the log failed": func(t *testing.T) {
		var fail atomic.Bool
		defer tinymq.SetWALFaults(&wal.Faults{WriteErr: func(string) error {
			if fail.Load() {
				return syscall.ENOSPC
			}
			return nil
		}})()
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		var m *tinymq.MQ
		var errorLines atomic.Int64
		h := &callbackHandler{fn: func() {
			errorLines.Add(1)
			_ = m.Publish("alerts", "an error was logged") // forwarding errors to an alert queue
		}}
		m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.RegisterQueue("alerts", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		fail.Store(true)
		assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrLog)
		for i := range 5000 { // past a block of reserved IDs: the next reservation fails
			require.NoError(t, m.Publish("alerts", i))
		}
		m.Stop()
		assert.Less(t, errorLines.Load(), int64(10), "the failed reservation is logged once, not per publish")
	},
	"logger panics when an fdatasync fails": func(t *testing.T) {
		var fail atomic.Bool
		defer tinymq.SetWALFaults(&wal.Faults{SyncErr: func(string) error {
			if fail.Load() {
				return syscall.EIO
			}
			return nil
		}})()
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(panicHandler{})))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		fail.Store(true)
		assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrLog)
		m.Stop()
	},
	"logger calls Stop before Start": func(t *testing.T) {
		var m *tinymq.MQ
		h := &callbackHandler{fn: func() { m.Stop() }}
		m = tinymq.New(tinymq.WithLogger(slog.New(h)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1))
		require.NoError(t, m.Publish("ev", 1))
		assert.ErrorIs(t, m.Shutdown(context.Background()), tinymq.ErrUndelivered)
	},
	"consumer calls Stop": func(t *testing.T) {
		m := tinymq.New()
		var delivered atomic.Int32
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			if delivered.Add(1) == 1 {
				m.Stop()
			}
			return nil
		}, 1, tinymq.WithQueueName("q")))
		for i := range 10 {
			require.NoError(t, m.Publish("ev", i))
		}
		require.NoError(t, m.Start(context.Background()))
		m.Stop()
		assert.Equal(t, int32(10), delivered.Load(), "what was accepted is still delivered")
	},
	"consumer calls Shutdown": func(t *testing.T) {
		m := tinymq.New()
		errs := make(chan error, 1)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			errs <- m.Shutdown(context.Background())
			return nil
		}, 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		assert.ErrorIs(t, recv(t, errs, 1)[0], tinymq.ErrCalledFromConsumer)
		m.Stop()
	},
	"consumer calls runtime.Goexit": func(t *testing.T) {
		m := tinymq.New()
		var delivered atomic.Int32
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			delivered.Add(1)
			if msg.Data.(int)%3 == 0 {
				runtime.Goexit() // what t.FailNow and require do
			}
			return nil
		}, 2, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		for i := range 30 {
			require.NoError(t, m.Publish("ev", i))
		}
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, int32(30), delivered.Load(), "the queue keeps its workers")
		assert.Equal(t, uint64(10), st.Failed)
		assert.Equal(t, uint64(20), st.Succeeded)
		assert.Equal(t, uint64(10), st.Dropped)
	},
	"consumer's error calls runtime.Goexit from Error, Is or Unwrap": func(t *testing.T) {
		m := tinymq.New()
		var delivered atomic.Int32
		dead := make(chan *tinymq.Msg, 30)
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dead), 1))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			delivered.Add(1)
			if msg.Data.(int)%3 == 0 {
				return goexitError{}
			}
			return nil
		}, 2, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1})))
		require.NoError(t, m.Start(context.Background()))
		for i := range 30 {
			require.NoError(t, m.Publish("ev", i))
		}
		for _, d := range recv(t, dead, 10) {
			assert.Contains(t, d.Deaths[0].LastError, tinymq.ErrGoexit.Error())
		}
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Equal(t, int32(30), delivered.Load(), "the queue keeps its workers")
		assert.Equal(t, uint64(10), st.Failed)
		assert.Equal(t, uint64(20), st.Succeeded)
		assert.Equal(t, uint64(10), st.DeadLettered, "every failed message is settled")
	},
	"consumer publishes, registers and reads Stats": func(t *testing.T) {
		m := tinymq.New()
		got := make(chan *tinymq.Msg, 100)
		var n atomic.Int32
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			_ = m.Stats()
			_ = m.Topology()
			if i := n.Add(1); i <= 5 {
				if err := m.RegisterQueue("more", tinymq.Fanout, sink(got), 1); err != nil {
					return err
				}
				return m.Publish("more", i)
			}
			return nil
		}, 2))
		require.NoError(t, m.Start(context.Background()))
		for i := range 5 {
			require.NoError(t, m.Publish("ev", i))
		}
		recv(t, got, 5) // RegisterQueue is refused once Stop begins
		m.Stop()
	},
	"filter calls Stats and Publish while a writer waits": func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("side", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1))
		inFilter := make(chan struct{}, 1)
		release := make(chan struct{})
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithFilter(func(*tinymq.Msg) bool {
				select {
				case inFilter <- struct{}{}:
					<-release
				default:
				}
				_ = m.Stats()
				return m.Publish("side", 1) == nil
			})))
		require.NoError(t, m.Start(context.Background()))
		published := make(chan error, 1)
		go func() { published <- m.Publish("ev", 1) }()
		recv(t, inFilter, 1)
		registered := make(chan error, 1)
		go func() {
			registered <- m.RegisterQueue("late", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1)
		}()
		time.Sleep(10 * time.Millisecond) // let RegisterQueue wait for the lock, if the filter held it
		close(release)
		assert.NoError(t, recv(t, published, 1)[0])
		assert.NoError(t, recv(t, registered, 1)[0])
		m.Stop()
	},
	"filter calls RegisterQueue and Stop": func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithFilter(func(*tinymq.Msg) bool {
				_ = m.RegisterQueue("other", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1)
				m.Stop()
				return true
			})))
		require.NoError(t, m.Start(context.Background()))
		assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrStopped, "Stop began while the filter ran")
		m.Stop()
	},
	"dead-letter filter calls runtime.Goexit": func(t *testing.T) {
		// The dead letters of an expiry (on the scheduler's goroutine) and of
		// an eviction (on the publisher's) meet a filter that calls Goexit
		// on every third message: the goroutine that dead-letters goes on,
		// the dead letter is dropped and counted, and the MQ still stops.
		var calls atomic.Int64
		m := tinymq.New(quiet())
		got := make(chan *tinymq.Msg, 100)
		require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
			if calls.Add(1)%3 == 1 {
				runtime.Goexit()
			}
			return true
		})))
		_, err := m.Consume("dead", sink(got), 1)
		require.NoError(t, err)
		require.NoError(t, m.DeclareQueue("expires", "ev", tinymq.Fanout, tinymq.WithMessageTTL(time.Millisecond), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.DeclareQueue("full", "ev", tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
		delayed := make(chan *tinymq.Msg, 10)
		require.NoError(t, m.RegisterQueue("later", tinymq.Fanout, sink(delayed), 1, tinymq.WithQueueName("later")))
		require.NoError(t, m.Start(context.Background()))
		for i := range 6 {
			published := make(chan error, 1)
			go func() { published <- m.Publish("ev", i) }() // evicts the one before from full
			select {
			case err := <-published:
				require.NoError(t, err)
			case <-time.After(wait):
				t.Fatal("a publish whose eviction met the filter's Goexit neither returned nor ended")
			}
		}
		require.Eventually(t, func() bool {
			st := m.Stats().Queues
			return st["expires"].Expired == 6 && st["full"].Overflowed == 5 &&
				st["expires"].DeadLettered+st["expires"].Dropped == 6 && st["full"].DeadLettered+st["full"].Dropped == 5
		}, wait, time.Millisecond, "every dead letter is delivered or dropped")
		// The scheduler still runs: a delayed message arrives.
		require.NoError(t, m.Publish("later", "late", tinymq.WithDelay(time.Millisecond)))
		recv(t, delayed, 1)
		stopWithin(t, m)
		st := m.Stats().Queues
		dropped := st["expires"].Dropped + st["full"].Dropped
		assert.NotZero(t, dropped, "the filter's Goexit drops its dead letter")
		assert.Equal(t, st["expires"].DeadLettered+st["full"].DeadLettered, st["dead"].Accepted)
		assert.Equal(t, st["dead"].Accepted, uint64(len(got)))
		for _, name := range []string{"dead", "expires", "full", "later"} {
			assertLedger(t, name, st[name])
		}
	},
	"filter panics with a sentinel-free value": func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithFilter(func(*tinymq.Msg) bool { panic(42) })))
		err := m.Publish("ev", 1)
		assert.ErrorIs(t, err, tinymq.ErrPanicked)
		var pe *tinymq.PanicError
		assert.ErrorAs(t, err, &pe)
		m.Stop()
	},
	"Handler[any] takes a nil payload": func(t *testing.T) {
		m := tinymq.New()
		got := make(chan any, 1)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, v any) error {
			got <- v
			return nil
		}), 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", nil))
		assert.Nil(t, recv(t, got, 1)[0])
		m.Stop()
	},
	"logger calls back into the MQ from every log line of a restore": func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		leaveOnDisk(t, dir, "a", 6, nil) // restored beyond a limit, into a durable dead-letter queue
		leaveOnDisk(t, dir, "b", 3, nil) // not registered again: Start's warning
		leaveOnDisk(t, dir, "c", 3, nil) // restored beyond a limit, with no dead-letter exchange: dropped
		var m *tinymq.MQ
		var calls atomic.Int64
		m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(&callbackHandler{fn: func() { reenter(m, calls.Add(1)) }})))
		require.NoError(t, m.RegisterQueue("side", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("side")))
		dlq := make(chan *tinymq.Msg, 16)
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dlq), 1, tinymq.WithQueueName("dlq"), tinymq.WithDurable()))
		got := make(chan *tinymq.Msg, 16)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("a"), tinymq.WithDurable(),
			tinymq.WithMaxLen(2, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.RegisterQueue("ev2", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("c"), tinymq.WithDurable(),
			tinymq.WithMaxLen(1, tinymq.DropHead)))
		require.NoError(t, m.Start(context.Background()))
		recv(t, got, 2)
		for _, d := range recv(t, dlq, 4) {
			assert.Equal(t, tinymq.ReasonMaxLen, d.Deaths[0].Reason)
		}
		require.Eventually(t, func() bool { return m.Stats().Queues["c"].Dropped == 2 }, wait, time.Millisecond)
		m.Stop()
		assert.NotZero(t, calls.Load(), "the logger was called")
	},
	"logger calls Stop and Shutdown from Start's warning": func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		leaveOnDisk(t, dir, "orphan", 2, nil) // not registered again: Start warns
		var m *tinymq.MQ
		stopped := make(chan struct{})
		var once sync.Once
		m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(&callbackHandler{fn: func() {
			once.Do(func() {
				m.Stop() // begins the stop and returns at once
				_ = m.Shutdown(context.Background())
				close(stopped)
			})
		}})))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("other"), tinymq.WithDurable()))
		started := make(chan error, 1)
		go func() { started <- m.Start(context.Background()) }()
		closedWithin(t, stopped, "Stop and Shutdown called from Start's warning returning")
		if err := recv(t, started, 1)[0]; err != nil {
			assert.ErrorIs(t, err, tinymq.ErrStopped)
		}
		m.Stop()
		assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrStopped)
		m = tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.Start(context.Background()), "the directory is free again")
		assert.True(t, m.Stats().Queues["orphan"].Unregistered)
		m.Stop()
	},
	"logger panics on every line of a restore, a Stop before Start and a Shutdown deadline": func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		leaveOnDisk(t, dir, "orphan", 2, nil) // Start's warning
		leaveOnDisk(t, dir, "lim", 4, nil)    // restored beyond a limit: drops
		var records atomic.Int64
		logger := tinymq.WithLogger(slog.New(&callbackHandler{fn: func() {
			if records.Add(1)%2 == 0 {
				panic(errors.New("the logger panics with an error"))
			}
			panic("the logger panics")
		}}))

		m := tinymq.New(logger)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1))
		require.NoError(t, m.Publish("ev", 1))
		m.Stop() // before Start: logs what it drops

		m = tinymq.New(tinymq.WithDataDir(dir), logger)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			switch msg.Data {
			case "err":
				return errors.New("fails")
			case "panic":
				panic("the consumer panics")
			}
			return nil
		}, 2, tinymq.WithQueueName("work"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
		require.NoError(t, m.RegisterQueue("limx", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("lim"), tinymq.WithDurable(),
			tinymq.WithMaxLen(1, tinymq.DropHead)))
		require.NoError(t, m.Start(context.Background()))
		for _, v := range []string{"err", "panic", "ok"} {
			require.NoError(t, m.Publish("ev", v))
		}
		require.Eventually(t, func() bool {
			s := m.Stats().Queues["work"]
			return s.Succeeded == 1 && s.Dropped == 2
		}, wait, time.Millisecond)
		m.Stop()
		assert.Equal(t, uint64(3), m.Stats().Queues["lim"].Dropped)

		m = tinymq.New(logger)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			<-ctx.Done()
			return ctx.Err()
		}, 1, tinymq.WithQueueName("slow")))
		require.NoError(t, m.Start(context.Background()))
		for i := range 5 {
			require.NoError(t, m.Publish("ev", i))
		}
		require.Eventually(t, func() bool { return m.Stats().Queues["slow"].InFlight == 1 }, wait, time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered) // the drops are logged by the MQ's own goroutine
		m.Stop()
		assert.NotZero(t, records.Load())
	},
	"codec calls back into the MQ, blocks in Marshal and calls Stop": func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		c := &reenteringCodec{block: make(chan struct{}), in: make(chan struct{}, 1)}
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithCodec(c))
		c.m = m
		require.NoError(t, m.RegisterQueue("side", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
			tinymq.WithQueueName("side")))
		var decoded atomic.Int64
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(context.Context, any) error {
			decoded.Add(1)
			return nil
		}), 2, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))

		blocked := make(chan error, 1)
		go func() { blocked <- m.Publish("ev", "block") }()
		recv(t, c.in, 1) // one publisher is stuck in Marshal; everything else goes on
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 50 {
					assert.NoError(t, m.Publish("ev", map[string]int{"g": g, "i": i}))
				}
			})
		}
		published := make(chan struct{})
		go func() { wg.Wait(); close(published) }()
		closedWithin(t, published, "publishers beside a codec blocked in Marshal")
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("late"), tinymq.WithDurable()))
		_ = m.Stats()
		close(c.block)
		require.NoError(t, recv(t, blocked, 1)[0])
		require.Eventually(t, func() bool { return decoded.Load() == 201 }, wait, time.Millisecond)

		// A codec's Marshal that calls Stop, on a publisher's goroutine.
		dir2, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir2)
		var m2 *tinymq.MQ
		m2 = tinymq.New(tinymq.WithDataDir(dir2), tinymq.WithCodec(&callbackCodec{fn: func() { m2.Stop() }}))
		require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m2.Start(context.Background()))
		if err := m2.Publish("ev", 1); err != nil {
			assert.ErrorIs(t, err, tinymq.ErrStopped)
		}
		m2.Stop()
		m.Stop()
	},
	"logger calls back into the MQ while the disk is full": func(t *testing.T) {
		var writes atomic.Int64
		defer tinymq.SetWALFaults(&wal.Faults{WriteErr: func(string) error {
			if writes.Add(1) > 20 {
				return syscall.ENOSPC
			}
			return nil
		}})()
		dir, _ := os.MkdirTemp("", "tinymq-reentrancy")
		defer os.RemoveAll(dir)
		var m *tinymq.MQ
		var calls atomic.Int64
		m = tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(slog.New(&callbackHandler{fn: func() {
			if n := calls.Add(1); n <= 100 { // bounded: a Publish logs again once the log failed
				reenter(m, n)
			}
		}})))
		nop := func(context.Context, *tinymq.Msg) error { return nil }
		require.NoError(t, m.RegisterQueue("side", tinymq.Fanout, nop, 1, tinymq.WithQueueName("side")))
		require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, nop, 1, tinymq.WithQueueName("mem")))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
			<-ctx.Done()
			return ctx.Err()
		}, 1, tinymq.WithQueueName("d"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		failed := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 200 {
					if err := m.Publish("ev", strings.Repeat("x", 1<<10)); err != nil {
						failed <- err
						return
					}
				}
			})
		}
		published := make(chan struct{})
		go func() { wg.Wait(); close(published) }()
		closedWithin(t, published, "publishers on a full disk")
		require.NotEmpty(t, failed, "the disk filled up")
		require.ErrorIs(t, <-failed, tinymq.ErrLog)
		require.ErrorIs(t, m.Publish("ev", "small"), tinymq.ErrLog, "after a failed write every durable publish fails")
		require.NoError(t, m.Publish("mem", "small"), "in-memory queues keep working")
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_ = m.Shutdown(ctx)
			m.Stop()
		}()
		closedWithin(t, stopped, "Stop after a failed write")
		assert.NotZero(t, calls.Load(), "the logger was called")
	},
	"the log's files stay private under umask 0": func(t *testing.T) {
		syscall.Umask(0) // the whole process: why this runs in a child
		base, _ := os.MkdirTemp("", "tinymq-umask")
		defer os.RemoveAll(base)
		dir := filepath.Join(base, "new", "data") // the MQ creates both
		leaveOnDisk(t, dir, "q", 5, func(int) any { return strings.Repeat("z", 1000) })
		segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
		require.NoError(t, err)
		require.NotEmpty(t, segs)
		b, err := os.ReadFile(segs[0])
		require.NoError(t, err)
		b[len(b)/3] ^= 0xff // damage before the tail: repair keeps a copy of what it cuts
		require.NoError(t, os.WriteFile(segs[0], b, 0o600))
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogRepair(), quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		m.Stop()
		var sawCorrupt bool
		require.NoError(t, filepath.WalkDir(filepath.Dir(dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			sawCorrupt = sawCorrupt || strings.Contains(p, ".corrupt-")
			want := fs.FileMode(0o600)
			if d.IsDir() {
				want = 0o700
			}
			assert.Equal(t, want, fi.Mode().Perm(), p)
			return nil
		}))
		assert.True(t, sawCorrupt, "repair keeps what it cuts")
	},
}

// nilErr is an error whose Error dereferences its receiver: a typed nil
// *nilErr panics when asked for its text.
type nilErr struct{ msg string }

func (e *nilErr) Error() string { return e.msg }

func failing(context.Context, *tinymq.Msg) error { return errors.New("fail") }

type panicHandler struct{}

func (panicHandler) Enabled(context.Context, slog.Level) bool { return true }

func (panicHandler) Handle(context.Context, slog.Record) error { panic("logger panics") }

func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h panicHandler) WithGroup(string) slog.Handler { return h }

type blockHandler struct{ block chan struct{} }

func (blockHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h blockHandler) Handle(context.Context, slog.Record) error { <-h.block; return nil }

func (h blockHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h blockHandler) WithGroup(string) slog.Handler { return h }

// gateHandler reports each log line whose message starts with prefix
// (every line when prefix is empty) on entered (if there is room) and then
// blocks until block is closed.
type gateHandler struct {
	prefix         string
	entered, block chan struct{}
}

func (gateHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h gateHandler) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, h.prefix) {
		return nil
	}
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.block
	return nil
}

func (h gateHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h gateHandler) WithGroup(string) slog.Handler { return h }

// shutdownKeepsItsDeadline runs a Shutdown of m with a deadline that ends
// while goroutines of the MQ's are stuck in user code (after their messages'
// end, or for none), and checks that it returns at its deadline with an
// error that says so.
func shutdownKeepsItsDeadline(t *testing.T, m *tinymq.MQ, goroutines int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- m.Shutdown(ctx) }()
	select {
	case err := <-res:
		require.Error(t, err)
		assert.NotErrorIs(t, err, tinymq.ErrUndelivered, "no message was lost")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), fmt.Sprintf("%d of the MQ's goroutines still run a logger", goroutines))
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown waited past its deadline for a blocked logger")
	}
}

type callbackHandler struct{ fn func() }

func (*callbackHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *callbackHandler) Handle(context.Context, slog.Record) error { h.fn(); return nil }

func (h *callbackHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *callbackHandler) WithGroup(string) slog.Handler { return h }

// reenter calls back into m from user code, everything the README allows:
// Stats, Topology, RecentDeadLetters, Publish, RegisterQueue, Bind and
// DeclareExchange, the names made new by n.
func reenter(m *tinymq.MQ, n int64) {
	_ = m.Stats()
	_ = m.Topology()
	_ = m.RecentDeadLetters()
	_ = m.Publish("side", n)
	_ = m.RegisterQueue("side", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName(fmt.Sprint("side-", n)))
	_ = m.Bind(fmt.Sprint("side-", n), "side2", tinymq.Fanout)
	_ = m.DeclareExchange(fmt.Sprint("x-", n), tinymq.Direct)
}

// reenteringCodec is JSON that calls back into m (reenter) from Marshal,
// Unmarshal and ContentType; its Marshal of "block" first signals in and
// waits for block to close.
type reenteringCodec struct {
	m     *tinymq.MQ
	n     atomic.Int64
	block chan struct{}
	in    chan struct{}
}

func (c *reenteringCodec) Marshal(v any) ([]byte, error) {
	if v == "block" {
		c.in <- struct{}{}
		<-c.block
	}
	reenter(c.m, c.n.Add(1))
	return tinymq.JSONCodec{}.Marshal(v)
}

func (c *reenteringCodec) Unmarshal(b []byte, v any) error {
	reenter(c.m, c.n.Add(1))
	return tinymq.JSONCodec{}.Unmarshal(b, v)
}

func (c *reenteringCodec) ContentType() string {
	_ = c.m.Stats()
	return tinymq.JSONCodec{}.ContentType()
}

// callbackCodec is JSON that calls fn first, each time it encodes.
type callbackCodec struct{ fn func() }

func (c *callbackCodec) Marshal(v any) ([]byte, error) {
	c.fn()
	return tinymq.JSONCodec{}.Marshal(v)
}

func (*callbackCodec) Unmarshal(b []byte, v any) error { return tinymq.JSONCodec{}.Unmarshal(b, v) }

func (*callbackCodec) ContentType() string { return tinymq.JSONCodec{}.ContentType() }

// TestReentrancy runs each scenario in a child process with a bound, so that
// a crash or a hang of the MQ fails the scenario, not the test run.
func TestReentrancy(t *testing.T) {
	if os.Getenv(scenarioEnv) != "" {
		t.Skip("in a child process")
	}
	for name := range scenarios {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestReentrancyChild$", "-test.count=1", "-test.v")
			// The race detector sleeps a second at exit by default: not here.
			cmd.Env = append(os.Environ(), scenarioEnv+"="+name, "GORACE=atexit_sleep_ms=0")
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the scenario hung (killed after 60s):\n%s", out)
			}
			if err != nil || !strings.Contains(string(out), "--- PASS: TestReentrancyChild") {
				t.Fatalf("the scenario failed (%v):\n%s", err, out)
			}
		})
	}
}

// TestReentrancyChild runs one scenario, in a child process of TestReentrancy.
func TestReentrancyChild(t *testing.T) {
	name := os.Getenv(scenarioEnv)
	if name == "" {
		t.Skip("runs in a child process of TestReentrancy")
	}
	scenarios[name](t)
}

// TestTortureLedger builds random topologies with hostile consumers (errors,
// panics, typed nils, Goexit, consumers that publish back into the MQ), runs
// publishers against them, and stops with Stop or a Shutdown deadline at a
// random moment. It keeps a ledger of every accepted message and checks that
// each ends exactly once and that Stats reconciles.
func TestTortureLedger(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { torture(t, seed) })
	}
}

func torture(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	m := tinymq.New()
	type key struct {
		queue string
		id    uint64
	}
	var mu sync.Mutex
	succeeded := map[key]int{}
	deadByQueue := map[string]int{}
	nQueues := 2 + rng.IntN(4)
	names := make([]string, nQueues)
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		mu.Lock()
		deadByQueue[msg.Deaths[0].Queue]++
		mu.Unlock()
		return nil
	}, 1, tinymq.WithQueueName("dead")))
	for i := range names {
		names[i] = fmt.Sprint("q", i)
		opts := []tinymq.QueueOption{tinymq.WithQueueName(names[i]), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1 + rng.IntN(3), InitialBackoff: 50 * time.Microsecond, MaxBackoff: time.Millisecond})}
		if rng.IntN(3) == 0 {
			opts = append(opts, tinymq.WithMaxLen(50+rng.IntN(200), tinymq.DropHead))
		}
		if rng.IntN(3) == 0 {
			opts = append(opts, tinymq.WithMessageTTL(time.Duration(1+rng.IntN(20))*time.Millisecond))
		}
		consumerSeed := rng.Uint64()
		var crng = rand.New(rand.NewPCG(consumerSeed, 1))
		var cmu sync.Mutex
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			cmu.Lock()
			r := crng.IntN(12)
			cmu.Unlock()
			switch r {
			case 0:
				return errors.New("fail")
			case 1:
				panic("boom")
			case 2:
				var e *nilErr
				return e
			case 3:
				runtime.Goexit()
			case 4:
				_ = m.Publish("side", msg.ID) // re-entrant; ErrStopped while stopping
			}
			mu.Lock()
			succeeded[key{msg.Queue, msg.ID}]++
			mu.Unlock()
			return nil
		}, 1+rng.IntN(4), opts...))
	}
	require.NoError(t, m.RegisterQueue("side", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1, tinymq.WithQueueName("side")))
	require.NoError(t, m.Start(context.Background()))

	var wg sync.WaitGroup
	flowing := make(chan struct{}, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 600 {
				if err := m.Publish("ev", i); err != nil {
					assert.ErrorIs(t, err, tinymq.ErrStopped)
					return
				}
				if i == 100 {
					flowing <- struct{}{}
				}
			}
		}()
	}
	recv(t, flowing, 4)
	aborted := rng.IntN(2) == 1
	if !aborted {
		m.Stop()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3))*time.Millisecond)
		_ = m.Shutdown(ctx)
		cancel()
		m.Stop()
	}
	wg.Wait()

	s := m.Stats()
	var totalDead uint64
	for _, name := range names {
		st := s.Queues[name]
		assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped+st.Undelivered,
			"queue %s: every accepted message ended once: %+v", name, st)
		assert.Zero(t, st.Depth+st.InFlight, "queue %s: nothing waits after Stop", name)
		n := 0
		for k, c := range succeeded {
			if k.queue == name {
				n++
				if c != 1 {
					t.Errorf("queue %s, message %d succeeded %d times", name, k.id, c)
				}
			}
		}
		assert.Equal(t, int(st.Succeeded), n, "queue %s: the ledger of successes matches Stats", name)
		if aborted { // the dead-letter queue may have been aborted too
			assert.LessOrEqual(t, deadByQueue[name], int(st.DeadLettered), "queue %s: dead letters consumed", name)
		} else {
			assert.Equal(t, int(st.DeadLettered), deadByQueue[name], "queue %s: the ledger of dead letters matches Stats", name)
		}
		totalDead += st.DeadLettered
	}
	dead := s.Queues["dead"]
	assert.Equal(t, totalDead, dead.Accepted, "every dead letter reached the dead-letter queue")
	assert.Equal(t, dead.Accepted, dead.Succeeded+dead.Undelivered)
	assert.Equal(t, s.Exchanges["dlx"].Published, dead.Accepted)
}

// goexitError is an error whose every method ends the calling goroutine.
type goexitError struct{}

func (goexitError) Error() string { runtime.Goexit(); return "" }

func (goexitError) Is(error) bool { runtime.Goexit(); return false }

func (goexitError) Unwrap() error { runtime.Goexit(); return nil }

// A logger that blocks on a line about a failed write-ahead log (the log's
// own report of the failure, or the stop's line about closing it) does not
// hold Shutdown past its deadline: nothing was lost in the queue, and the
// error says that one of the MQ's goroutines still runs the logger.
func TestShutdownKeepsItsDeadlineWhileTheLoggerBlocksOnAFailedLog(t *testing.T) {
	for _, line := range []string{"wal: log failed", "tinymq: closing the log"} {
		t.Run(line, func(t *testing.T) {
			var full atomic.Bool
			defer tinymq.SetWALFaults(&wal.Faults{WriteErr: func(string) error {
				if full.Load() {
					return syscall.ENOSPC
				}
				return nil
			}})()
			h := gateHandler{prefix: line, entered: make(chan struct{}, 1), block: make(chan struct{})}
			m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithLogger(slog.New(h)))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
				tinymq.WithQueueName("q"), tinymq.WithDurable()))
			require.NoError(t, m.Start(context.Background()))
			full.Store(true)
			require.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrLog, "the disk is full")
			shutdownKeepsItsDeadline(t, m, 1)
			recv(t, h.entered, 1) // the line was logged, and blocked
			close(h.block)
			stopWithin(t, m)
		})
	}
}

// A stop before Start logs what it dropped on a goroutine of the MQ's: a
// logger that blocks on that line does not hold Shutdown past its deadline,
// which returns the drops (ErrUndelivered) at its deadline.
func TestShutdownBeforeStartKeepsItsDeadlineWhileTheLoggerBlocks(t *testing.T) {
	h := gateHandler{prefix: "tinymq: stopped before Start", entered: make(chan struct{}, 1), block: make(chan struct{})}
	m := tinymq.New(tinymq.WithLogger(slog.New(h)))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	require.NoError(t, m.Publish("ev", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- m.Shutdown(ctx) }()
	select {
	case err := <-res:
		require.ErrorIs(t, err, tinymq.ErrUndelivered)
		assert.Contains(t, err.Error(), "1 messages published before Start were dropped")
	case <-time.After(5 * time.Second):
		close(h.block)
		<-res
		t.Fatal("Shutdown before Start waited past its deadline for a blocked logger")
	}
	recv(t, h.entered, 1) // the line was logged, and blocked
	close(h.block)
	stopWithin(t, m)
}
