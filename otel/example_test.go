package tinymqotel_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
	tinymqotel "github.com/tinymq/tinymq/otel"
)

// A payment fails once, is retried and succeeds: one trace holds the
// publish, both attempts and the retry between them, each consumer span
// linked to the publish span.
func Example() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	mq := tinymq.New(tinymqotel.Instrument(tinymqotel.WithTracerProvider(tp)))
	_ = tinymq.RegisterDeliveryHandler(mq, "payments", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[int]) error {
		if d.Attempt == 1 {
			return errors.New("provider timeout")
		}
		return nil
	}, 1, tinymq.WithQueueName("charge"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	_ = mq.Start(context.Background())
	_ = mq.Publish("payments", 1200) // a plain Publish is traced too
	mq.Stop()

	spans := exp.GetSpans()
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext.SpanID()] = s.Name
	}
	// Spans are exported as they end: put them in the order they began.
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].StartTime.Before(spans[j].StartTime) })
	for _, s := range spans {
		linked := len(s.Links) > 0 && names[s.Links[0].SpanContext.SpanID()] == "publish payments"
		fmt.Printf("%s (%s) parent=%q status=%s linked=%t\n", s.Name, s.SpanKind, names[s.Parent.SpanID()], s.Status.Code, linked)
	}
	// Output:
	// publish payments (producer) parent="" status=Unset linked=false
	// process payments (consumer) parent="publish payments" status=Error linked=true
	// retry payments (internal) parent="publish payments" status=Unset linked=true
	// process payments (consumer) parent="retry payments" status=Unset linked=true
}

// Instrument is one option of tinymq.New: typed consumers and plain
// publishes are traced with no change to the code that registers or
// publishes them.
func ExampleInstrument() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	mq := tinymq.New(tinymqotel.Instrument(tinymqotel.WithTracerProvider(tp)))
	type userCreated struct{ ID int }
	_ = tinymq.RegisterHandler(mq, "user.created", tinymq.Fanout, func(ctx context.Context, u userCreated) error {
		return nil // ctx carries the process span: start child spans from it
	}, 1, tinymq.WithQueueName("welcome"))
	_ = mq.Start(context.Background())
	_ = mq.Publish("user.created", userCreated{ID: 42})
	mq.Stop()

	spans := exp.GetSpans()
	sort.Slice(spans, func(i, j int) bool { return spans[i].Name > spans[j].Name })
	for _, s := range spans {
		fmt.Println(s.Name, s.SpanKind)
	}
	fmt.Println("one trace:", spans[0].SpanContext.TraceID() == spans[1].SpanContext.TraceID())
	// Output:
	// publish user.created producer
	// process user.created consumer
	// one trace: true
}
