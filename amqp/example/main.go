// Command example runs the same application code on the in-memory engine or
// on RabbitMQ, and exits by itself once its messages are handled:
//
//	go run ./example -engine memory
//	go run ./example -engine rabbitmq -url amqp://guest:guest@127.0.0.1:5672/
//	go run ./example -engine rabbitmq -local-broker   # a throwaway node (needs install-rabbitmq.sh)
//
// Only newMQ knows which engine runs; app is the application.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
	"github.com/tinymq/tinymq/amqp/internal/brokertest"
)

// UserCreated is the application's event.
type UserCreated struct {
	ID    int    `json:"id"`
	Email string `json:"email"`
}

func main() {
	engine := flag.String("engine", "memory", "memory or rabbitmq")
	url := flag.String("url", "amqp://guest:guest@127.0.0.1:5672/", "the broker's URL (-engine rabbitmq)")
	local := flag.Bool("local-broker", false, "start a throwaway RabbitMQ node on 127.0.0.1 (-engine rabbitmq)")
	flag.Parse()
	if err := run(*engine, *url, *local); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// run returns rather than exits, so that a local broker is always stopped.
func run(engine, url string, local bool) error {
	if engine == "rabbitmq" && local {
		b, err := brokertest.StartNode()
		if err != nil {
			return fmt.Errorf("starting a local broker: %w", err)
		}
		defer b.Stop()
		url = b.URL()
	}
	mq, err := newMQ(engine, url)
	if err != nil {
		return err
	}
	defer mq.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return app(ctx, mq)
}

// newMQ is the one place that differs between the engines.
func newMQ(engine, url string) (*tinymq.MQ, error) {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	switch engine {
	case "memory":
		return tinymq.New(tinymq.WithLogger(logger)), nil
	case "rabbitmq":
		return tinymq.New(amqp.Engine(url), tinymq.WithLogger(logger)), nil
	}
	return nil, fmt.Errorf("unknown engine %q: want memory or rabbitmq", engine)
}

// app is the application: a welcome email with retries and a dead-letter
// queue, and an audit log, fed by a topic exchange. It publishes five
// signups, waits until each is handled, and stops.
func app(ctx context.Context, mq *tinymq.MQ) error {
	runID := time.Now().UnixNano() // messages of earlier runs may still wait in a broker
	var mu sync.Mutex
	handled := make(map[string]bool)
	progress := make(chan struct{}, 1)
	note := func(what string, id int) {
		mu.Lock()
		handled[fmt.Sprint(what, id)] = true
		mu.Unlock()
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	mine := func(id int) bool { return int64(id)/1000 == runID%1_000_000 }

	sendWelcome := tinymq.Handler(func(ctx context.Context, u UserCreated) error {
		if u.Email == "" {
			return tinymq.Permanent(errors.New("no email address"))
		}
		if u.ID%2 == 0 && !flaky(u.ID) { // even IDs fail once: the retry comes back
			return errors.New("mail server busy")
		}
		if mine(u.ID) {
			fmt.Printf("email:  welcome sent to %s\n", u.Email)
			note("email", u.ID)
		}
		return nil
	})
	audit := func(ctx context.Context, m *tinymq.Msg) error {
		u, err := decode[UserCreated](m)
		if err != nil {
			return err
		}
		if mine(u.ID) {
			fmt.Printf("audit:  %s user %d\n", m.RoutingKey, u.ID)
			note("audit", u.ID)
		}
		return nil
	}
	deadLetters := tinymq.Handler(func(ctx context.Context, u UserCreated) error {
		if mine(u.ID) {
			fmt.Printf("dead:   user %d could not be welcomed\n", u.ID)
			note("dead", u.ID)
		}
		return nil
	})

	if err := mq.DeclareExchange("users", tinymq.Topic); err != nil {
		return err
	}
	steps := []error{
		mq.RegisterQueue("users.dead", tinymq.Fanout, deadLetters, 1, tinymq.WithQueueName("example.users.dead")),
		mq.RegisterQueue("users", tinymq.Topic, sendWelcome, 2, tinymq.WithQueueName("example.welcome-email"),
			tinymq.WithBindingKey("user.created"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 100 * time.Millisecond}),
			tinymq.WithDeadLetter("users.dead", "")),
		mq.RegisterQueue("users", tinymq.Topic, audit, 1, tinymq.WithQueueName("example.audit"),
			tinymq.WithBindingKey("user.#")),
		mq.Start(ctx),
	}
	if err := errors.Join(steps...); err != nil {
		return err
	}
	base := int(runID%1_000_000) * 1000
	users := []UserCreated{{base + 1, "ada@example.com"}, {base + 2, "grace@example.com"}, {base + 3, ""},
		{base + 4, "edsger@example.com"}, {base + 5, "barbara@example.com"}}
	for _, u := range users {
		if err := mq.PublishContext(ctx, "users", u, tinymq.WithRoutingKey("user.created")); err != nil {
			return fmt.Errorf("publishing user %d: %w", u.ID, err)
		}
	}
	want := 2*len(users) - 1 + 1 // an audit each, an email each but one, one dead letter
	for {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		if n == want {
			break
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("handled %d of %d: %w", n, want, ctx.Err())
		}
	}
	mq.Stop()
	st := mq.Stats().Queues["example.welcome-email"]
	fmt.Printf("done: welcome-email delivered %d, retried %d, dead-lettered %d\n", st.Delivered, st.Retried, st.DeadLettered)
	return nil
}

// decode returns the payload of m as a T on any engine: the published value
// in memory, decoded from tinymq.Encoded on a broker. It is what
// tinymq.Handler does, for a consumer that also needs the Msg.
func decode[T any](m *tinymq.Msg) (v T, err error) {
	err = tinymq.Handler(func(_ context.Context, x T) error {
		v = x
		return nil
	})(context.Background(), m)
	return v, err
}

// flaky remembers which IDs already failed once, so that each even ID
// fails exactly once whichever worker (or process) gets it.
var failedOnce sync.Map

func flaky(id int) bool {
	_, seen := failedOnce.LoadOrStore(id, true)
	return seen
}
