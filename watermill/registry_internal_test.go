package tinymqwatermill

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

func registryCount() int {
	registries.mu.Lock()
	defer registries.mu.Unlock()
	return len(registries.m)
}

// The registry of an MQ goes when the MQ is garbage collected: it does not
// keep the MQ alive.
func TestRegistryGoesWithItsMQ(t *testing.T) {
	before := registryCount()
	func() {
		mq := tinymq.New()
		require.NoError(t, mq.Start(context.Background()))
		sub, err := NewSubscriber(mq, SubscriberConfig{ConsumerGroup: "g"})
		require.NoError(t, err)
		require.NoError(t, sub.SubscribeInitialize("t"))
		require.NoError(t, sub.Close())
		mq.Stop()
		require.Equal(t, before+1, registryCount())
	}()
	require.Eventually(t, func() bool {
		runtime.GC()
		return registryCount() <= before
	}, 5*time.Second, 10*time.Millisecond)
}
