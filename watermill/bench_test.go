package tinymqwatermill_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// BenchmarkPubSub publishes b.N messages and receives and acks them on one
// subscription, against this adapter and watermill's GoChannel.
func BenchmarkPubSub(b *testing.B) {
	b.Run("impl=tinymq", func(b *testing.B) {
		mq := tinymq.New()
		require.NoError(b, mq.Start(context.Background()))
		defer mq.Stop()
		pub, err := tinymqwatermill.NewPublisher(mq, tinymqwatermill.PublisherConfig{})
		require.NoError(b, err)
		sub, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "bench"})
		require.NoError(b, err)
		defer sub.Close()
		benchPubSub(b, pub, sub)
	})
	b.Run("impl=gochannel", func(b *testing.B) {
		gc := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		defer gc.Close()
		benchPubSub(b, gc, gc)
	})
}

func benchPubSub(b *testing.B, pub message.Publisher, sub message.Subscriber) {
	b.ReportAllocs()
	ch, err := sub.Subscribe(context.Background(), "bench")
	require.NoError(b, err)
	payload := make([]byte, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range b.N {
			(<-ch).Ack()
		}
	}()
	b.ResetTimer()
	for range b.N {
		if err := pub.Publish("bench", message.NewMessage(watermill.NewUUID(), payload)); err != nil {
			b.Fatal(err)
		}
	}
	<-done
}
