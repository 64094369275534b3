package tinymqwatermill_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// These tests prove that no state of a subscription makes MQ.Stop hang, and
// that what Stop cannot deliver is counted and logged: left in a group's
// queue that no subscription consumes (undelivered), or given up by a
// consumer call with ErrNoSubscriber (dropped).

// A group without an open subscription has no TinyMQ consumer: Stop leaves
// its waiting messages in the queue, undelivered; only the message a closed
// subscription held, which its consumer call keeps for the group's next
// subscription, is dropped.
func TestStopLeavesAGroupsMessagesInItsQueue(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")
	require.NoError(t, pub.Publish("t", msg("1"), msg("2"), msg("3")))
	receive(t, ch).Ack()
	receive(t, ch) // 2, held
	require.NoError(t, sub.Close())

	stopWithin(t, mq)
	q := mq.Stats().Queues[tinymqwatermill.QueueName("t", "g")]
	assert.Equal(t, uint64(1), q.Succeeded)
	assert.Equal(t, uint64(1), q.Dropped, "2, held by the closed subscription's consumer call")
	assert.Equal(t, uint64(1), q.Undelivered, "3, waiting in the queue")
	assert.Equal(t, 0, q.Consumers)
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
			assert.Equal(t, uint64(2), queueStats(t, mq, "t", group).Dropped)
			require.NoError(t, sub.Close())
			requireClosed(t, ch)
		})
	}
}

// Without Retry a nacked message is dropped with ErrNoSubscriber once the MQ
// stops; with Retry, Stop waits for its attempts, and the last one drops it
// for want of a dead-letter topic.
func TestStopWithSubscriptionThatAlwaysNacks(t *testing.T) {
	for _, tc := range []struct {
		group string
		retry *tinymq.RetryPolicy
	}{
		{"g", nil}, {"", nil},
		{"g", &tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}},
		{"", &tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}},
	} {
		t.Run(fmt.Sprintf("group=%s,retry=%t", tc.group, tc.retry != nil), func(t *testing.T) {
			mq := startMQ(t, quietLogger())
			pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
			sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: tc.group, Retry: tc.retry})
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
			assert.Equal(t, uint64(1), queueStats(t, mq, "t", tc.group).Dropped)
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

// A message that a subscription left unread is dropped with ErrNoSubscriber,
// and the log names it; what waits in a group's queue with no subscription
// is logged as not delivered, with the queue's name.
func TestStopLogsWhatItCannotDeliver(t *testing.T) {
	rec := &recorder{}
	mq := startMQ(t, tinymq.WithLogger(rec.logger()))
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	reader := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "unread"})
	subscribe(t, reader, "t")
	waiting := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "none"})
	require.NoError(t, waiting.SubscribeInitialize("t"))
	m := msg("1")
	require.NoError(t, pub.Publish("t", m))

	stopWithin(t, mq)
	errs := rec.errors()
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], tinymqwatermill.ErrNoSubscriber.Error())
	assert.Contains(t, errs[0], m.UUID)
	assert.Contains(t, rec.queues("not delivered"), tinymqwatermill.QueueName("t", "none"))
	assert.Equal(t, uint64(1), mq.Stats().Queues[tinymqwatermill.QueueName("t", "none")].Undelivered)
}

// queueStats returns the stats of topic's queue for group, or, without a
// group, of the topic's only broadcast subscription's queue.
func queueStats(t *testing.T, mq *tinymq.MQ, topic, group string) tinymq.QueueStats {
	t.Helper()
	if group != "" {
		return mq.Stats().Queues[tinymqwatermill.QueueName(topic, group)]
	}
	qs := broadcastQueues(mq, topic)
	require.Len(t, qs, 1, "broadcast queues of %q", topic)
	for _, q := range qs {
		return q
	}
	return tinymq.QueueStats{}
}

// broadcastQueues returns the stats of the queues of topic's broadcast
// subscriptions, by name.
func broadcastQueues(mq *tinymq.MQ, topic string) map[string]tinymq.QueueStats {
	prefix := tinymqwatermill.QueueName(topic, "") + " #"
	qs := make(map[string]tinymq.QueueStats)
	for name, q := range mq.Stats().Queues {
		if strings.HasPrefix(name, prefix) {
			qs[name] = q
		}
	}
	return qs
}
