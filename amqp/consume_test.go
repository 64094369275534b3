package amqp_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// brokerPrefetches returns the prefetch_count of each consumer of queue, as
// the broker has it (rabbitmqctl list_consumers).
func brokerPrefetches(t *testing.T, queue string) []int {
	t.Helper()
	out, err := broker(t).Ctl(context.Background(), "list_consumers", "-q", "--no-table-headers", "queue_name", "prefetch_count")
	require.NoError(t, err, out)
	var got []int
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(l), "\t")
		if len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			require.NoError(t, err, l)
			got = append(got, n)
		}
	}
	return got
}

// TestQueuePrefetchIsTheBrokersQoS: WithQueuePrefetch sets the basic.qos of
// one queue's consumers (its RegisterQueue consumer and its Consume
// subscriptions); the other queues keep their concurrency (or WithPrefetch).
// A concurrency above it is refused.
func TestQueuePrefetchIsTheBrokersQoS(t *testing.T) {
	n := uniq(t)
	m := newMQ(t, amqp.WithQueuePrefetch(n("a"), 7), amqp.WithQueuePrefetch(n("c"), 4))
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, nop, 2, tinymq.WithQueueName(n("a"))))
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, nop, 3, tinymq.WithQueueName(n("b"))))
	assert.ErrorIs(t, m.RegisterQueue(n("ex"), tinymq.Fanout, nop, 5, tinymq.WithQueueName(n("c"))), tinymq.ErrInvalidOption)
	_, err := m.Consume(n("a"), nop, 8)
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	_, err = m.Consume(n("a"), nop, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	var a, b []int
	waitFor(t, "both queues' consumers are on the broker", func() bool {
		a, b = brokerPrefetches(t, n("a")), brokerPrefetches(t, n("b"))
		return len(a) == 2 && len(b) == 1
	})
	assert.Equal(t, []int{7, 7}, a, "WithQueuePrefetch")
	assert.Equal(t, []int{3}, b, "the queue's concurrency")

	bad := tinymq.New(amqp.Engine(broker(t).URL(), amqp.WithQueuePrefetch("", 3)))
	defer bad.Stop()
	assert.ErrorIs(t, bad.DeclareExchange(n("x"), tinymq.Fanout), tinymq.ErrInvalidOption)
}

// TestConsumerChannelCallsAreBoundedWhenTheBrokerHoldsItsReplies: a broker
// that stops answering on the consuming connection (its TCP connection up,
// its replies held back) cannot hold a Subscription.Cancel, a PauseQueue or
// a Shutdown waiting for its basic.cancel-ok or channel.close-ok: after a
// bounded wait the engine closes the consuming connection, and consumes
// again on a new one.
func TestConsumerChannelCallsAreBoundedWhenTheBrokerHoldsItsReplies(t *testing.T) {
	n := uniq(t)
	p, err := broker(t).Proxy()
	require.NoError(t, err)
	defer p.Close()
	// Heartbeats a minute apart, and a long publish timeout: without the
	// bound, every wait below would last well past the test's limits.
	m := tinymq.New(amqp.Engine(p.URL(), amqp.WithPublishTimeout(30*time.Second),
		amqp.WithReconnectBackoff(20*time.Millisecond, 200*time.Millisecond),
		amqp.WithAMQPConfig(amqp091.Config{Heartbeat: time.Minute})), tinymq.WithLogger(logger()))
	defer m.Stop()
	consume, got := collect()
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, consume, 1, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m.DeclareQueue(n("q2"), n("ex2"), tinymq.Fanout))
	sub, err := m.Consume(n("q2"), nop, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))

	// consuming waits until q is consumed, on a connection the proxy does
	// not hold, and returns the consuming connection's number: the engine
	// dials its publishing connection, then its consuming one.
	consuming := func(what string) int {
		t.Helper()
		require.NoError(t, m.Publish(n("ex"), what))
		receive(t, got, what)
		return p.Conns() - 1
	}
	const bound = 10 * time.Second // about 2 s for the reply, 2 s for the close handshake

	held := consuming("before Cancel")
	require.True(t, p.HoldConn(held))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	assert.NoError(t, sub.Cancel(ctx), "Cancel")
	assert.Less(t, time.Since(start), bound, "Cancel")

	held2 := consuming("before PauseQueue")
	require.Greater(t, held2, held, "a new consuming connection")
	require.True(t, p.HoldConn(held2))
	start = time.Now()
	assert.NoError(t, m.PauseQueue(n("q")), "PauseQueue")
	assert.Less(t, time.Since(start), bound, "PauseQueue")
	require.NoError(t, m.ResumeQueue(n("q")))

	held3 := consuming("before Shutdown")
	require.Greater(t, held3, held2, "a new consuming connection")
	require.True(t, p.HoldConn(held3))
	start = time.Now()
	assert.NoError(t, m.Shutdown(ctx), "Shutdown")
	assert.Less(t, time.Since(start), bound, "Shutdown")
}
