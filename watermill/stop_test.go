package tinymqwatermill_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// These tests prove that no state of a subscription makes MQ.Stop hang, and
// that what Stop cannot deliver is dropped with ErrNoSubscriber and counted.

func TestStopDropsWhatNoSubscriptionTakes(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")
	require.NoError(t, pub.Publish("t", msg("1"), msg("2"), msg("3")))
	receive(t, ch).Ack()
	require.NoError(t, sub.Close()) // 2 and 3 wait for the group

	stopWithin(t, mq)
	q := mq.Stats().Queues[tinymqwatermill.QueueName("t", "g")]
	assert.Equal(t, uint64(1), q.Succeeded)
	assert.Equal(t, uint64(2), q.Dropped)
}

func TestStopDeliversToAttachedSubscriptions(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")
	require.NoError(t, pub.Publish("t", msg("1"), msg("2"), msg("3")))

	stopped := make(chan struct{})
	go func() {
		mq.Stop()
		close(stopped)
	}()
	for _, want := range []string{"1", "2", "3"} {
		m := receive(t, ch)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatal("MQ.Stop hangs")
	}
	assert.Equal(t, uint64(3), mq.Stats().Queues[tinymqwatermill.QueueName("t", "g")].Succeeded)
}

func TestStopWithUnreadSubscription(t *testing.T) {
	for _, group := range []string{"g", ""} {
		t.Run("group="+group, func(t *testing.T) {
			mq := startMQ(t)
			pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
			sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: group})
			ch := subscribe(t, sub, "t")
			require.NoError(t, pub.Publish("t", msg("1"), msg("2")))

			stopWithin(t, mq) // nobody reads ch
			assert.Equal(t, uint64(2), mq.Stats().Queues[tinymqwatermill.QueueName("t", group)].Dropped)
			require.NoError(t, sub.Close())
			requireClosed(t, ch)
		})
	}
}

func TestStopWithSubscriptionThatAlwaysNacks(t *testing.T) {
	for _, group := range []string{"g", ""} {
		t.Run("group="+group, func(t *testing.T) {
			mq := startMQ(t)
			pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
			sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: group})
			ch := subscribe(t, sub, "t")
			nacked := make(chan struct{})
			go func() {
				defer close(nacked)
				for m := range ch {
					m.Nack()
				}
			}()
			require.NoError(t, pub.Publish("t", msg("1")))

			stopWithin(t, mq)
			assert.Equal(t, uint64(1), mq.Stats().Queues[tinymqwatermill.QueueName("t", group)].Dropped)
			require.NoError(t, sub.Close())
			<-nacked
		})
	}
}

func TestStopWaitsForAHandlerShutdownCancelsIt(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")
	require.NoError(t, pub.Publish("t", msg("1")))
	held := receive(t, ch)

	ctx, cancel := context.WithTimeout(context.Background(), quiet)
	defer cancel()
	err := mq.Shutdown(ctx)
	require.ErrorIs(t, err, tinymq.ErrUndelivered, "the handler holds the message")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	select {
	case <-held.Context().Done():
	case <-time.After(wait):
		t.Fatal("Shutdown did not cancel the held message's context")
	}
	stopWithin(t, mq)
	require.NoError(t, sub.Close())
	requireClosed(t, ch)
}

func TestStopReportsNoSubscriber(t *testing.T) {
	rec := &recorder{}
	mq := startMQ(t, tinymq.WithLogger(rec.logger()))
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	require.NoError(t, sub.SubscribeInitialize("t"))
	m := msg("1")
	require.NoError(t, pub.Publish("t", m))

	stopWithin(t, mq)
	errs := rec.errors()
	require.NotEmpty(t, errs)
	assert.Contains(t, errs[0], tinymqwatermill.ErrNoSubscriber.Error())
	assert.Contains(t, errs[0], m.UUID)
}
