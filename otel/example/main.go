// Command example traces two orders through an MQ instrumented with one
// option, tinymqotel.Instrument, and prints each trace as a tree: the request
// that published, the publish span, and under it every delivery attempt, the
// retry and the dead letter included, with the links to the creation context.
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

// Order is what the shop publishes.
type Order struct {
	ID    int
	Total int
}

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

	// The one line: every publish and every consumer of the MQ is traced.
	mq := tinymq.New(tinymqotel.Instrument(tinymqotel.WithTracerProvider(tp)))

	ship := func(ctx context.Context, o Order) error {
		// Work of the consumer's own shows under its process span.
		_, span := tp.Tracer("example").Start(ctx, "print label")
		defer span.End()
		return nil
	}
	charge := func(_ context.Context, d tinymq.Delivery[Order]) error {
		if d.Data.ID == 2 {
			return errors.New("card declined")
		}
		return nil
	}
	fileIt := func(context.Context, *tinymq.Msg) error { return nil }
	steps := []error{
		tinymq.RegisterHandler(mq, "orders", tinymq.Topic, ship, 1,
			tinymq.WithQueueName("ship"), tinymq.WithBindingKey("order.#")),
		tinymq.RegisterDeliveryHandler(mq, "orders", tinymq.Topic, charge, 1,
			tinymq.WithQueueName("charge"), tinymq.WithBindingKey("order.#"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond}),
			tinymq.WithDeadLetter("orders.dead", "")),
		mq.DeclareQueue("charge-dead", "orders.dead", tinymq.Fanout),
	}
	_, err := mq.Consume("charge-dead", fileIt, 1)
	steps = append(steps, err, mq.Start(context.Background()))
	if err := errors.Join(steps...); err != nil {
		return err
	}

	for id := 1; id <= 2; id++ {
		// The request that publishes: its span is the publish span's parent.
		ctx, span := tp.Tracer("example").Start(context.Background(), fmt.Sprintf("POST /orders (order %d)", id))
		err := mq.PublishContext(ctx, "orders", Order{ID: id, Total: 1200},
			tinymq.WithRoutingKey("order.created"), tinymq.WithHeaders(map[string]any{"tenant": "acme"}))
		span.End()
		if err != nil {
			return err
		}
	}
	mq.Stop() // every attempt and the dead letter done

	printTraces(exp.GetSpans())
	return nil
}

// printTraces prints each trace as an indented tree. Siblings are ordered by
// queue, then start, so that the output does not depend on which worker ran
// first.
func printTraces(spans tracetest.SpanStubs) {
	names := map[trace.SpanID]string{}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		names[s.SpanContext.SpanID()] = s.Name
		if s.Parent.IsValid() {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	order := func(ss []tracetest.SpanStub) {
		sort.SliceStable(ss, func(i, j int) bool {
			qi, qj := queueOf(ss[i]), queueOf(ss[j])
			if qi != qj {
				return qi < qj
			}
			return ss[i].StartTime.Before(ss[j].StartTime)
		})
	}
	sort.SliceStable(roots, func(i, j int) bool { return roots[i].Name < roots[j].Name })
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Printf("%s%s [%s]%s%s%s\n", strings.Repeat("  ", depth+1), s.Name, s.SpanKind,
			describe(s.Attributes), links(s, names), status(s))
		kids := children[s.SpanContext.SpanID()]
		order(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		fmt.Println("trace")
		walk(r, 0)
	}
}

func queueOf(s tracetest.SpanStub) string {
	for _, kv := range s.Attributes {
		if kv.Key == "messaging.destination.subscription.name" {
			return kv.Value.AsString()
		}
	}
	return ""
}

// describe picks the attributes worth a look.
func describe(attrs []attribute.KeyValue) string {
	var b strings.Builder
	for _, kv := range attrs {
		switch kv.Key {
		case "messaging.destination.subscription.name":
			fmt.Fprintf(&b, " queue=%s", kv.Value.AsString())
		case "messaging.message.id":
			fmt.Fprintf(&b, " id=%s", kv.Value.AsString())
		case tinymqotel.AttemptKey:
			fmt.Fprintf(&b, " attempt=%d", kv.Value.AsInt64())
		case tinymqotel.DeathReasonKey:
			fmt.Fprintf(&b, " died=%s", kv.Value.AsString())
		case tinymqotel.DeathQueueKey:
			fmt.Fprintf(&b, " in=%s", kv.Value.AsString())
		}
	}
	return b.String()
}

// links names the spans s links to.
func links(s tracetest.SpanStub, names map[trace.SpanID]string) string {
	var out []string
	for _, l := range s.Links {
		out = append(out, names[l.SpanContext.SpanID()])
	}
	if len(out) == 0 {
		return ""
	}
	return " -> " + strings.Join(out, ", ")
}

func status(s tracetest.SpanStub) string {
	if s.Status.Code == codes.Error {
		return " ERROR: " + s.Status.Description
	}
	return ""
}
