package tinymq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

func TestHandlerIsTyped(t *testing.T) {
	got := make(chan UserCreated, 1)
	m := tinymq.New()
	dead := deadLetters(t, m)
	require.NoError(t, m.RegisterQueue("users", tinymq.Fanout, tinymq.Handler(func(_ context.Context, u UserCreated) error {
		got <- u
		return nil
	}), 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond}), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("users", UserCreated{ID: 7, Email: "a@b.c"}))
	require.NoError(t, m.Publish("users", "not a user"))
	m.Stop()
	require.Len(t, got, 1)
	require.Len(t, dead, 1)
	assert.Equal(t, UserCreated{ID: 7, Email: "a@b.c"}, <-got)
	d := <-dead
	assert.Equal(t, "not a user", d.Data)
	assert.Equal(t, 1, d.Deaths[0].Attempts, "a payload of the wrong type is not retried")
	assert.Contains(t, d.Deaths[0].LastError, "got string, want tinymq_test.UserCreated")

	var nilFn func(context.Context, int) error
	assert.ErrorIs(t, tinymq.New().RegisterQueue("x", tinymq.Fanout, tinymq.Handler(nilFn), 1), tinymq.ErrNilConsumer)

	err := tinymq.Handler(func(context.Context, int) error { return nil })(context.Background(), &tinymq.Msg{Data: "x"})
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)
}
