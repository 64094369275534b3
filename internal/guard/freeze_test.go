package guard_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq/internal/guard"
)

var (
	errTypedNil  = errors.New("typed nil")
	errPermanent = errors.New("permanent")
	errPanicked  = errors.New("panicked")
)

// panicError plays the part of tinymq.PanicError.
type panicError struct {
	Value any
	Stack []byte
}

func (e *panicError) Error() string        { return fmt.Sprintf("panic: %v", e.Value) }
func (e *panicError) Is(target error) bool { return target == errPanicked }
func (e *panicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

var freezer = guard.Freezer[*panicError]{
	TypedNil:  errTypedNil,
	Permanent: errPermanent,
	Panicked:  errPanicked,
	Unpack:    func(p *panicError) (any, []byte) { return p.Value, p.Stack },
	Pack:      func(text string, stack []byte) *panicError { return &panicError{Value: text, Stack: stack} },
}

// counting is an error that counts the calls of its methods: consumer code.
type counting struct {
	calls     *atomic.Int32
	permanent bool
}

func (e counting) Error() string { e.calls.Add(1); return "counting" }
func (e counting) Is(target error) bool {
	e.calls.Add(1)
	return e.permanent && target == errPermanent
}

// stringer is a panic value whose String runs fn.
type stringer struct{ fn func() string }

func (s stringer) String() string { return s.fn() }

func TestFreezeAsksTheErrorOnce(t *testing.T) {
	for _, permanent := range []bool{false, true} {
		var calls atomic.Int32
		err := freezer.Freeze(counting{calls: &calls, permanent: permanent})
		asked := calls.Load()
		assert.Equal(t, "counting", err.Error())
		assert.Equal(t, permanent, errors.Is(err, errPermanent))
		assert.False(t, errors.Is(err, errPanicked))
		_ = errors.Unwrap(err)
		assert.Equal(t, asked, calls.Load(), "the frozen error's methods ran the consumer's code")
	}
}

func TestFreezeTurnsATypedNilIntoTypedNil(t *testing.T) {
	var nilPtr *ptrError
	err := freezer.Freeze(nilPtr)
	assert.ErrorIs(t, err, errTypedNil)
	assert.Equal(t, "typed nil: the consumer returned a nil *guard_test.ptrError", err.Error())
	assert.NoError(t, freezer.Freeze(nil))
}

func TestFreezeKeepsAPanicAsItsText(t *testing.T) {
	calls := 0
	value := stringer{fn: func() string { calls++; return "the value" }}
	err := freezer.Freeze(fmt.Errorf("wrapped: %w", &panicError{Value: value, Stack: []byte("stack")}))
	asked := calls
	assert.Equal(t, "wrapped: panic: the value", err.Error())
	pe, ok := guard.As[*panicError](err)
	require.True(t, ok)
	assert.Equal(t, "the value", pe.Value, "the copy holds the value's text")
	assert.Equal(t, []byte("stack"), pe.Stack)
	assert.ErrorIs(t, err, errPanicked)
	assert.Equal(t, asked, calls, "reading the frozen error ran the value's methods")

	var nilPE *panicError
	err = freezer.Freeze(fmt.Errorf("w: %w", errors.Join(errPanicked, nilPE)))
	_, ok = guard.As[*panicError](err)
	assert.False(t, ok, "a typed nil panic error is not copied")
}

func TestFreezeAsideContainsTheValuesMethods(t *testing.T) {
	for name, c := range map[string]struct {
		value     any
		wantText  string
		wantValue string
	}{
		"plain value":    {"boom", "panic: boom", "boom"},
		"self-panicking": {bomb{}, "*guard_test.panicError (its Error method panicked with a guard_test.bomb)", "guard_test.bomb (its methods panicked with a guard_test.bomb)"},
		"String panics": {stringer{fn: func() string { panic("in String") }},
			"panic: %!v(PANIC=String method: in String)", "%!v(PANIC=String method: in String)"},
		"String calls Goexit": {stringer{fn: func() string { runtime.Goexit(); return "" }},
			"tinymq: panic (its value's methods called runtime.Goexit)", "(a value whose methods called runtime.Goexit)"},
	} {
		t.Run(name, func(t *testing.T) {
			var o guard.Owned
			err := freezer.FreezeAside(&o, &panicError{Value: c.value, Stack: []byte("stack")})
			assert.Equal(t, c.wantText, err.Error())
			pe, ok := guard.As[*panicError](err)
			require.True(t, ok, "a panic stays a panic")
			assert.Equal(t, c.wantValue, pe.Value)
			assert.Equal(t, []byte("stack"), pe.Stack, "the stack is kept")
			assert.False(t, strings.Contains(err.Error(), "Goexit") && !strings.Contains(name, "Goexit"))
		})
	}
}

func TestFreezeAsideRunsTheValueAsOwned(t *testing.T) {
	var o guard.Owned
	var mine bool
	value := stringer{fn: func() string { mine = o.Mine(); return "v" }}
	_ = freezer.FreezeAside(&o, &panicError{Value: value})
	assert.True(t, mine, "a Stop called from the value's methods must know it is the engine's")
}
