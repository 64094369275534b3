package tinymq_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// An MQ option cannot return an error, so an invalid one makes the calls
// that need it fail: a negative sync interval fails Start, and the
// RegisterQueue that would open the log, instead of being clamped to 0.
func TestNegativeSyncIntervalIsRefused(t *testing.T) {
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(-1))
	assert.ErrorIs(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithDurable()), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrInvalidOption)
	m.Stop()
	m = tinymq.New(tinymq.WithSync(-1)) // no data directory: still a mistake
	assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrInvalidOption)
	m.Stop()
	m = tinymq.New(tinymq.WithDataDir(t.TempDir()), tinymq.WithSync(0))
	require.NoError(t, m.Start(context.Background()))
	m.Stop()
}
