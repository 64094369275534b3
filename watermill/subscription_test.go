package tinymqwatermill_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// These tests prove what closing a subscription does: its TinyMQ consumer is
// cancelled, and nothing it had not acked is lost.

// A group subscription closed while it holds a message, and opened again,
// gets that message first, then the ones published while it was closed, in
// order; meanwhile the group's queue has no consumer and keeps them.
func TestSubscriptionClosedAndReopenedGetsWhatWasPublishedMeanwhile(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	queue := tinymqwatermill.QueueName("t", "g")

	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", msg("1"), msg("2")))
	receive(t, ch).Ack()
	held := receive(t, ch) // 2, not acked
	cancel()
	requireClosed(t, ch)

	q := mq.Stats().Queues[queue]
	assert.Equal(t, 0, q.Consumers, "the subscription's TinyMQ consumer is cancelled")
	assert.Equal(t, 1, q.InFlight, "2 waits in its consumer call for the next subscription")
	require.NoError(t, pub.Publish("t", msg("3"), msg("4")))
	assert.Equal(t, 2, mq.Stats().Queues[queue].Depth, "3 and 4 wait in the queue")
	held.Ack() // too late: ignored

	ch = subscribe(t, sub, "t")
	for _, want := range []string{"2", "3", "4"} {
		m := receive(t, ch)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
	requireNothing(t, ch)
	q = mq.Stats().Queues[queue]
	assert.Equal(t, uint64(4), q.Succeeded)
	assert.Zero(t, q.Failed)
	assert.Equal(t, 1, q.Consumers)
}

// Closing one of two subscriptions of a group, from two Subscribers, leaves
// the other every message: the one the closed subscription held, then the
// rest, in order.
func TestClosingOneOfTwoGroupSubscriptionsLeavesTheOtherEverything(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	first := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	second := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})

	a := subscribe(t, first, "t")
	const n = 10
	for i := range n {
		require.NoError(t, pub.Publish("t", msg(fmt.Sprint(i))))
	}
	held := receive(t, a) // 0: with Concurrency 1, b gets nothing while a holds it
	b := subscribe(t, second, "t")
	requireNothing(t, b)
	require.NoError(t, first.Close())
	requireClosed(t, a)
	held.Ack() // too late: ignored

	for i := range n {
		m := receive(t, b)
		assert.Equal(t, fmt.Sprint(i), string(m.Payload))
		m.Ack()
	}
	requireNothing(t, b)
	q := mq.Stats().Queues[tinymqwatermill.QueueName("t", "g")]
	assert.Equal(t, uint64(n), q.Succeeded)
	assert.Equal(t, 1, q.Consumers, "the group keeps its consumer while a subscription is open")
}

// Subscriptions of a group opened and closed while messages are published,
// some closing with a message unacked, lose none: every message is acked by
// one of them. Run under -race, this also proves that no consumer call sends
// to a closed channel; goleak, that no goroutine is left.
func TestClosingSubscriptionsWhileMessagesFlowLosesNothing(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	require.NoError(t, newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"}).SubscribeInitialize("t"))

	const n = 200
	published := make(chan error, 1)
	go func() {
		for i := range n {
			if err := pub.Publish("t", msg(fmt.Sprint(i))); err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()

	acked := make(map[string]bool)
	for round := 0; len(acked) < n; round++ {
		require.Less(t, round, 4*n, "messages lost: %d of %d acked", len(acked), n)
		sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := sub.Subscribe(ctx, "t")
		require.NoError(t, err)
		for i := 0; i <= round%4 && len(acked) < n; i++ {
			m := receive(t, ch)
			if i == 2 {
				break // closes holding m
			}
			acked[string(m.Payload)] = true
			m.Ack()
		}
		if round%2 == 0 {
			cancel()
			requireClosed(t, ch)
		} else {
			require.NoError(t, sub.Close())
		}
		cancel()
	}
	require.NoError(t, <-published)
	for i := range n {
		assert.True(t, acked[fmt.Sprint(i)], "message %d never acked", i)
	}
}

// A broadcast subscription has a queue of its own: one that does not read
// holds back no other, and closing it deletes its queue, counting the
// messages it had not acked as removed.
func TestBroadcastSubscriptionHasItsOwnQueue(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := sub.Subscribe(ctx, "news")
	require.NoError(t, err)
	fast := subscribe(t, sub, "news")
	require.Len(t, broadcastQueues(mq, "news"), 2)

	require.NoError(t, pub.Publish("news", msg("1"), msg("2")))
	for _, want := range []string{"1", "2"} {
		m := receive(t, fast)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
	cancel()
	requireClosed(t, slow)
	require.Len(t, broadcastQueues(mq, "news"), 1)
	stats := mq.Stats()
	assert.Equal(t, uint64(1), stats.DeletedQueues)
	assert.Equal(t, uint64(2), stats.Deleted.Removed, "1, in its consumer call, and 2, waiting")
}

// A Subscriber can close while its subscriptions' consumers hold messages,
// before and after the MQ stops, as often as it likes.
func TestCloseCancelsEveryConsumer(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	group := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	broadcast := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{})
	chans := []<-chan *message.Message{subscribe(t, group, "t"), subscribe(t, group, "u"), subscribe(t, broadcast, "t")}
	require.NoError(t, pub.Publish("t", msg("1")))
	require.NoError(t, pub.Publish("u", msg("1")))

	require.NoError(t, group.Close())
	require.NoError(t, broadcast.Close())
	for _, ch := range chans {
		requireClosed(t, ch)
	}
	for _, q := range mq.Topology().Queues {
		assert.Zero(t, q.Consumers, "queue %s", q.Name)
	}
	stopWithin(t, mq)
	require.NoError(t, group.Close())
	require.NoError(t, broadcast.Close())
	_, err := group.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, tinymqwatermill.ErrClosed)
	assert.Empty(t, broadcastQueues(mq, "t"))
	assert.Equal(t, uint64(1), mq.Stats().Deleted.Removed, "the broadcast copy of t's message")
}
