package tinymq_test

// Review 3: attacks on freeze and freezeAside (a consumer's error and panic
// value asked once, and their methods kept off the worker). Every identifier
// here starts with r3.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// r3Calls is a panic value whose String runs fn: consumer code that the MQ
// runs while it freezes the panic.
type r3Calls struct{ fn func() string }

func (v r3Calls) String() string { return v.fn() }

// A panic value's String calls Shutdown (user code calling back in, as a
// logger may). The MQ runs the value's methods in freezeAside, on a goroutine
// that is not one of its own, while the worker waits for it: Shutdown does
// not know it was called from the consumer, so instead of beginning the stop
// and returning ErrCalledFromConsumer at once it waits for every worker,
// including the one waiting for it. The MQ freezes until Shutdown's context
// ends (forever with Stop).
func TestReview3PanicValueMethodCallsShutdown(t *testing.T) {
	m := tinymq.New(r2Quiet())
	hostile, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan error, 1)
	var once sync.Once
	value := r3Calls{fn: func() string {
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
	case <-time.After(r2Short):
		t.Errorf("Shutdown called from the panic value's String is still waiting after %v (for the worker that waits for it)", r2Short)
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

// r3Bomb is an error whose Error panics with an r3Bomb: fmt gives up on
// nested panics and panics again, so formatting it panics whatever guard fmt
// has.
type r3Bomb struct{}

func (r3Bomb) Error() string { panic(r3Bomb{}) }

// r3GoexitStringer is a panic value whose String ends the calling goroutine.
type r3GoexitStringer struct{}

func (r3GoexitStringer) String() string { runtime.Goexit(); return "" }

// The frozen error keeps its meaning however hostile the value: a panic is
// reported as a panic (not as a runtime.Goexit that never happened), a
// returned error as a failure that was not a Goexit, and a panic's stack,
// taken before any of the value's methods ran, is logged. Here the value's
// Error panics with a value whose Error panics again: errorText and
// valueText recover the first panic and then format the recovered value with
// %v, which runs the consumer's code again, unguarded, and panics out of
// freeze; freezeAside then falls back to its Goexit text with no stack.
func TestReview3HostilePanicValueKeepsMeaning(t *testing.T) {
	for name, c := range map[string]struct {
		fail      func() error
		panicked  bool   // the consumer panicked: a stack must be logged
		lastError string // the Death's LastError must contain it
	}{
		"panic with a self-panicking error": {func() error { panic(r3Bomb{}) }, true, "panic"},
		"returns a self-panicking error":    {func() error { return r3Bomb{} }, false, "r3Bomb"},
		"panic value's String calls Goexit": {func() error { panic(r3GoexitStringer{}) }, true, "Goexit"},
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
			st := r2Settled(t, m, "q", 1)
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
			}, r2Short, time.Millisecond)
			require.True(t, logged, "the dead-lettering was not logged")
			if c.panicked {
				assert.Contains(t, stack, "TestReview3HostilePanicValueKeepsMeaning",
					"the stack of the consumer's panic is not logged (LastError %q)", text)
			}
		})
	}
}

// r3NilErr is an error type whose methods dereference the receiver.
type r3NilErr struct{ msg string }

func (e *r3NilErr) Error() string { return e.msg }

// Edge forms of errors and panics: each failure is settled and counted once,
// retried or not as its chain says, and the Death's LastError says what
// happened.
func TestReview3EdgeErrorsSettle(t *testing.T) {
	var typedNil *r3NilErr
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
		"Join(Permanent, self-panicking)":  {func() error { return errors.Join(tinymq.Permanent(errors.New("p")), r3Bomb{}) }, 1, ""},
		"Permanent wrapping panic(string)": {func() error { return tinymq.Permanent(&tinymq.PanicError{Value: "s"}) }, 1, "s"},
	} {
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
			st := r2Settled(t, m, "q", uint64(c.attempts))
			assert.Equal(t, c.attempts, d.Deaths[0].Attempts)
			assert.Equal(t, uint64(c.attempts), st.Failed, "%+v", st)
			assert.Equal(t, uint64(c.attempts-1), st.Retried, "%+v", st)
			assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped, "%+v", st)
			assert.NotEmpty(t, d.Deaths[0].LastError)
			assert.Contains(t, d.Deaths[0].LastError, c.lastError)
		})
	}
}
