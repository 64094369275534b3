// Command retry shows bounded retries with exponential backoff, then
// dead-lettering: a payment consumer fails on a flaky provider, is retried up
// to three times, and what still fails lands in a dead-letter queue with its
// death record, while the other messages flow past the waiting retries.
//
//	go run ./examples/retry
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/tinymq/tinymq"
)

type Payment struct {
	ID     int
	Amount int
}

var errDeclined = errors.New("card declined")

func main() {
	mq := tinymq.New() // logs nothing by default; see WithLogger
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}

	// Dead letters go to a fanout exchange with a queue that files them.
	err := mq.RegisterQueue("payments.dead", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		d := msg.Deaths[0]
		say("dead:    payment %d after %d attempts (%s): %s", msg.Data.(Payment).ID, d.Attempts, d.Reason, d.LastError)
		return nil
	}, 1, tinymq.WithQueueName("payments-dead"))
	if err != nil {
		log.Fatal(err)
	}

	err = mq.RegisterQueue("payments", tinymq.Fanout, tinymq.Handler(func(ctx context.Context, p Payment) error {
		switch {
		case p.Amount < 0:
			// Retrying cannot fix this one: skip the remaining attempts.
			return tinymq.Permanent(fmt.Errorf("negative amount %d", p.Amount))
		case p.ID == 2:
			return errDeclined // fails every time: retried, then dead-lettered
		}
		say("charged: payment %d (%d cents)", p.ID, p.Amount)
		return nil
	}), 2,
		tinymq.WithQueueName("charge"),
		tinymq.WithRetry(tinymq.RetryPolicy{
			MaxAttempts:    3,
			InitialBackoff: 20 * time.Millisecond,
			MaxBackoff:     time.Second,
			Jitter:         0.2,
		}),
		tinymq.WithDeadLetter("payments.dead", ""),
	)
	if err != nil {
		log.Fatal(err)
	}

	if err := mq.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	for i, amount := range []int{1200, 500, -10, 990} {
		if err := mq.Publish("payments", Payment{ID: i + 1, Amount: amount}); err != nil {
			log.Fatal(err)
		}
	}
	mq.Stop() // waits for the retries and the dead letters

	st := mq.Stats().Queues["charge"]
	fmt.Printf("charge queue: accepted %d, succeeded %d, failed attempts %d, retried %d, dead-lettered %d\n",
		st.Accepted, st.Succeeded, st.Failed, st.Retried, st.DeadLettered)
}
