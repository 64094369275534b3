package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

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

// Retries with backoff, then a dead-letter queue for what still fails.
func ExampleWithRetry() {
	m := tinymq.New()
	_ = m.RegisterQueue("payments.dead", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		d := msg.Deaths[0]
		fmt.Printf("dead-lettered from %s after %d attempts: %s\n", d.Queue, d.Attempts, d.LastError)
		return nil
	}, 1)
	_ = m.RegisterQueue("payments", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		fmt.Println("attempt", msg.Attempt)
		return errors.New("card declined")
	}, 1,
		tinymq.WithQueueName("charge"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}),
		tinymq.WithDeadLetter("payments.dead", ""))
	_ = m.Start(context.Background())
	_ = m.Publish("payments", "order-1")
	m.Stop() // waits for the retries and the dead letter
	// Output:
	// attempt 1
	// attempt 2
	// attempt 3
	// dead-lettered from charge after 3 attempts: card declined
}

// Handler gives a consumer its payload with its type.
func ExampleHandler() {
	m := tinymq.New()
	_ = m.RegisterQueue("users", tinymq.Fanout, tinymq.Handler(func(ctx context.Context, u UserCreated) error {
		fmt.Println("welcome", u.Email)
		return nil
	}), 1)
	_ = m.Start(context.Background())
	_ = m.Publish("users", UserCreated{ID: 1, Email: "ada@example.com"})
	m.Stop()
	// Output:
	// welcome ada@example.com
}

// Stats counts what every queue did.
func ExampleMQ_Stats() {
	m := tinymq.New()
	_ = m.RegisterQueue("jobs", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		if msg.Data.(int)%2 == 1 {
			return errors.New("odd")
		}
		return nil
	}, 2, tinymq.WithQueueName("workers"))
	_ = m.Start(context.Background())
	for i := range 10 {
		_ = m.Publish("jobs", i)
	}
	m.Stop()
	q := m.Stats().Queues["workers"]
	fmt.Printf("accepted %d, succeeded %d, failed %d, dropped %d, depth %d\n",
		q.Accepted, q.Succeeded, q.Failed, q.Dropped, q.Depth)
	// Output:
	// accepted 10, succeeded 5, failed 5, dropped 5, depth 0
}

// Delayed messages become visible after their delay; Stop waits for them.
func ExampleWithDelay() {
	m := tinymq.New()
	start := time.Now()
	_ = m.RegisterQueue("reminders", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		fmt.Println(msg.Data, "after at least 20ms:", time.Since(start) >= 20*time.Millisecond)
		return nil
	}, 1)
	_ = m.Start(context.Background())
	_ = m.Publish("reminders", "renew your plan", tinymq.WithDelay(20*time.Millisecond))
	m.Stop()
	// Output:
	// renew your plan after at least 20ms: true
}

// RegisterHandler consumes payloads of one type without allocating a Msg for
// each delivery.
func ExampleRegisterHandler() {
	m := tinymq.New()
	var mu sync.Mutex
	var sent []string
	err := tinymq.RegisterHandler(m, "user.created", tinymq.Fanout, func(ctx context.Context, u *UserCreated) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, u.Email)
		return nil
	}, 1)
	if err != nil {
		panic(err)
	}
	_ = m.Start(context.Background())
	_ = m.Publish("user.created", &UserCreated{ID: 1, Email: "ada@example.com"})
	_ = m.Publish("user.created", &UserCreated{ID: 2, Email: "alan@example.com"})
	m.Stop()
	fmt.Println(sent)
	// Output: [ada@example.com alan@example.com]
}

// RegisterDeliveryHandler hands the consumer the metadata too, by value.
func ExampleRegisterDeliveryHandler() {
	m := tinymq.New()
	err := tinymq.RegisterDeliveryHandler(m, "events", tinymq.Topic, func(ctx context.Context, d tinymq.Delivery[string]) error {
		fmt.Printf("message %d, key %s, attempt %d: %s\n", d.ID, d.RoutingKey, d.Attempt, d.Data)
		return nil
	}, 1, tinymq.WithBindingKey("user.*"))
	if err != nil {
		panic(err)
	}
	_ = m.Start(context.Background())
	_ = m.Publish("events", "ada signed up", tinymq.WithRoutingKey("user.created"))
	m.Stop()
	// Output: message 1, key user.created, attempt 1: ada signed up
}

// WithMiddleware wraps every consumer, of every form, once for the whole MQ;
// WithPublishMiddleware wraps every publish, and may add headers.
func ExampleWithMiddleware() {
	timed := func(next tinymq.DeliveryFunc) tinymq.DeliveryFunc {
		return func(ctx context.Context, d tinymq.Delivery[any]) error {
			err := next(ctx, d)
			fmt.Printf("queue %s, message %d, attempt %d: %v\n", d.Queue, d.ID, d.Attempt, err)
			return err
		}
	}
	traced := func(next tinymq.PublishFunc) tinymq.PublishFunc {
		return func(ctx context.Context, p *tinymq.Publishing) error {
			h := map[string]any{"trace": "t-1"} // a new map: the caller's may be shared
			for k, v := range p.Headers {
				h[k] = v
			}
			p.Headers = h
			return next(ctx, p)
		}
	}
	m := tinymq.New(tinymq.WithMiddleware(timed), tinymq.WithPublishMiddleware(traced))
	err := tinymq.RegisterDeliveryHandler(m, "user.created", tinymq.Fanout, func(ctx context.Context, d tinymq.Delivery[*UserCreated]) error {
		fmt.Printf("welcome %s (trace %v)\n", d.Data.Email, d.Headers["trace"])
		return nil
	}, 1, tinymq.WithQueueName("welcome"))
	if err != nil {
		panic(err)
	}
	_ = m.Start(context.Background())
	_ = m.Publish("user.created", &UserCreated{ID: 1, Email: "ada@example.com"})
	m.Stop()
	// Output:
	// welcome ada@example.com (trace t-1)
	// queue welcome, message 1, attempt 1: <nil>
}
