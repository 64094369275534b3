package tinymqwatermill_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// These tests prove that TinyMQ's retry and dead-lettering work through the
// adapter: a message a Router handler keeps failing is retried by TinyMQ,
// without holding its queue back, then published to the DeadLetterTopic, as
// are expired messages and those a full queue drops.

// quietLogger keeps the dead-lettering an MQ logs out of the test output.
func quietLogger() tinymq.Option {
	return tinymq.WithLogger(slog.New(slog.DiscardHandler))
}

// requireDeadLetter receives one message from ch, acks it, and checks that it
// is want, dead for reason after attempts deliveries in queue.
func requireDeadLetter(t *testing.T, ch <-chan *message.Message, want *message.Message, reason tinymq.DeathReason, topic, queue, attempts string) {
	t.Helper()
	got := receive(t, ch)
	got.Ack()
	assert.Equal(t, want.UUID, got.UUID)
	assert.Equal(t, string(want.Payload), string(got.Payload))
	wantMeta := message.Metadata{
		tinymqwatermill.DeathReasonKey:   string(reason),
		tinymqwatermill.DeathTopicKey:    topic,
		tinymqwatermill.DeathQueueKey:    queue,
		tinymqwatermill.DeathAttemptsKey: attempts,
	}
	for k, v := range want.Metadata {
		wantMeta[k] = v
	}
	assert.Equal(t, wantMeta, got.Metadata)
}

func TestNackedMessageIsRetriedThenDeadLettered(t *testing.T) {
	rec := &recorder{}
	mq := startMQ(t, tinymq.WithLogger(rec.logger()))
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing",
		Retry:           &tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond},
		DeadLetterTopic: "orders.dead"})
	ops := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "ops"})
	require.NoError(t, ops.SubscribeInitialize("orders.dead"))
	require.NoError(t, sub.SubscribeInitialize("orders"))
	bad, good := msg("bad"), msg("good")
	bad.Metadata.Set("k", "v")
	require.NoError(t, pub.Publish("orders", bad, good)) // both wait in the group's queue, bad first

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: wait}, watermill.NopLogger{})
	require.NoError(t, err)
	goodDone := make(chan struct{})
	var badAttempts atomic.Int32
	var heldBack atomic.Bool
	router.AddConsumerHandler("bill", "orders", sub, func(m *message.Message) error {
		if string(m.Payload) == "good" {
			close(goodDone)
			return nil
		}
		if badAttempts.Add(1) == 2 {
			// Had the Nack held the queue (an in-place redelivery does),
			// good would still wait behind this attempt.
			select {
			case <-goodDone:
			case <-time.After(wait):
				heldBack.Store(true)
			}
		}
		return errors.New("cannot bill") // the Router nacks
	})
	ran := make(chan error, 1)
	go func() { ran <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-ran)
	})

	queue := tinymqwatermill.QueueName("orders", "billing")
	requireDeadLetter(t, subscribe(t, ops, "orders.dead"), bad, tinymq.ReasonRejected, "orders", queue, "3")
	assert.False(t, heldBack.Load(), "the retried message held its queue back")
	assert.Equal(t, int32(3), badAttempts.Load(), "MaxAttempts deliveries")
	rec.await(t, "dead-lettered") // TinyMQ counts a dead letter once it is published

	stats := mq.Stats().Queues[queue]
	assert.Equal(t, uint64(1), stats.Succeeded)
	assert.Equal(t, uint64(2), stats.Retried)
	assert.Equal(t, uint64(1), stats.DeadLettered)
	dl := mq.RecentDeadLetters()
	require.Len(t, dl, 1)
	assert.Equal(t, tinymqwatermill.ErrNacked.Error(), dl[0].LastError)
	assert.Equal(t, "orders.dead", dl[0].DeadLetterExchange)
	assert.Equal(t, []string{queue, queue}, rec.queues("will retry"))
	assert.Equal(t, []string{queue}, rec.queues("dead-lettered"))
}

// A Retry policy of one attempt dead-letters a nacked message at once, also
// from a broadcast subscription's queue.
func TestNackWithOneAttemptDeadLettersAtOnce(t *testing.T) {
	mq := startMQ(t, quietLogger())
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{
		Retry: &tinymq.RetryPolicy{MaxAttempts: 1}, DeadLetterTopic: "news.dead"})
	ops := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "ops"})
	dead := subscribe(t, ops, "news.dead")
	ch := subscribe(t, sub, "news")
	queue := onlyBroadcastQueue(t, mq, "news")

	sent := msg("1")
	require.NoError(t, pub.Publish("news", sent, msg("2")))
	receive(t, ch).Nack()
	requireDeadLetter(t, dead, sent, tinymq.ReasonRejected, "news", queue, "1")
	next := receive(t, ch)
	assert.Equal(t, "2", string(next.Payload))
	next.Ack()
}

func TestExpiredMessageIsDeadLettered(t *testing.T) {
	mq := startMQ(t, quietLogger())
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g",
		MessageTTL: time.Millisecond, DeadLetterTopic: "t.dead"})
	ops := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "ops"})
	dead := subscribe(t, ops, "t.dead")
	require.NoError(t, sub.SubscribeInitialize("t"))

	sent := msg("1")
	require.NoError(t, pub.Publish("t", sent)) // nobody consumes the group's queue
	requireDeadLetter(t, dead, sent, tinymq.ReasonExpired, "t", tinymqwatermill.QueueName("t", "g"), "0")
	assert.Equal(t, uint64(1), mq.Stats().Queues[tinymqwatermill.QueueName("t", "g")].Expired)
}

func TestFullQueueOverflow(t *testing.T) {
	mq := startMQ(t, quietLogger())
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	ops := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "ops"})
	dead := subscribe(t, ops, "t.dead")

	t.Run("DropHead dead-letters the oldest", func(t *testing.T) {
		sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "drop",
			MaxLen: 1, DeadLetterTopic: "t.dead"}) // Overflow: tinymq.DropHead by default
		require.NoError(t, sub.SubscribeInitialize("t"))
		first, second := msg("1"), msg("2")
		require.NoError(t, pub.Publish("t", first, second))
		requireDeadLetter(t, dead, first, tinymq.ReasonMaxLen, "t", tinymqwatermill.QueueName("t", "drop"), "0")
		ch := subscribe(t, sub, "t")
		got := receive(t, ch)
		assert.Equal(t, second.UUID, got.UUID)
		got.Ack()
		require.NoError(t, sub.Close())
		_, err := mq.DeleteQueue(tinymqwatermill.QueueName("t", "drop"))
		require.NoError(t, err)
	})
	t.Run("RejectPublish refuses the newest", func(t *testing.T) {
		sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "reject",
			MaxLen: 1, Overflow: tinymq.RejectPublish})
		require.NoError(t, sub.SubscribeInitialize("t"))
		require.NoError(t, pub.Publish("t", msg("1")))
		require.ErrorIs(t, pub.Publish("t", msg("2")), tinymq.ErrQueueFull)
		got := receive(t, subscribe(t, sub, "t"))
		assert.Equal(t, "1", string(got.Payload))
		got.Ack()
	})
}
