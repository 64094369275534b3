package tinymqwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// TestRouter runs watermill's Router on TinyMQ with the Recoverer, Retry and
// PoisonQueue middlewares: a handler that panics once and fails once per
// order still turns every good order into an invoice, on another topic; a bad
// order goes to the poison topic once its retries are spent.
func TestRouter(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing"})
	poisoned := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "ops"})
	poison := subscribe(t, poisoned, "orders.poison")

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: wait}, watermill.NopLogger{})
	require.NoError(t, err)
	poisonMW, err := middleware.PoisonQueue(pub, "orders.poison")
	require.NoError(t, err)
	router.AddMiddleware(
		poisonMW,
		middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, Logger: watermill.NopLogger{}}.Middleware,
		middleware.Recoverer,
	)

	var mu sync.Mutex
	attempts := map[string]int{}
	var badAttempts atomic.Int32
	router.AddHandler("bill", "orders", sub, "invoices", pub, func(m *message.Message) ([]*message.Message, error) {
		order := string(m.Payload)
		if order == "bad" {
			badAttempts.Add(1)
			return nil, errors.New("cannot bill a bad order")
		}
		mu.Lock()
		attempts[order]++
		n := attempts[order]
		mu.Unlock()
		switch n {
		case 1:
			panic("first attempt panics")
		case 2:
			return nil, errors.New("second attempt fails")
		}
		invoice := message.NewMessage(watermill.NewUUID(), []byte("invoice for "+order))
		invoice.Metadata.Set("order", m.UUID)
		return []*message.Message{invoice}, nil
	})
	invoices := make(chan *message.Message, 10)
	router.AddConsumerHandler("collect", "invoices", sub, func(m *message.Message) error {
		invoices <- m
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case <-time.After(wait):
		t.Fatal("router not running")
	}

	orders := []*message.Message{msg("a"), msg("bad"), msg("b")}
	require.NoError(t, pub.Publish("orders", orders...))

	got := map[string]string{}
	for len(got) < 2 {
		select {
		case m := <-invoices:
			got[m.Metadata.Get("order")] = string(m.Payload)
		case <-time.After(wait):
			t.Fatalf("invoices so far: %v", got)
		}
	}
	assert.Equal(t, map[string]string{orders[0].UUID: "invoice for a", orders[2].UUID: "invoice for b"}, got)

	p := receive(t, poison)
	p.Ack()
	assert.Equal(t, "bad", string(p.Payload))
	assert.Equal(t, orders[1].UUID, p.UUID)
	assert.Equal(t, "orders", p.Metadata.Get(middleware.PoisonedTopicKey))
	assert.Equal(t, "cannot bill a bad order", p.Metadata.Get(middleware.ReasonForPoisonedKey))
	assert.Equal(t, int32(3), badAttempts.Load(), "one attempt and MaxRetries retries")

	require.NoError(t, router.Close())
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("Router.Run did not return")
	}
	select {
	case m := <-invoices:
		t.Fatalf("extra invoice %q", m.Payload)
	default:
	}
}

// TestRouterHandlersOnOneTopicDoNotHoldEachOtherBack: with the default
// SubscriberConfig, two Router handlers on one topic each get every message
// from a queue of their own (GoChannel's broadcast), so a handler blocked on
// its first message holds back only itself.
func TestRouterHandlersOnOneTopicDoNotHoldEachOtherBack(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{})

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: wait}, watermill.NopLogger{})
	require.NoError(t, err)
	release := make(chan struct{})
	slowGot := make(chan string, 10)
	router.AddConsumerHandler("slow", "events", sub, func(m *message.Message) error {
		slowGot <- string(m.Payload)
		<-release
		return nil
	})
	fastGot := make(chan string, 10)
	router.AddConsumerHandler("fast", "events", sub, func(m *message.Message) error {
		fastGot <- string(m.Payload)
		return nil
	})
	ran := make(chan error, 1)
	go func() { ran <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case <-time.After(wait):
		t.Fatal("router not running")
	}

	const n = 10
	var want []string
	for i := range n {
		want = append(want, fmt.Sprint(i))
		require.NoError(t, pub.Publish("events", msg(fmt.Sprint(i))))
	}
	assert.Equal(t, "0", receiveString(t, slowGot), "the slow handler holds its first message")
	var fast []string
	for range n {
		fast = append(fast, receiveString(t, fastGot))
	}
	assert.Equal(t, want, fast, "the other handler got every message while the slow one was held")
	select {
	case p := <-slowGot:
		t.Fatalf("the slow handler got %q while it was held", p)
	default:
	}
	queues := broadcastQueues(mq, "events")
	assert.Len(t, queues, 2, "one queue per subscription")

	close(release)
	slow := []string{"0"}
	for range n - 1 {
		slow = append(slow, receiveString(t, slowGot))
	}
	assert.Equal(t, want, slow, "the slow handler gets every message too, once released")

	require.NoError(t, router.Close())
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("Router.Run did not return")
	}
	assert.Empty(t, broadcastQueues(mq, "events"), "closing the router deleted both queues")
}

func receiveString(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(wait):
		t.Fatal("nothing received")
		return ""
	}
}
