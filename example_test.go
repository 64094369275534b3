package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/tinymq/tinymq"
)

type UserCreated struct {
	ID    int
	Email string
}

// A user-created event fans out to a welcome-email queue and an audit queue.
func Example() {
	m := tinymq.New()

	var mu sync.Mutex
	var lines []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, s)
	}

	_ = m.RegisterQueue("user.created", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		u := msg.Data.(UserCreated)
		record(fmt.Sprintf("welcome email to %s", u.Email))
		return nil
	}, 2, tinymq.WithQueueName("welcome-email"))
	_ = m.RegisterQueue("user.created", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		record(fmt.Sprintf("audit: user %d created (message %d)", msg.Data.(UserCreated).ID, msg.ID))
		return nil
	}, 1, tinymq.WithQueueName("audit"))

	if err := m.Start(context.Background()); err != nil {
		panic(err)
	}
	_ = m.Publish("user.created", UserCreated{ID: 1, Email: "ada@example.com"})
	_ = m.Publish("user.created", UserCreated{ID: 2, Email: "alan@example.com"})
	m.Stop() // delivers both messages to both queues before it returns

	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// audit: user 1 created (message 1)
	// audit: user 2 created (message 2)
	// welcome email to ada@example.com
	// welcome email to alan@example.com
}

// Topic exchanges route by pattern: "*" is one word, "#" is zero or more.
func ExampleMQ_RegisterQueue_topic() {
	m := tinymq.New()
	got := make(chan string, 10)
	consume := func(ctx context.Context, msg *tinymq.Msg) error {
		got <- msg.Queue + " <- " + msg.RoutingKey
		return nil
	}
	_ = m.RegisterQueue("events", tinymq.Topic, consume, 1,
		tinymq.WithQueueName("created"), tinymq.WithBindingKey("user.*.created"))
	_ = m.RegisterQueue("events", tinymq.Topic, consume, 1,
		tinymq.WithQueueName("audit"), tinymq.WithBindingKey("audit.#"))

	_ = m.Start(context.Background())
	_ = m.Publish("events", nil, tinymq.WithRoutingKey("user.42.created"))
	_ = m.Publish("events", nil, tinymq.WithRoutingKey("audit.login.failed"))
	err := m.Publish("events", nil, tinymq.WithRoutingKey("user.created"))
	fmt.Println("user.created:", errors.Is(err, tinymq.ErrNoRoute))
	m.Stop()
	close(got)

	var lines []string
	for l := range got {
		lines = append(lines, l)
	}
	sort.Strings(lines)
	fmt.Println(lines)
	// Output:
	// user.created: true
	// [audit <- audit.login.failed created <- user.42.created]
}

// Headers exchanges route by header values, as RabbitMQ's do.
func ExampleWithBindingArgs() {
	m := tinymq.New()
	_ = m.RegisterQueue("docs", tinymq.Headers, func(ctx context.Context, msg *tinymq.Msg) error {
		fmt.Println("printing", msg.Data)
		return nil
	}, 1, tinymq.WithBindingArgs(map[string]any{"x-match": "all", "format": "pdf", "size": "a4"}))

	_ = m.Start(context.Background())
	_ = m.Publish("docs", "report.pdf", tinymq.WithHeaders(map[string]any{"format": "pdf", "size": "a4"}))
	err := m.Publish("docs", "letter.pdf", tinymq.WithHeaders(map[string]any{"format": "pdf", "size": "letter"}))
	m.Stop()
	fmt.Println(err)
	// Output:
	// printing report.pdf
	// tinymq: no route: exchange "docs", routing key ""
}

// Shutdown bounds the graceful stop with a deadline.
func ExampleMQ_Shutdown() {
	m := tinymq.New()
	_ = m.RegisterQueue("jobs", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		return nil
	}, 4)
	_ = m.Start(context.Background())
	for i := range 100 {
		_ = m.Publish("jobs", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		fmt.Println("not all delivered:", err)
		return
	}
	fmt.Println("all 100 delivered")
	// Output:
	// all 100 delivered
}

// An alternate exchange catches what its exchange cannot route.
func ExampleWithAlternateExchange() {
	m := tinymq.New()
	got := make(chan string, 2)
	consume := func(ctx context.Context, msg *tinymq.Msg) error {
		got <- msg.Queue + ": " + msg.RoutingKey
		return nil
	}
	_ = m.DeclareExchange("orders", tinymq.Direct, tinymq.WithAlternateExchange("unrouted"))
	_ = m.RegisterQueue("orders", tinymq.Direct, consume, 1,
		tinymq.WithQueueName("created"), tinymq.WithBindingKey("created"))
	_ = m.RegisterQueue("unrouted", tinymq.Fanout, consume, 1, tinymq.WithQueueName("unrouted"))
	_ = m.Start(context.Background())
	_ = m.Publish("orders", nil, tinymq.WithRoutingKey("created"))
	_ = m.Publish("orders", nil, tinymq.WithRoutingKey("refunded"))
	m.Stop()
	lines := []string{<-got, <-got}
	sort.Strings(lines)
	fmt.Println(lines)
	// Output:
	// [created: created unrouted: refunded]
}
