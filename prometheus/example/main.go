// Command example serves a TinyMQ's metrics on 127.0.0.1 as an application
// would, scrapes itself once as Prometheus would, prints a few lines and
// exits.
//
//	cd prometheus && go run ./example
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tinymq/tinymq"
	tinymqprom "github.com/tinymq/tinymq/prometheus"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	// One option: every queue and every consumer of the MQ is measured, and
	// the metrics are registered with reg.
	reg := prometheus.NewRegistry()
	mq := tinymq.New(tinymqprom.Instrument(reg))

	// Payments fail for odd amounts, are retried once, then dead-lettered.
	err := tinymq.RegisterHandler(mq, "payments", tinymq.Fanout, func(_ context.Context, amount int) error {
		time.Sleep(time.Millisecond) // the work
		if amount%2 == 1 {
			return errors.New("card declined")
		}
		return nil
	}, 2, tinymq.WithQueueName("charge"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 5 * time.Millisecond}),
		tinymq.WithDeadLetter("payments.dead", ""))
	if err != nil {
		return err
	}
	err = mq.RegisterQueue("payments.dead", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return nil // file it for a human
	}, 1, tinymq.WithQueueName("charge-dead"))
	if err != nil {
		return err
	}
	if err := mq.Start(context.Background()); err != nil {
		return err
	}
	for amount := range 20 {
		if err := mq.Publish("payments", amount); err != nil {
			return err
		}
	}
	mq.Stop() // everything delivered, retried or dead-lettered

	// Serve /metrics on loopback, on a port the system picks.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}()

	// Scrape once and print the lines of the charge queue worth a look.
	url := "http://" + ln.Addr().String() + "/metrics"
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fmt.Println("scraped", url)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.Contains(line, `queue="charge"`) {
			continue
		}
		for _, want := range []string{"_delivered_total", "_succeeded_total", "_retried_total",
			"_dead_lettered_total", "_messages_ready", "_consumers", "_calls_stuck", "_seconds_count", "le=\"0.005\""} {
			if strings.Contains(line, want) {
				fmt.Println(" ", line)
			}
		}
	}
	return sc.Err()
}
