// Command example routes a few orders through a watermill Router running on
// TinyMQ. The billing handler turns each order into an invoice on another
// topic; its consumer group's queue has TinyMQ's native retry and a
// dead-letter topic, so an order that fails once is billed on its second
// attempt and one that always fails ends on "orders.dead", while the orders
// behind them go on. A desk handler prints the invoices and the dead letter,
// and an audit handler, subscribed without a group, sees every order from a
// queue of its own. It exits once everything is printed.
//
//	go run ./example
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync/atomic"
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
	// TinyMQ logs each retry and dead letter as a warning; this example
	// prints its own lines, so it keeps only errors (such as a lost message).
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	mq := tinymq.New(tinymq.WithLogger(logger))
	if err := mq.Start(context.Background()); err != nil {
		return err
	}
	defer mq.Stop() // last: after the router has closed its publisher and subscribers

	pub, err := tinymqwatermill.NewPublisher(mq, tinymqwatermill.PublisherConfig{})
	if err != nil {
		return err
	}
	billing, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{
		ConsumerGroup:   "billing",
		Retry:           &tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond},
		DeadLetterTopic: "orders.dead",
	})
	if err != nil {
		return err
	}
	desk, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "desk"})
	if err != nil {
		return err
	}
	audit, err := tinymqwatermill.NewSubscriber(mq, tinymqwatermill.SubscriberConfig{}) // no group: broadcast
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(middleware.Recoverer) // a panic is an error: a Nack, retried by TinyMQ

	var failedOnce atomic.Bool
	router.AddHandler("bill", "orders", billing, "invoices", pub, func(msg *message.Message) ([]*message.Message, error) {
		order := string(msg.Payload)
		switch {
		case order == "bad order":
			return nil, errors.New("cannot bill a bad order") // every attempt: dead-lettered
		case order == "order 1" && failedOnce.CompareAndSwap(false, true):
			return nil, errors.New("billing service unavailable") // the first attempt: retried
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("invoice for "+order))}, nil
	})

	printed := make(chan struct{}, 8)
	router.AddConsumerHandler("print invoices", "invoices", desk, func(msg *message.Message) error {
		fmt.Println(string(msg.Payload))
		printed <- struct{}{}
		return nil
	})
	router.AddConsumerHandler("print dead letters", "orders.dead", desk, func(msg *message.Message) error {
		fmt.Printf("dead letter: %s (%s after %s attempts)\n", msg.Payload,
			msg.Metadata.Get(tinymqwatermill.DeathReasonKey), msg.Metadata.Get(tinymqwatermill.DeathAttemptsKey))
		printed <- struct{}{}
		return nil
	})
	var audited atomic.Int32
	router.AddConsumerHandler("audit", "orders", audit, func(*message.Message) error {
		audited.Add(1)
		printed <- struct{}{}
		return nil
	})

	ran := make(chan error, 1)
	go func() { ran <- router.Run(context.Background()) }()
	<-router.Running()

	orders := []string{"order 1", "bad order", "order 2", "order 3"}
	for _, order := range orders {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order))); err != nil {
			return err
		}
	}
	// Three invoices, one dead letter, and the audit of every order.
	for range 3 + 1 + len(orders) {
		select {
		case <-printed:
		case <-time.After(10 * time.Second):
			return errors.New("the invoices, dead letter and audits did not all arrive")
		}
	}
	fmt.Printf("audit saw %d orders\n", audited.Load())

	// Close closes the handlers' publisher and subscribers too.
	if err := router.Close(); err != nil {
		return err
	}
	return <-ran
}
