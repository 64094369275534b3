// Command webhook shows the HTTP consumer: each message is POSTed as JSON to
// an endpoint, and a failing endpoint is retried with backoff. The endpoint
// here is a local server on 127.0.0.1 that fails its first call.
//
//	go run ./examples/webhook
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/webhook"
)

type OrderPlaced struct {
	Order string `json:"order"`
	Total int    `json:"total"`
}

func main() {
	// A webhook receiver, as another service would run it.
	var calls atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			fmt.Printf("receiver: %s attempt %s -> 503\n", body, r.Header.Get("X-TinyMQ-Attempt"))
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		fmt.Printf("receiver: %s attempt %s -> 204\n", body, r.Header.Get("X-TinyMQ-Attempt"))
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	consume, err := webhook.New("http://"+ln.Addr().String()+"/orders",
		webhook.WithTimeout(2*time.Second),
		webhook.WithHeader("Authorization", "Bearer example-token"))
	if err != nil {
		log.Fatal(err)
	}
	mq := tinymq.New()
	err = mq.RegisterQueue("orders", tinymq.Fanout, consume, 1,
		tinymq.WithQueueName("orders-webhook"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 50 * time.Millisecond}))
	if err != nil {
		log.Fatal(err)
	}
	if err := mq.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	if err := mq.Publish("orders", OrderPlaced{Order: "A-1001", Total: 4200}); err != nil {
		log.Fatal(err)
	}
	mq.Stop()
	st := mq.Stats().Queues["orders-webhook"]
	fmt.Printf("delivered after %d attempts (%d retried)\n", st.Delivered, st.Retried)
}
