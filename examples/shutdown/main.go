// Command shutdown shows a graceful shutdown on SIGINT or SIGTERM: stop
// accepting, let the workers finish what was accepted, and give up after a
// deadline, reporting how many messages were not delivered.
//
//	go run ./examples/shutdown
//
// It sends itself SIGTERM after publishing, as an orchestrator would; press
// Ctrl-C earlier to try it by hand.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tinymq/tinymq"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	mq := tinymq.New(tinymq.WithLogger(logger))

	var done atomic.Int64
	err := mq.RegisterQueue("jobs", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		select {
		case <-time.After(2 * time.Millisecond): // the work of one job
			done.Add(1)
			return nil
		case <-ctx.Done(): // Shutdown's deadline passed: give up promptly
			return ctx.Err()
		}
	}, 4, tinymq.WithQueueName("jobs"))
	if err != nil {
		log.Fatal(err)
	}

	// The consumers' context is not tied to the signal: a signal starts a
	// graceful shutdown, it does not abort the jobs in progress.
	if err := mq.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	sig, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	const jobs = 2000
	for i := range jobs {
		if err := mq.Publish("jobs", i); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("published %d jobs; sending SIGTERM to myself\n", jobs)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		log.Fatal(err)
	}

	<-sig.Done()
	fmt.Println("signal received: shutting down, 500ms deadline")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = mq.Shutdown(ctx)
	switch {
	case err == nil:
		fmt.Printf("all %d jobs done\n", done.Load())
	case errors.Is(err, tinymq.ErrUndelivered):
		fmt.Printf("deadline passed after %d jobs: %v\n", done.Load(), err)
		mq.Stop() // wait for the consumers still running; they saw ctx cancelled
	default:
		log.Fatal(err)
	}
	if err := mq.Publish("jobs", "late"); errors.Is(err, tinymq.ErrStopped) {
		fmt.Println("publishing after shutdown:", err)
	}
}
