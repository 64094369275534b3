package guard_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq/internal/guard"
)

func TestGoidIsPerGoroutine(t *testing.T) {
	mine := guard.Goid()
	require.NotZero(t, mine)
	assert.Equal(t, mine, guard.Goid(), "the same goroutine, the same id")
	other := make(chan uint64)
	go func() { other <- guard.Goid() }()
	assert.NotEqual(t, mine, <-other)
}

func TestOwnedHoldsTheGoroutinesThatEntered(t *testing.T) {
	var o guard.Owned
	assert.False(t, o.Mine(), "the zero Owned is empty")
	id := o.Enter()
	assert.Equal(t, guard.Goid(), id)
	assert.True(t, o.Mine())
	other := make(chan bool)
	go func() { other <- o.Mine() }()
	assert.False(t, <-other, "another goroutine is not in the set")
	o.Leave(id)
	assert.False(t, o.Mine())
}

func TestGuardContainsUserCode(t *testing.T) {
	var o guard.Owned
	for name, c := range map[string]struct {
		fn           func()
		wantPanic    any
		wantReturned bool
	}{
		"returns": {fn: func() {}, wantReturned: true},
		"panics":  {fn: func() { panic("boom") }, wantPanic: "boom"},
		"Goexit":  {fn: runtime.Goexit},
	} {
		t.Run(name, func(t *testing.T) {
			p, returned := o.Guard(c.fn)
			assert.Equal(t, c.wantPanic, p)
			assert.Equal(t, c.wantReturned, returned)
			assert.False(t, o.Mine(), "the caller was not added")
		})
	}
}

func TestGuardRunsFnAsOwned(t *testing.T) {
	var o guard.Owned
	var inside bool
	var id uint64
	_, returned := o.Guard(func() { inside, id = o.Mine(), guard.Goid() })
	require.True(t, returned)
	assert.True(t, inside, "fn runs on a goroutine of the set")
	assert.NotEqual(t, guard.Goid(), id, "fn runs on a goroutine of its own")
	done := make(chan bool)
	go func() { done <- o.Mine() }()
	assert.False(t, <-done, "the guard's goroutine left the set")
}
