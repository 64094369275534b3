package tinymqwatermill_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// A consumer group's queue keeps what is published before its first
// subscription, and delivers it in order.
func Example() {
	mq := tinymq.New()
	if err := mq.Start(context.Background()); err != nil {
		panic(err)
	}
	pub, err := tinymqwatermill.NewPublisher(mq, tinymqwatermill.PublisherConfig{})
	if err != nil {
		panic(err)
	}
	sub, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing"})
	if err != nil {
		panic(err)
	}
	if err := sub.SubscribeInitialize("orders"); err != nil {
		panic(err)
	}

	for _, order := range []string{"apple", "pear", "plum"} {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order))); err != nil {
			panic(err)
		}
	}

	msgs, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		panic(err)
	}
	for range 3 {
		msg := <-msgs
		fmt.Println(string(msg.Payload))
		msg.Ack()
	}

	_ = sub.Close()
	_ = pub.Close()
	mq.Stop()
	// Output:
	// apple
	// pear
	// plum
}
