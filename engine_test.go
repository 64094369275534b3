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
