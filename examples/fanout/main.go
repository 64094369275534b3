// Command fanout shows the core TinyMQ pattern: one "user created" event is
// consumed by two independent queues, a welcome-email sender and an audit log.
//
//	go run ./examples/fanout
package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync"

	"github.com/tinymq/tinymq"
)

// UserCreated is the event the user service publishes.
type UserCreated struct {
	ID    int
	Email string
}

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	mq := tinymq.New(tinymq.WithLogger(logger))

	var mu sync.Mutex // the two consumers print from several goroutines
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}

	// Two workers send emails concurrently; if one panics, only that message fails.
	err := mq.RegisterQueue("user.created", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		u := msg.Data.(UserCreated)
		if u.Email == "" {
			return fmt.Errorf("user %d has no email address", u.ID)
		}
		say("email:  welcome mail sent to %s", u.Email)
		return nil
	}, 2, tinymq.WithQueueName("welcome-email"))
	if err != nil {
		log.Fatal(err)
	}

	// One worker writes the audit trail in publish order.
	err = mq.RegisterQueue("user.created", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		say("audit:  #%d user %d created", msg.ID, msg.Data.(UserCreated).ID)
		return nil
	}, 1, tinymq.WithQueueName("audit"))
	if err != nil {
		log.Fatal(err)
	}

	if err := mq.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	users := []UserCreated{{1, "ada@example.com"}, {2, "alan@example.com"}, {3, ""}, {4, "grace@example.com"}}
	for _, u := range users {
		if err := mq.Publish("user.created", u); err != nil {
			log.Fatal(err)
		}
	}
	// Stop delivers everything accepted (user 3's email fails and is logged)
	// and waits for every worker.
	mq.Stop()
	fmt.Println("done: every event reached both queues")
}
