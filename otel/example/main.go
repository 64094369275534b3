// Command example traces two orders through TinyMQ with OpenTelemetry and
// prints each trace as a tree: the request that published, the publish span,
// and under it every delivery attempt, retries and the dead letter included.
//
//	cd otel && go run ./example
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
	tinymqotel "github.com/tinymq/tinymq/otel"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	// In an application: an OTLP exporter behind a batch span processor.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	withTP := tinymqotel.WithTracerProvider(tp)

	mq := tinymq.New()
	ship := func(ctx context.Context, _ *tinymq.Msg) error {
		// Work of the consumer's own shows under its process span.
		_, span := tp.Tracer("example").Start(ctx, "print label")
		defer span.End()
		return nil
	}
	charge := func(_ context.Context, m *tinymq.Msg) error {
		if m.Data.(int) == 2 {
			return errors.New("card declined")
		}
		return nil
	}
	fileIt := func(context.Context, *tinymq.Msg) error { return nil }
	steps := []error{
		mq.RegisterQueue("orders", tinymq.Topic, tinymqotel.Consumer(ship, withTP), 1,
			tinymq.WithQueueName("ship"), tinymq.WithBindingKey("order.#")),
		mq.RegisterQueue("orders", tinymq.Topic, tinymqotel.Consumer(charge, withTP), 1,
			tinymq.WithQueueName("charge"), tinymq.WithBindingKey("order.#"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond}),
			tinymq.WithDeadLetter("orders.dead", "")),
		mq.RegisterQueue("orders.dead", tinymq.Fanout, tinymqotel.Consumer(fileIt, withTP), 1,
			tinymq.WithQueueName("charge-dead")),
		mq.Start(context.Background()),
	}
	if err := errors.Join(steps...); err != nil {
		return err
	}

	pub := tinymqotel.NewPublisher(mq, withTP)
	for id := 1; id <= 2; id++ {
		// The request that publishes: its span is the publish span's parent.
		ctx, span := tp.Tracer("example").Start(context.Background(), fmt.Sprintf("POST /orders (order %d)", id))
		err := pub.Publish(ctx, "orders", tinymqotel.Message{
			Data:       id,
			RoutingKey: "order.created",
			Headers:    map[string]any{"tenant": "acme"},
		})
		span.End()
		if err != nil {
			return err
		}
	}
	mq.Stop() // every attempt and the dead letter done

	printTraces(exp.GetSpans())
	return nil
}

// printTraces prints each trace as an indented tree, children in start order.
func printTraces(spans tracetest.SpanStubs) {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if s.Parent.IsValid() {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(ss []tracetest.SpanStub) {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].StartTime.Before(ss[j].StartTime) })
	}
	byStart(roots)
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Printf("%s%s [%s]%s%s\n", strings.Repeat("  ", depth+1), s.Name, s.SpanKind, describe(s.Attributes), status(s))
		kids := children[s.SpanContext.SpanID()]
		byStart(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		fmt.Printf("trace %s\n", r.SpanContext.TraceID())
		walk(r, 0)
	}
}

// describe picks the attributes worth a look.
func describe(attrs []attribute.KeyValue) string {
	var b strings.Builder
	for _, kv := range attrs {
		switch kv.Key {
		case "messaging.destination.subscription.name":
			fmt.Fprintf(&b, " queue=%s", kv.Value.String())
		case "messaging.message.id":
			fmt.Fprintf(&b, " id=%s", kv.Value.String())
		case "messaging.rabbitmq.destination.routing_key":
			fmt.Fprintf(&b, " key=%s", kv.Value.String())
		case tinymqotel.AttemptKey:
			fmt.Fprintf(&b, " attempt=%s", kv.Value.String())
		case tinymqotel.DeathReasonKey:
			fmt.Fprintf(&b, " died=%s", kv.Value.String())
		case tinymqotel.DeathQueueKey:
			fmt.Fprintf(&b, " in=%s", kv.Value.String())
		}
	}
	return b.String()
}

func status(s tracetest.SpanStub) string {
	if s.Status.Code == codes.Error {
		return " ERROR: " + s.Status.Description
	}
	return ""
}
