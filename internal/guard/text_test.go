package guard_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tinymq/tinymq/internal/guard"
)

type ptrError struct{ msg string }

func (e *ptrError) Error() string { return e.msg }

type mapError map[string]int

func (mapError) Error() string { return "map" }

// bomb panics with itself: fmt gives up on nested panics and panics again,
// so formatting it panics whatever guard fmt has.
type bomb struct{}

func (bomb) Error() string  { panic(bomb{}) }
func (bomb) String() string { panic(bomb{}) }

type panicky struct{}

func (panicky) Error() string                { panic("Error") }
func (panicky) Is(error) bool                { panic("Is") }
func (panicky) As(any) bool                  { panic("As") }
func (panicky) Unwrap() error                { panic("Unwrap") }
func (panicky) Format(fmt.State, rune)       { panic("Format") }
func (panicky) GoString() string             { panic("GoString") }
func (panicky) MarshalText() ([]byte, error) { panic("MarshalText") }

func TestIsNilFindsTypedNils(t *testing.T) {
	var nilPtr *ptrError
	var nilMap mapError
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"nil interface":   {nil, false},
		"typed nil ptr":   {nilPtr, true},
		"typed nil map":   {nilMap, true},
		"non-nil pointer": {&ptrError{"x"}, false},
		"non-nil map":     {mapError{}, false},
		"value type":      {bomb{}, false},
	} {
		assert.Equal(t, c.want, guard.IsNil(c.err), name)
	}
}

func TestErrorTextSurvivesPanickingErrors(t *testing.T) {
	var nilPtr *ptrError
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"nil":             {nil, ""},
		"plain":           {errors.New("plain"), "plain"},
		"typed nil":       {nilPtr, "*guard_test.ptrError (its Error method panicked with a runtime.errorString)"},
		"panicking Error": {panicky{}, "guard_test.panicky (its Error method panicked with a string)"},
		"self-panicking":  {bomb{}, "guard_test.bomb (its Error method panicked with a guard_test.bomb)"},
	} {
		assert.Equal(t, c.want, guard.ErrorText(c.err), name)
	}
}

func TestValueTextSurvivesPanickingValues(t *testing.T) {
	for name, c := range map[string]struct {
		v    any
		want string
	}{
		"nil":    {nil, "<nil>"},
		"string": {"boom", "boom"},
		"int":    {42, "42"},
		// fmt recovers a single panic itself, and says so.
		"panicking Format": {panicky{}, "%!v(PANIC=Format method: Format)"},
		"self-panicking":   {bomb{}, "guard_test.bomb (its methods panicked with a guard_test.bomb)"},
	} {
		assert.Equal(t, c.want, guard.ValueText(c.v), name)
	}
}

func TestIsAndAsCountAPanicAsNoMatch(t *testing.T) {
	target := errors.New("target")
	wrapped := fmt.Errorf("wrapped: %w", target)
	assert.True(t, guard.Is(wrapped, target))
	assert.False(t, guard.Is(errors.New("other"), target))
	assert.False(t, guard.Is(panicky{}, target), "a panicking Is is no match")

	pe := &ptrError{"inner"}
	got, ok := guard.As[*ptrError](fmt.Errorf("w: %w", pe))
	assert.True(t, ok)
	assert.Same(t, pe, got)
	got, ok = guard.As[*ptrError](errors.New("other"))
	assert.False(t, ok)
	assert.Nil(t, got)
	got, ok = guard.As[*ptrError](panicky{})
	assert.False(t, ok, "a panicking As is no match")
	assert.Nil(t, got)
	var nilPtr *ptrError
	got, ok = guard.As[*ptrError](fmt.Errorf("w: %w", nilPtr))
	assert.True(t, ok, "a typed nil in the chain is found")
	assert.Nil(t, got)
}
