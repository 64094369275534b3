package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

type ctxKey string

// seen is what a test middleware recorded of each call: "name queue attempt
// outcome".
type seen struct {
	mu    sync.Mutex
	calls []string
}

func (s *seen) add(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, fmt.Sprintf(format, args...))
}

func (s *seen) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// recording is a middleware that records each call's queue, attempt and
// outcome, and passes a context value down to the consumer.
func recording(name string, s *seen) tinymq.Middleware {
	return func(next tinymq.DeliveryFunc) tinymq.DeliveryFunc {
		return func(ctx context.Context, d tinymq.Delivery[any]) error {
			s.add("%s in %s %d", name, d.Queue, d.Attempt)
			err := next(context.WithValue(ctx, ctxKey(name), d.ID), d)
			s.add("%s out %s %d %v", name, d.Queue, d.Attempt, err)
			return err
		}
	}
}

type mwEvent struct{ N int }

// One WithMiddleware wraps every consumer of every form, sees each call's
// metadata and outcome, and passes its context down, the first option
// outermost.
func TestMiddlewareWrapsEveryConsumerForm(t *testing.T) {
	var s seen
	m := tinymq.New(quiet(), tinymq.WithMiddleware(recording("a", &s)), tinymq.WithMiddleware(recording("b", &s)))
	got := make(chan string, 20)
	check := func(queue string, ctx context.Context) {
		if ctx.Value(ctxKey("a")) == nil || ctx.Value(ctxKey("b")) == nil {
			got <- queue + ": no context from the middleware"
			return
		}
		got <- queue
	}
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		check("func", ctx)
		return nil
	}, 1, tinymq.WithQueueName("func")))
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(ctx context.Context, _ mwEvent) error {
		check("handler", ctx)
		return nil
	}, 1, tinymq.WithQueueName("handler")))
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(ctx context.Context, _ tinymq.Delivery[mwEvent]) error {
		check("delivery", ctx)
		return nil
	}, 1, tinymq.WithQueueName("delivery")))
	for _, q := range []string{"sub", "subhandler", "subdelivery"} {
		require.NoError(t, m.DeclareQueue(q, "ev", tinymq.Fanout))
	}
	_, err := m.Consume("sub", func(ctx context.Context, _ *tinymq.Msg) error { check("sub", ctx); return nil }, 1)
	require.NoError(t, err)
	_, err = tinymq.ConsumeHandler(m, "subhandler", func(ctx context.Context, _ mwEvent) error { check("subhandler", ctx); return nil }, 1)
	require.NoError(t, err)
	_, err = tinymq.ConsumeDeliveries(m, "subdelivery", func(ctx context.Context, _ tinymq.Delivery[mwEvent]) error {
		check("subdelivery", ctx)
		return nil
	}, 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", mwEvent{1}))
	queues := recv(t, got, 6)
	stopWithin(t, m)
	assert.ElementsMatch(t, []string{"func", "handler", "delivery", "sub", "subhandler", "subdelivery"}, queues)
	calls := s.list()
	require.Len(t, calls, 24)
	for _, q := range queues {
		var mine []string
		for _, c := range calls {
			var name, dir, queue string
			var attempt int
			if _, err := fmt.Sscanf(c, "%s %s %s %d", &name, &dir, &queue, &attempt); err == nil && queue == q {
				mine = append(mine, c)
			}
		}
		assert.Equal(t, []string{"a in " + q + " 1", "b in " + q + " 1", "b out " + q + " 1 <nil>", "a out " + q + " 1 <nil>"}, mine,
			"queue %s: a is outermost", q)
	}
}

// A middleware sees every attempt and its outcome, and what it returns is the
// outcome the MQ acts on: here it fails a call the consumer succeeded, once.
func TestMiddlewareSeesRetriesAndDecidesTheOutcome(t *testing.T) {
	var s seen
	failFirst := func(next tinymq.DeliveryFunc) tinymq.DeliveryFunc {
		return func(ctx context.Context, d tinymq.Delivery[any]) error {
			err := next(ctx, d)
			if d.Attempt == 1 {
				return errors.New("middleware says no")
			}
			return err
		}
	}
	m := tinymq.New(quiet(), tinymq.WithMiddleware(recording("r", &s), failFirst))
	done := make(chan int, 4)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		done <- msg.Attempt
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	assert.Equal(t, []int{1, 2}, recv(t, done, 2))
	stopWithin(t, m)
	assert.Equal(t, []string{"r in q 1", "r out q 1 middleware says no", "r in q 2", "r out q 2 <nil>"}, s.list())
	st := m.Stats().Queues["q"]
	assert.Equal(t, uint64(1), st.Succeeded)
	assert.Equal(t, uint64(1), st.Failed)
}

// A middleware is user code: one that panics fails that delivery as a
// consumer's panic does, and the MQ goes on.
func TestMiddlewarePanicFailsOneDelivery(t *testing.T) {
	m := tinymq.New(quiet(), tinymq.WithMiddleware(func(next tinymq.DeliveryFunc) tinymq.DeliveryFunc {
		return func(ctx context.Context, d tinymq.Delivery[any]) error {
			if d.Data == "boom" {
				panic("middleware")
			}
			return next(ctx, d)
		}
	}))
	got := make(chan *tinymq.Msg, 4)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "boom"))
	require.NoError(t, m.Publish("ev", "fine"))
	assert.Equal(t, "fine", (<-got).Data)
	stopWithin(t, m)
	st := m.Stats().Queues["q"]
	assert.Equal(t, uint64(1), st.Succeeded)
	assert.Equal(t, uint64(1), st.Dropped, "the panicked delivery failed, and with no dead-letter exchange was dropped")
}

// A publish middleware sees every publish and its outcome, and the headers it
// adds reach the consumer; the first option is the outermost.
func TestPublishMiddlewareAddsHeadersAndSeesTheOutcome(t *testing.T) {
	var s seen
	ids := make(chan uint64, 4)
	stamp := func(name string) tinymq.PublishMiddleware {
		return func(next tinymq.PublishFunc) tinymq.PublishFunc {
			return func(ctx context.Context, p *tinymq.Publishing) error {
				h := map[string]any{name: "yes"}
				for k, v := range p.Headers {
					h[k] = v
				}
				p.Headers = h
				err := next(ctx, p)
				s.add("%s %s %s %v", name, p.Exchange, p.RoutingKey, err)
				if err == nil {
					ids <- p.ID
				}
				return err
			}
		}
	}
	m := tinymq.New(quiet(), tinymq.WithPublishMiddleware(stamp("outer"), stamp("inner")))
	defer close(ids)
	got := make(chan *tinymq.Msg, 4)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Direct, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithBindingKey("k")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1, tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"own": int64(1)})))
	msg := <-got
	assert.Equal(t, map[string]any{"own": int64(1), "outer": "yes", "inner": "yes"}, msg.Headers)
	assert.Equal(t, msg.ID, <-ids, "the middleware sees the message's ID")
	assert.Equal(t, msg.ID, <-ids)
	err := m.Publish("ev", 2, tinymq.WithRoutingKey("nowhere"))
	require.ErrorIs(t, err, tinymq.ErrNoRoute)
	stopWithin(t, m)
	calls := s.list()
	require.Len(t, calls, 4)
	assert.Equal(t, "inner ev k <nil>", calls[0])
	assert.Equal(t, "outer ev k <nil>", calls[1])
	assert.Contains(t, calls[2], "inner ev nowhere tinymq: no route")
}

// What a publish middleware changes is checked as the options are, and a
// middleware that panics fails the publish with a *PanicError: nothing is
// routed either way.
func TestPublishMiddlewareIsCheckedAndGuarded(t *testing.T) {
	bad := func(next tinymq.PublishFunc) tinymq.PublishFunc {
		return func(ctx context.Context, p *tinymq.Publishing) error {
			switch p.Data {
			case "panic":
				panic("publish middleware")
			case "headers":
				p.Headers = map[string]any{"x": struct{}{}}
			case "key":
				p.RoutingKey = string(make([]byte, 300))
			}
			return next(ctx, p)
		}
	}
	m := tinymq.New(quiet(), tinymq.WithPublishMiddleware(bad))
	got := make(chan *tinymq.Msg, 4)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	var pe *tinymq.PanicError
	require.ErrorAs(t, m.Publish("ev", "panic"), &pe)
	require.ErrorIs(t, m.Publish("ev", "headers"), tinymq.ErrInvalidHeaders)
	require.ErrorIs(t, m.Publish("ev", "key"), tinymq.ErrKeyTooLong)
	require.NoError(t, m.Publish("ev", "fine"))
	assert.Equal(t, "fine", (<-got).Data)
	stopWithin(t, m)
	assert.Equal(t, uint64(1), m.Stats().Queues["q"].Accepted)
}

// Options applies several options as one, in order, and WithSetup runs once
// New has applied them all, with the MQ.
func TestOptionsAndWithSetupConfigureAnIntegrationInOneOption(t *testing.T) {
	var s seen
	var setupMQ *tinymq.MQ
	integration := tinymq.Options(
		tinymq.WithMiddleware(recording("mw", &s)),
		nil,
		tinymq.WithSetup(func(m *tinymq.MQ) {
			setupMQ = m
			require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		}),
	)
	m := tinymq.New(quiet(), integration)
	require.Same(t, m, setupMQ)
	got := make(chan *tinymq.Msg, 1)
	_, err := m.Consume("q", sink(got), 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	<-got
	stopWithin(t, m)
	assert.Equal(t, []string{"mw in q 1", "mw out q 1 <nil>"}, s.list())
}
