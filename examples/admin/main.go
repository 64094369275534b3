// Command admin serves TinyMQ's admin page over a small shop: orders routed by
// a topic exchange, payments that sometimes fail and are dead-lettered after
// their retries, and notifications routed by headers with an alternate
// exchange for what no queue wants. A publisher keeps publishing while the
// page, on 127.0.0.1, shows the queues live.
//
//	go run ./examples/admin                          # a few seconds, random port
//	go run ./examples/admin -port 8080 -duration 5m
//
// Open the printed URL in a browser. The program stops by itself after
// -duration, or on Ctrl-C, and stops the MQ gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"time"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

type Order struct {
	ID     int
	Amount int
}

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1 to serve the admin page on (0: a free one)")
	duration := flag.Duration("duration", 3*time.Second, "how long to run before stopping")
	flag.Parse()
	if err := run(*port, *duration); err != nil {
		log.Fatal(err)
	}
}

func run(port int, duration time.Duration) error {
	mq := tinymq.New()
	if err := declare(mq); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	if err := mq.Start(ctx); err != nil {
		return err
	}
	defer mq.Stop() // delivers what was accepted, then returns

	// The admin page, mounted under a prefix as net/http/pprof is.
	mux := http.NewServeMux()
	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", admin.Handler(mq)))
	mux.Handle("/{$}", http.RedirectHandler("/debug/tinymq/", http.StatusFound))
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	fmt.Printf("admin page: http://%s/debug/tinymq/ (for %v)\n", ln.Addr(), duration)

	// A publisher, stopped and joined before the MQ stops.
	pubCtx, stopPublishing := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { publish(pubCtx, mq) })

	select {
	case <-time.After(duration):
	case <-ctx.Done():
	case err = <-serveErr:
	}
	stopPublishing()
	wg.Wait()
	shutCtx, cancelShut := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShut()
	if err2 := srv.Shutdown(shutCtx); err == nil {
		err = err2
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	mq.Stop()
	st := mq.Stats()
	fmt.Printf("stopped: %d orders, %d payments published; %d payments dead-lettered\n",
		st.Exchanges["orders"].Published, st.Exchanges["payments"].Published, st.Queues["charge"].DeadLettered)
	return nil
}

// declare sets up the exchanges and queues.
func declare(mq *tinymq.MQ) error {
	work := func(d time.Duration) tinymq.ConsumerFunc {
		return func(ctx context.Context, msg *tinymq.Msg) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	errDeclined := errors.New("card declined")
	steps := []func() error{
		func() error {
			return mq.RegisterQueue("orders", tinymq.Topic, work(2*time.Millisecond), 2,
				tinymq.WithQueueName("billing"), tinymq.WithBindingKey("order.*.created"))
		},
		func() error {
			return mq.RegisterQueue("orders", tinymq.Topic, work(8*time.Millisecond), 1,
				tinymq.WithQueueName("shipping"), tinymq.WithBindingKey("order.#"))
		},
		func() error {
			return mq.RegisterQueue("payments.dead", tinymq.Fanout, work(time.Millisecond), 1,
				tinymq.WithQueueName("payments-dead"))
		},
		func() error {
			// Every fifth payment is declined every time: retried, then
			// dead-lettered.
			return mq.RegisterQueue("payments", tinymq.Fanout, tinymq.Handler(func(ctx context.Context, o Order) error {
				if o.ID%5 == 0 {
					return fmt.Errorf("order %d: %w", o.ID, errDeclined)
				}
				return nil
			}), 2, tinymq.WithQueueName("charge"),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Millisecond}),
				tinymq.WithDeadLetter("payments.dead", ""))
		},
		func() error {
			return mq.DeclareExchange("notifications", tinymq.Headers, tinymq.WithAlternateExchange("unrouted"))
		},
		func() error {
			return mq.RegisterQueue("unrouted", tinymq.Fanout, work(0), 1, tinymq.WithQueueName("unrouted-log"))
		},
		func() error {
			return mq.RegisterQueue("notifications", tinymq.Headers, work(4*time.Millisecond), 1,
				tinymq.WithQueueName("email"),
				tinymq.WithBindingArgs(map[string]any{"x-match": "any", "channel": "email", "urgent": true}))
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// publish publishes an order, its payment and a notification every 20ms
// until ctx ends.
func publish(ctx context.Context, mq *tinymq.MQ) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for id := 1; ; id++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		o := Order{ID: id, Amount: 100 * id}
		key := "order.eu.created"
		if id%3 == 0 {
			key = "order.eu.shipped"
		}
		channel := "email"
		if id%4 == 0 {
			channel = "sms" // no queue wants it: the alternate exchange takes it
		}
		for _, err := range []error{
			mq.Publish("orders", o, tinymq.WithRoutingKey(key)),
			mq.Publish("payments", o),
			mq.Publish("notifications", o, tinymq.WithHeaders(map[string]any{"channel": channel})),
		} {
			if err != nil && !errors.Is(err, tinymq.ErrStopped) {
				log.Printf("publish: %v", err)
			}
		}
	}
}
