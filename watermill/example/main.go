// Command example routes a few orders through a watermill Router running on
// TinyMQ: a handler turns each order into an invoice on another topic, with
// the Recoverer and Retry middlewares, and a second handler prints the
// invoices. It exits once every invoice is printed.
//
//	go run ./example
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	mq := tinymq.New()
	if err := mq.Start(context.Background()); err != nil {
		return err
	}
	defer mq.Stop() // last: after the router has closed its publisher and subscriber

	pub, err := tinymqwatermill.NewPublisher(mq, tinymqwatermill.PublisherConfig{})
	if err != nil {
		return err
	}
	sub, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing"})
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(
		middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond}.Middleware,
		middleware.Recoverer,
	)

	failedOnce := false
	router.AddHandler("bill", "orders", sub, "invoices", pub, func(msg *message.Message) ([]*message.Message, error) {
		if !failedOnce { // the first attempt fails; Retry tries again
			failedOnce = true
			return nil, errors.New("billing service unavailable")
		}
		invoice := fmt.Sprintf("invoice for %s", msg.Payload)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(invoice))}, nil
	})

	const orders = 3
	printed := make(chan struct{}, orders)
	router.AddConsumerHandler("print", "invoices", sub, func(msg *message.Message) error {
		fmt.Println(string(msg.Payload))
		printed <- struct{}{}
		return nil
	})

	ran := make(chan error, 1)
	go func() { ran <- router.Run(context.Background()) }()
	<-router.Running()

	for i := 1; i <= orders; i++ {
		order := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order %d", i))
		if err := pub.Publish("orders", order); err != nil {
			return err
		}
	}
	for range orders {
		select {
		case <-printed:
		case <-time.After(10 * time.Second):
			return errors.New("invoices did not arrive")
		}
	}

	// Close closes the handlers' publisher and subscriber too.
	if err := router.Close(); err != nil {
		return err
	}
	return <-ran
}
