package tinymqotel_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tinymq/tinymq"
	tinymqotel "github.com/tinymq/tinymq/otel"
)

// A payment fails once, is retried and succeeds: one trace holds the publish
// and both attempts.
func Example() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	mq := tinymq.New()
	_ = mq.RegisterQueue("payments", tinymq.Fanout, tinymqotel.Consumer(func(_ context.Context, m *tinymq.Msg) error {
		if m.Attempt == 1 {
			return errors.New("provider timeout")
		}
		return nil
	}, tinymqotel.WithTracerProvider(tp)), 1, tinymq.WithQueueName("charge"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	_ = mq.Start(context.Background())

	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	_ = pub.Publish(context.Background(), "payments", tinymqotel.Message{Data: 1200})
	mq.Stop()

	// Spans are exported as they end, so the first attempt may end before
	// the publish span does: pick the publish span out by its kind.
	var publish tracetest.SpanStub
	var process tracetest.SpanStubs
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindProducer {
			publish = s
		} else {
			process = append(process, s)
		}
	}
	fmt.Println(publish.Name, publish.SpanKind)
	for _, s := range process { // the attempts, in order
		var attempt int64
		for _, kv := range s.Attributes {
			if kv.Key == tinymqotel.AttemptKey {
				attempt = kv.Value.AsInt64()
			}
		}
		fmt.Printf("  %s %s attempt=%d status=%s child=%t\n", s.Name, s.SpanKind, attempt,
			s.Status.Code, s.Parent.SpanID() == publish.SpanContext.SpanID())
	}
	// Output:
	// publish payments producer
	//   process payments consumer attempt=1 status=Error child=true
	//   process payments consumer attempt=2 status=Unset child=true
}

// Consumer continues the trace of each message it is handed.
func ExampleConsumer() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	mq := tinymq.New()
	handle := func(ctx context.Context, m *tinymq.Msg) error {
		return nil // ctx carries the process span: start child spans from it
	}
	_ = mq.RegisterQueue("user.created", tinymq.Fanout, tinymqotel.Consumer(handle, tinymqotel.WithTracerProvider(tp)), 1,
		tinymq.WithQueueName("welcome"))
	_ = mq.Start(context.Background())
	pub := tinymqotel.NewPublisher(mq, tinymqotel.WithTracerProvider(tp))
	_ = pub.Publish(context.Background(), "user.created", tinymqotel.Message{Data: 42, Headers: map[string]any{"source": "signup"}})
	mq.Stop()

	spans := exp.GetSpans()
	fmt.Println(len(spans), "spans in", map[bool]string{true: "one trace", false: "two traces"}[spans[0].SpanContext.TraceID() == spans[1].SpanContext.TraceID()])
	// Output:
	// 2 spans in one trace
}
