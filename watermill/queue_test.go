package tinymqwatermill_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// These tests prove that SubscriberConfig's queue settings reach the TinyMQ
// queue that a subscription consumes, as tinymq.MQ.Topology shows it, and that
// TinyMQ's validation of them reaches the caller.

// queueInfo returns the QueueInfo of the queue name, failing the test if mq
// has none.
func queueInfo(t *testing.T, mq *tinymq.MQ, name string) tinymq.QueueInfo {
	t.Helper()
	for _, q := range mq.Topology().Queues {
		if q.Name == name {
			return q
		}
	}
	t.Fatalf("no queue %q", name)
	return tinymq.QueueInfo{}
}

// onlyBroadcastQueue returns the name of topic's one broadcast queue.
func onlyBroadcastQueue(t *testing.T, mq *tinymq.MQ, topic string) string {
	t.Helper()
	qs := broadcastQueues(mq, topic)
	require.Len(t, qs, 1)
	for name := range qs {
		return name
	}
	return ""
}

func TestSubscriberConfigReachesTheQueue(t *testing.T) {
	mq := startMQ(t, tinymq.WithDataDir(t.TempDir()))
	for _, tc := range []struct {
		name string
		cfg  tinymqwatermill.SubscriberConfig
		// initialize declares the group's queue with SubscribeInitialize
		// rather than Subscribe: it has no consumer.
		initialize bool
		want       tinymq.QueueInfo // Name is filled in
	}{{
		name: "group defaults",
		cfg:  tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"},
		want: tinymq.QueueInfo{Concurrency: 1, MaxAttempts: 1, Consumers: 1},
	}, {
		name: "group, every setting",
		cfg: tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", Concurrency: 3, Durable: true,
			MessageTTL: time.Minute, MaxLen: 5, Overflow: tinymq.RejectPublish,
			Retry: &tinymq.RetryPolicy{MaxAttempts: 4}, DeadLetterTopic: "dead"},
		want: tinymq.QueueInfo{Concurrency: 3, MaxAttempts: 4, MessageTTL: time.Minute,
			MaxLen: 5, Overflow: tinymq.RejectPublish, DeadLetterExchange: "dead", Durable: true, Consumers: 1},
	}, {
		name:       "group, initialized",
		cfg:        tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", Durable: true, MaxLen: 2, Overflow: tinymq.Block},
		initialize: true,
		want:       tinymq.QueueInfo{MaxAttempts: 1, MaxLen: 2, Overflow: tinymq.Block, Durable: true},
	}, {
		name: "broadcast, defaults",
		cfg:  tinymqwatermill.SubscriberConfig{},
		want: tinymq.QueueInfo{Concurrency: 1, MaxAttempts: 1, Consumers: 1},
	}, {
		name: "broadcast, every setting",
		cfg: tinymqwatermill.SubscriberConfig{MessageTTL: time.Second, MaxLen: 7,
			Retry: &tinymq.RetryPolicy{}, DeadLetterTopic: "dead"},
		want: tinymq.QueueInfo{Concurrency: 1, MaxAttempts: 3, MessageTTL: time.Second,
			MaxLen: 7, Overflow: tinymq.DropHead, DeadLetterExchange: "dead", Consumers: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "topic " + tc.name
			cfg := tc.cfg
			sub := newSubscriber(t, mq, cfg)
			if cfg.Retry != nil {
				cfg.Retry.MaxAttempts = 99 // NewSubscriber copied the policy
			}
			if tc.initialize {
				require.NoError(t, sub.SubscribeInitialize(topic))
			} else {
				subscribe(t, sub, topic)
			}
			want := tc.want
			if want.Name = tinymqwatermill.QueueName(topic, cfg.ConsumerGroup); cfg.ConsumerGroup == "" {
				want.Name = onlyBroadcastQueue(t, mq, topic)
			}
			assert.Equal(t, want, queueInfo(t, mq, want.Name))
		})
	}
}

func TestSubscriberConfigRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  tinymqwatermill.SubscriberConfig
	}{
		{"negative Concurrency", tinymqwatermill.SubscriberConfig{Concurrency: -1}},
		{"Durable without a group", tinymqwatermill.SubscriberConfig{Durable: true}},
		{"Overflow without MaxLen", tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", Overflow: tinymq.Block}},
	} {
		t.Run("NewSubscriber "+tc.name, func(t *testing.T) {
			_, err := tinymqwatermill.NewSubscriber(tinymq.New(), tc.cfg)
			require.ErrorIs(t, err, tinymq.ErrInvalidOption)
		})
	}

	mq := startMQ(t) // no data directory
	for _, tc := range []struct {
		name string
		cfg  tinymqwatermill.SubscriberConfig
	}{
		{"negative MessageTTL", tinymqwatermill.SubscriberConfig{MessageTTL: -time.Second}},
		{"negative MaxLen", tinymqwatermill.SubscriberConfig{MaxLen: -1}},
		{"unknown Overflow", tinymqwatermill.SubscriberConfig{MaxLen: 1, Overflow: 9}},
		{"bad Retry", tinymqwatermill.SubscriberConfig{Retry: &tinymq.RetryPolicy{Jitter: 2}}},
		{"DeadLetterTopic is the topic", tinymqwatermill.SubscriberConfig{DeadLetterTopic: "t"}},
		{"Durable without a data directory", tinymqwatermill.SubscriberConfig{Durable: true}},
	} {
		for _, group := range []string{"", "g"} {
			if tc.cfg.Durable && group == "" {
				continue // NewSubscriber refuses it
			}
			t.Run(fmt.Sprintf("Subscribe %s, group %q", tc.name, group), func(t *testing.T) {
				cfg := tc.cfg
				cfg.ConsumerGroup = group
				sub := newSubscriber(t, mq, cfg)
				_, err := sub.Subscribe(context.Background(), "t")
				require.ErrorIs(t, err, tinymq.ErrInvalidOption)
				if group != "" {
					require.ErrorIs(t, sub.SubscribeInitialize("t"), tinymq.ErrInvalidOption)
				}
			})
		}
	}
	assert.Empty(t, mq.Topology().Queues, "a refused subscription declared no queue")
}

// The Subscribers of one consumer group share its queue, and so must agree on
// its settings.
func TestGroupSettingsMustAgree(t *testing.T) {
	mq := startMQ(t)
	first := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", MaxLen: 10})
	subscribe(t, first, "t")
	other := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", MaxLen: 20})
	_, err := other.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, tinymq.ErrDuplicateQueue)
	require.ErrorIs(t, other.SubscribeInitialize("t"), tinymq.ErrDuplicateQueue)
	same := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", MaxLen: 10})
	subscribe(t, same, "t")
	assert.Equal(t, 10, queueInfo(t, mq, tinymqwatermill.QueueName("t", "g")).MaxLen)
}

// A Durable group's queue keeps what the group had not acked across a
// restart of the MQ: the first Subscribe after the next Start gets it back,
// UUIDs, payloads and metadata included.
func TestDurableGroupSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	cfg := tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", Durable: true}
	before := startMQ(t, tinymq.WithDataDir(dir))
	pub := newPublisher(t, before, tinymqwatermill.PublisherConfig{FailUnroutable: true})
	sub := newSubscriber(t, before, cfg)
	require.NoError(t, sub.SubscribeInitialize("t"))
	sent := []*message.Message{msg("1"), msg("2")}
	sent[0].Metadata.Set("k", "v")
	require.NoError(t, pub.Publish("t", sent...))
	require.NoError(t, sub.Close())
	before.Stop()

	after := startMQ(t, tinymq.WithDataDir(dir))
	ch := subscribe(t, newSubscriber(t, after, cfg), "t")
	for _, want := range sent {
		got := receive(t, ch)
		assert.Equal(t, want.UUID, got.UUID)
		assert.Equal(t, want.Payload, got.Payload)
		assert.Equal(t, want.Metadata, got.Metadata)
		got.Ack()
	}
	requireNothing(t, ch)
}
