package tinymq_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

type topoOrder struct{ ID int }

// topoQueue is the QueueInfo of queue in m's Topology, or fails the test.
func topoQueue(t *testing.T, m *tinymq.MQ, queue string) tinymq.QueueInfo {
	t.Helper()
	qs := m.Topology().Queues
	i := slices.IndexFunc(qs, func(qi tinymq.QueueInfo) bool { return qi.Name == queue })
	require.GreaterOrEqual(t, i, 0, "queue %q in the Topology", queue)
	return qs[i]
}

// topoExchange is the ExchangeInfo of exchange in m's Topology, or fails the
// test.
func topoExchange(t *testing.T, m *tinymq.MQ, exchange string) tinymq.ExchangeInfo {
	t.Helper()
	xs := m.Topology().Exchanges
	i := slices.IndexFunc(xs, func(x tinymq.ExchangeInfo) bool { return x.Name == exchange })
	require.GreaterOrEqual(t, i, 0, "exchange %q in the Topology", exchange)
	return xs[i]
}

func topoNop(context.Context, *tinymq.Msg) error { return nil }

// Topology shows the job-queue settings of each queue (delivery timeout,
// rate limit, group ordering) and each exchange's deduplication window, and
// zeros where they were not asked for.
func TestTopologyShowsJobQueueSettings(t *testing.T) {
	m := tinymq.New(quiet())
	t.Cleanup(m.Stop)
	require.NoError(t, m.DeclareExchange("once", tinymq.Fanout, tinymq.WithDeduplication(90*time.Second)))
	require.NoError(t, m.RegisterQueue("once", tinymq.Fanout, topoNop, 2, tinymq.WithQueueName("jobs"),
		tinymq.WithDeliveryTimeout(3*time.Second), tinymq.WithRateLimit(12.5, 4), tinymq.WithGroupOrdering()))
	require.NoError(t, m.RegisterQueue("plain", tinymq.Fanout, topoNop, 1, tinymq.WithQueueName("plain")))

	for _, tc := range []struct {
		queue string
		want  tinymq.QueueInfo
	}{
		{"jobs", tinymq.QueueInfo{Name: "jobs", Concurrency: 2, MaxAttempts: 1, Consumers: 1,
			DeliveryTimeout: 3 * time.Second, RateLimit: 12.5, RateBurst: 4, GroupOrdering: true}},
		{"plain", tinymq.QueueInfo{Name: "plain", Concurrency: 1, MaxAttempts: 1, Consumers: 1}},
	} {
		assert.Equal(t, tc.want, topoQueue(t, m, tc.queue), "Topology of %s", tc.queue)
	}
	assert.Equal(t, 90*time.Second, topoExchange(t, m, "once").DeduplicationWindow, "the window of once")
	assert.Zero(t, topoExchange(t, m, "plain").DeduplicationWindow, "plain has no deduplication")
}

// Topology names the payload type of a typed queue, whichever typed consumer
// gave it that type, and keeps it once that consumer is cancelled; a queue
// of an untyped consumer, or of a consumer of any, has none.
func TestTopologyShowsThePayloadTypeOfTypedQueues(t *testing.T) {
	m := tinymq.New(quiet())
	t.Cleanup(m.Stop)
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, topoOrder) error { return nil },
		1, tinymq.WithQueueName("orders")))
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout,
		func(context.Context, tinymq.Delivery[*topoOrder]) error { return nil }, 1, tinymq.WithQueueName("pointers")))
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, any) error { return nil },
		1, tinymq.WithQueueName("anything")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, topoNop, 1, tinymq.WithQueueName("untyped")))
	require.NoError(t, m.DeclareQueue("bytes", "raw", tinymq.Fanout))
	assert.Empty(t, topoQueue(t, m, "bytes").PayloadType, "declared, with no consumer yet")
	sub, err := tinymq.ConsumeHandler(m, "bytes", func(context.Context, []byte) error { return nil }, 1)
	require.NoError(t, err)

	for queue, want := range map[string]string{
		"orders":   "tinymq_test.topoOrder",
		"pointers": "*tinymq_test.topoOrder",
		"anything": "",
		"untyped":  "",
		"bytes":    "[]uint8",
	} {
		assert.Equal(t, want, topoQueue(t, m, queue).PayloadType, "PayloadType of %s", queue)
	}
	require.NoError(t, sub.Cancel(t.Context()))
	assert.Equal(t, "[]uint8", topoQueue(t, m, "bytes").PayloadType, "the queue keeps its type")
}

// Topology reads the payload types under the MQ's lock: under -race, reading
// it while typed consumers give queues their types is no data race.
func TestTopologyReadsPayloadTypesWhileQueuesAreTyped(t *testing.T) {
	m := tinymq.New(quiet())
	t.Cleanup(m.Stop)
	const n = 20
	for i := range n {
		require.NoError(t, m.DeclareQueue(fmt.Sprintf("q%d", i), "ev", tinymq.Fanout))
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	stop := sync.OnceFunc(func() { close(done); wg.Wait() })
	defer stop()
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, qi := range m.Topology().Queues {
				if qi.PayloadType != "" && qi.PayloadType != "tinymq_test.topoOrder" {
					t.Errorf("queue %s: PayloadType %q", qi.Name, qi.PayloadType)
				}
			}
		}
	})
	for i := range n {
		_, err := tinymq.ConsumeHandler(m, fmt.Sprintf("q%d", i), func(context.Context, topoOrder) error { return nil }, 1)
		require.NoError(t, err)
	}
	stop()
	for _, qi := range m.Topology().Queues {
		assert.Equal(t, "tinymq_test.topoOrder", qi.PayloadType, "queue %s", qi.Name)
	}
}
