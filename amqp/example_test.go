package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

type UserCreated struct {
	ID    int    `json:"id"`
	Email string `json:"email"`
}

func sendWelcomeEmail(ctx context.Context, u UserCreated) error { return nil }

// The same application code as in memory; only the option given to New
// changes. Publish returns once the broker has confirmed the message.
func Example() {
	mq := tinymq.New(amqp.Engine("amqp://guest:guest@127.0.0.1:5672/",
		amqp.WithPublishTimeout(10*time.Second)))
	defer mq.Stop() // finishes the messages in consumers; the broker keeps the rest

	err := errors.Join(
		mq.RegisterQueue("user.created", tinymq.Fanout, tinymq.Handler(sendWelcomeEmail), 4,
			tinymq.WithQueueName("welcome-email"), // every process consuming it uses this name
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5}),
			tinymq.WithDeadLetter("user.created.dead", "")),
		mq.Start(context.Background()),
		mq.Publish("user.created", UserCreated{ID: 42, Email: "ada@example.com"}),
	)
	if err != nil {
		fmt.Println(err)
	}
}

// A bad option does not panic: every call of the MQ returns the error, and
// nothing connects.
func ExampleWithPrefetch() {
	mq := tinymq.New(amqp.Engine("amqp://guest:guest@127.0.0.1:5672/", amqp.WithPrefetch(0)))
	defer mq.Stop()
	err := mq.RegisterQueue("users", tinymq.Fanout, tinymq.Handler(sendWelcomeEmail), 1,
		tinymq.WithQueueName("welcome-email"))
	fmt.Println(errors.Is(err, tinymq.ErrInvalidOption))
	fmt.Println(err)
	// Output:
	// true
	// tinymq: invalid option: amqp.WithPrefetch(0): must be at least 1
}

// A queue needs a name that every process consuming it agrees on: one made
// up by the MQ is refused, before anything is sent to the broker.
func ExampleEngine() {
	mq := tinymq.New(amqp.Engine("amqp://guest:guest@127.0.0.1:5672/"))
	defer mq.Stop()
	err := mq.RegisterQueue("users", tinymq.Fanout, tinymq.Handler(sendWelcomeEmail), 1)
	fmt.Println(errors.Is(err, tinymq.ErrUnsupported))
	// Output: true
}
