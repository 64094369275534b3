// Command quickstart is the README's quick start, as a program that CI builds
// and runs (a test checks that the README shows this very code, between the
// quickstart markers).
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/tinymq/tinymq"
)

// UserCreated is the event the user service publishes.
type UserCreated struct {
	ID    int
	Email string
}

func sendWelcomeEmail(ctx context.Context, u UserCreated) error {
	fmt.Printf("welcome mail sent to %s\n", u.Email)
	return nil
}

func writeAuditRecord(ctx context.Context, u UserCreated) error {
	fmt.Printf("audit: user %d created\n", u.ID)
	return nil
}

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// quickstart:begin
func run(ctx context.Context) error {
	mq := tinymq.New() // losses and drops are logged to slog.Default

	// Two workers send emails; a failure is retried, then dead-lettered.
	err := tinymq.RegisterHandler(mq, "user.created", tinymq.Fanout, sendWelcomeEmail, 2,
		tinymq.WithQueueName("welcome-email"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3}),
		tinymq.WithDeadLetter("user.created.dead", ""))
	if err != nil {
		return err
	}
	// One worker writes the audit trail, in publish order.
	err = tinymq.RegisterHandler(mq, "user.created", tinymq.Fanout, writeAuditRecord, 1,
		tinymq.WithQueueName("audit"))
	if err != nil {
		return err
	}
	// Dead letters wait here, for an operator to look at and replay.
	if err := mq.DeclareQueue("welcome-email.failed", "user.created.dead", tinymq.Fanout); err != nil {
		return err
	}

	if err := mq.Start(ctx); err != nil {
		return err
	}
	defer mq.Stop() // delivers everything accepted, then returns
	// nil: both queues have the message. Otherwise nothing was accepted.
	return mq.Publish("user.created", UserCreated{ID: 42, Email: "ada@example.com"})
}

// quickstart:end
