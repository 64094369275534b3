package tinymqwatermill_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startMQ returns a running MQ that the test's cleanup stops.
func startMQ(t *testing.T, opts ...tinymq.Option) *tinymq.MQ {
	t.Helper()
	mq := tinymq.New(opts...)
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(mq.Stop)
	return mq
}
