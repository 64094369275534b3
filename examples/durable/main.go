// Command durable shows a durable queue surviving kill -9. Run it, kill it
// while it works (Ctrl-\ or kill -9), and run it again: it prints what it
// recovered from its write-ahead log and finishes the work.
//
//	go run ./examples/durable            # publishes 10 orders, bills them slowly
//	kill -9 <pid>                        # or let -duration end it early
//	go run ./examples/durable            # "recovered 7 orders", bills the rest
//
// With no flags it publishes, bills for a second and stops with a deadline,
// leaving what it did not bill on disk, so a second run has something to
// recover even without a kill.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/tinymq/tinymq"
)

type Order struct {
	ID     int
	Amount int
}

func main() {
	dir := flag.String("dir", filepath.Join(os.TempDir(), "tinymq-durable-example"), "data directory")
	duration := flag.Duration("duration", time.Second, "how long to bill before stopping")
	flag.Parse()

	mq := tinymq.New(tinymq.WithDataDir(*dir))
	err := mq.RegisterQueue("orders", tinymq.Fanout, tinymq.Handler(func(ctx context.Context, o Order) error {
		select {
		case <-time.After(200 * time.Millisecond): // billing is slow
			fmt.Printf("billed order %d (%d cents)\n", o.ID, o.Amount)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), 1, tinymq.WithQueueName("billing"), tinymq.WithDurable(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5}))
	if err != nil {
		log.Fatal(err)
	}
	if n := mq.Stats().Queues["billing"].Depth; n > 0 {
		fmt.Printf("recovered %d orders from %s\n", n, *dir)
	} else {
		for i := 1; i <= 10; i++ {
			// Publish returns once the order is on disk.
			if err := mq.Publish("orders", Order{ID: i, Amount: 100 * i}); err != nil {
				log.Fatal(err)
			}
		}
		fmt.Printf("published 10 orders to %s (pid %d: kill -9 it, then run again)\n", *dir, os.Getpid())
	}
	if err := mq.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	time.Sleep(*duration)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := mq.Shutdown(ctx); err != nil {
		fmt.Println("stopped with orders left on disk:", err)
		mq.Stop()
		return
	}
	fmt.Println("all orders billed")
}
