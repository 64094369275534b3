package tinymqwatermill_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// suiteFeatures are the strongest flags of watermill's universal test suite
// that the adapter honours; README.md justifies each.
var suiteFeatures = tests.Features{
	ConsumerGroups:                      true,
	ExactlyOnceDelivery:                 false,
	GuaranteedOrder:                     true,
	GuaranteedOrderWithSingleSubscriber: false,
	Persistent:                          true,
	RestartServiceCommand:               nil,
	RequireSingleInstance:               false,
	NewSubscriberReceivesOldMessages:    false,
	ContextPreserved:                    false,
	ForceShort:                          false,
}

// TestUniversalSuite runs watermill's own Pub/Sub test suite on one MQ, which
// every Publisher and Subscriber the suite creates shares, as clients share a
// broker. The constructor without a group uses the group "test", as
// watermill-kafka's tests do.
func TestUniversalSuite(t *testing.T) {
	mq := startMQ(t)
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := tinymqwatermill.NewPublisher(mq, tinymqwatermill.PublisherConfig{})
		require.NoError(t, err)
		sub, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: group})
		require.NoError(t, err)
		// The suite closes what it creates, except in TestPublishSubscribeInOrder,
		// whose "defer require.NoError(t, sub.Close())" closes the subscriber
		// before subscribing: close everything again when the subtest ends
		// (Close is idempotent), so that goleak sees no subscription left.
		t.Cleanup(func() {
			assert.NoError(t, pub.Close())
			assert.NoError(t, sub.Close())
		})
		return pub, sub
	}
	tests.TestPubSub(t, suiteFeatures,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return withGroup(t, "test") },
		withGroup)
}
