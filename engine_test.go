package tinymq_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// An MQ on an engine keeps no log: the broker keeps the messages. What would
// be silently unused there is refused: WithDurable at the queue, WithDataDir
// at Start.
func TestEngineRefusesDurableQueuesAndADataDir(t *testing.T) {
	e := &hEngine{specs: map[string]tinymq.QueueSpec{}}
	m := tinymq.New(tinymq.WithEngine(e))
	err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable())
	require.ErrorIs(t, err, tinymq.ErrUnsupported)
	require.ErrorIs(t, m.DeclareQueue("d", "ev", tinymq.Fanout, tinymq.WithDurable()), tinymq.ErrUnsupported)
	assert.Empty(t, e.specs, "nothing was declared on the engine")
	require.NoError(t, m.Start(context.Background()))
	m.Stop()

	withDir := tinymq.New(tinymq.WithEngine(&hEngine{specs: map[string]tinymq.QueueSpec{}}), tinymq.WithDataDir(t.TempDir()))
	require.ErrorIs(t, withDir.Start(context.Background()), tinymq.ErrUnsupported)
	withDir.Stop()
}

// An Engine serves one MQ: a second MQ given the same one fails every call,
// and the first goes on as before; once the first has shut down, the Engine
// is free again.
func TestEngineServingAnotherMQIsRefused(t *testing.T) {
	e := &hEngine{specs: map[string]tinymq.QueueSpec{}}
	first := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))

	second := tinymq.New(tinymq.WithEngine(e))
	require.ErrorIs(t, second.DeclareQueue("b", "ev", tinymq.Fanout), tinymq.ErrInvalidOption)
	require.ErrorIs(t, second.Publish("ev", "x"), tinymq.ErrInvalidOption)
	require.ErrorIs(t, second.Start(context.Background()), tinymq.ErrInvalidOption)
	second.Stop()
	assert.NotContains(t, e.specs, "b", "the second MQ reached nothing")

	require.NoError(t, first.DeclareQueue("c", "ev", tinymq.Fanout), "the first MQ is unaffected")
	require.NoError(t, first.Start(context.Background()))
	require.NoError(t, first.Publish("ev", "y"))
	first.Stop()

	third := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, third.DeclareQueue("d", "ev", tinymq.Fanout), "free once the first shut down")
	third.Stop()
}
