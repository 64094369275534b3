package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

func nop(context.Context, *tinymq.Msg) error { return nil }

// uniq returns names unique to this test on the shared broker.
func uniq(t *testing.T) func(string) string {
	prefix := fmt.Sprintf("test.%d.", time.Now().UnixNano())
	return func(s string) string { return prefix + s }
}

func TestInvalidOptionsFailEveryCallWithoutPanicking(t *testing.T) {
	tests := []struct {
		name string
		url  string
		opts []amqp.Option
	}{
		{"bad URL", "http://example.com/", nil},
		{"nil option", "amqp://127.0.0.1:1/", []amqp.Option{nil}},
		{"publish timeout", "amqp://127.0.0.1:1/", []amqp.Option{amqp.WithPublishTimeout(0)}},
		{"backoff order", "amqp://127.0.0.1:1/", []amqp.Option{amqp.WithReconnectBackoff(time.Second, time.Millisecond)}},
		{"prefetch", "amqp://127.0.0.1:1/", []amqp.Option{amqp.WithPrefetch(0)}},
		{"recovery", "amqp://127.0.0.1:1/", []amqp.Option{amqp.WithAMQPConfig(amqp091.Config{Recovery: &amqp091.Recovery{}})}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := tinymq.New(amqp.Engine(tc.url, tc.opts...))
			assert.ErrorIs(t, m.RegisterQueue("ex", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q")), tinymq.ErrInvalidOption)
			assert.ErrorIs(t, m.DeclareExchange("ex", tinymq.Fanout), tinymq.ErrInvalidOption)
			assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrInvalidOption)
			m.Stop()
		})
	}
}

func TestQueueConcurrencyAbovePrefetchIsRefused(t *testing.T) {
	// Refused before any I/O: no broker needed.
	m := tinymq.New(amqp.Engine("amqp://127.0.0.1:1/", amqp.WithPrefetch(2)))
	defer m.Stop()
	err := m.RegisterQueue("ex", tinymq.Fanout, nop, 3, tinymq.WithQueueName("q"))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	assert.ErrorContains(t, err, "WithPrefetch(2)")
}

func TestUnreachableBrokerFailsDeclarationsWithinTheTimeout(t *testing.T) {
	m := tinymq.New(amqp.Engine("amqp://guest:guest@127.0.0.1:1/", amqp.WithPublishTimeout(200*time.Millisecond),
		amqp.WithReconnectBackoff(10*time.Millisecond, 50*time.Millisecond)))
	defer m.Stop()
	start := time.Now()
	err := m.RegisterQueue("ex", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q"))
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "no connection to the broker")
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestReservedNamesAreRefused(t *testing.T) {
	m := tinymq.New(amqp.Engine("amqp://127.0.0.1:1/"))
	defer m.Stop()
	for _, name := range []string{"tinymq.wait", "tinymq.retry.x.100", "tinymq.delay.x.5"} {
		assert.ErrorIs(t, m.RegisterQueue("ex", tinymq.Fanout, nop, 1, tinymq.WithQueueName(name)), tinymq.ErrUnsupported, name)
		assert.ErrorIs(t, m.DeclareExchange(name, tinymq.Fanout), tinymq.ErrUnsupported, name)
	}
}

// TestRetrySurvivesAConsumerRestart: the backoff waits in the broker, so a
// retry scheduled by one process is delivered to the next, as attempt 2.
func TestRetrySurvivesAConsumerRestart(t *testing.T) {
	n := uniq(t)
	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 300 * time.Millisecond})
	failed := make(chan int, 1)
	m1 := newMQ(t)
	require.NoError(t, m1.RegisterQueue(n("ex"), tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		failed <- msg.Attempt
		return errors.New("crash before finishing")
	}, 1, tinymq.WithQueueName(n("q")), retry))
	require.NoError(t, m1.Start(context.Background()))
	require.NoError(t, m1.Publish(n("ex"), "job"))
	assert.Equal(t, 1, <-failed)
	m1.Stop() // the retry is in the broker's wait queue

	got := make(chan *tinymq.Msg, 1)
	m2 := newMQ(t)
	require.NoError(t, m2.RegisterQueue(n("ex"), tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		got <- msg
		return nil
	}, 1, tinymq.WithQueueName(n("q")), retry))
	require.NoError(t, m2.Start(context.Background()))
	select {
	case msg := <-got:
		assert.Equal(t, 2, msg.Attempt)
		assert.Equal(t, n("ex"), msg.Exchange)
		assert.Empty(t, msg.Deaths, "retries are not deaths")
		assert.Nil(t, msg.Headers, "the engine's headers are hidden")
		var s string
		require.NoError(t, msg.Data.(tinymq.Encoded).Decode(&s))
		assert.Equal(t, "job", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the retry never reached the second consumer")
	}
}

// TestShutdownDeadlineLeavesMessagesToTheBroker: a message whose consumer
// was cut short by a Shutdown deadline is neither retried nor dead-lettered:
// the broker delivers it again, marked redelivered.
func TestShutdownDeadlineLeavesMessagesToTheBroker(t *testing.T) {
	n := uniq(t)
	begun := make(chan struct{})
	m1 := newMQ(t)
	require.NoError(t, m1.RegisterQueue(n("ex"), tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		close(begun)
		<-ctx.Done()
		return ctx.Err()
	}, 1, tinymq.WithQueueName(n("q")), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3})))
	require.NoError(t, m1.Start(context.Background()))
	require.NoError(t, m1.Publish(n("ex"), "job"))
	<-begun
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := m1.Shutdown(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "1 messages in consumers")
	m1.Stop()

	got := make(chan *tinymq.Msg, 1)
	m2 := newMQ(t)
	require.NoError(t, m2.RegisterQueue(n("ex"), tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		got <- msg
		return nil
	}, 1, tinymq.WithQueueName(n("q")), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3})))
	require.NoError(t, m2.Start(context.Background()))
	select {
	case msg := <-got:
		assert.True(t, msg.Redelivered, "Redelivered")
		assert.Equal(t, 1, msg.Attempt, "not counted as a retry")
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not delivered again")
	}
}

func TestStatsReadTheDepthFromTheBroker(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("q")),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2})))
	for i := range 5 {
		require.NoError(t, m.Publish(n("ex"), i))
	}
	st := m.Stats()
	assert.Equal(t, 5, st.Queues[n("q")].Ready)
	assert.Equal(t, 5, st.Queues[n("q")].Depth)
	assert.Equal(t, uint64(5), st.Exchanges[n("ex")].Published)
	assert.Equal(t, tinymq.Fanout, st.Exchanges[n("ex")].Kind)
}

func TestBrokerSideMismatchesAreReported(t *testing.T) {
	n := uniq(t)
	m1 := newMQ(t)
	require.NoError(t, m1.DeclareExchange(n("ex"), tinymq.Direct))
	require.NoError(t, m1.RegisterQueue(n("ex"), tinymq.Direct, nop, 1, tinymq.WithQueueName(n("q")), tinymq.WithBindingKey("k")))

	m2 := newMQ(t)
	assert.ErrorIs(t, m2.DeclareExchange(n("ex"), tinymq.Fanout), tinymq.ErrExchangeMismatch, "another type")
	assert.ErrorIs(t, m2.RegisterQueue(n("ex2"), tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("q")),
		tinymq.WithMessageTTL(time.Minute)), tinymq.ErrDuplicateQueue, "other arguments")
	// The refusals closed only their own channels.
	require.NoError(t, m2.RegisterQueue(n("ex3"), tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("q3"))))
	require.NoError(t, m2.Publish(n("ex3"), "still works"))
}

type nilErr struct{}

func (*nilErr) Error() string { panic("Error on a nil *nilErr") }

type isPanics struct{}

func (isPanics) Error() string                                { return "is panics" }
func (isPanics) Is(error) bool                                { panic("Is panics") }
func (isPanics) Unwrap() error                                { panic("Unwrap panics") }
func (panicHandler) Enabled(context.Context, slog.Level) bool { return true }

type panicHandler struct{}

func (panicHandler) Handle(context.Context, slog.Record) error { panic("the log handler panics") }
func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panicHandler) WithGroup(string) slog.Handler           { return h }

// TestHostileConsumersAndLoggers: a typed nil error, an error whose methods
// panic, a panicking consumer and a panicking log handler fail one delivery
// each and stop nothing.
func TestHostileConsumersAndLoggers(t *testing.T) {
	n := uniq(t)
	b := broker(t)
	m := tinymq.New(amqp.Engine(b.URL()), tinymq.WithLogger(slog.New(panicHandler{})))
	t.Cleanup(m.Stop)
	var mu sync.Mutex
	seen := map[string]int{}
	done := make(chan struct{})
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, tinymq.Handler(func(_ context.Context, kind string) error {
		mu.Lock()
		seen[kind]++
		if seen["typed-nil"] == 2 && seen["is-panics"] == 2 && seen["panic"] == 2 && seen["last"] == 1 {
			close(done)
		}
		mu.Unlock()
		switch kind {
		case "typed-nil":
			var e *nilErr
			return e
		case "is-panics":
			return isPanics{}
		case "panic":
			panic("consumer panics")
		case "reentrant":
			return m.Publish(n("ex"), "last")
		}
		return nil
	}), 1, tinymq.WithQueueName(n("q")), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	for _, kind := range []string{"typed-nil", "is-panics", "panic", "reentrant"} {
		require.NoError(t, m.Publish(n("ex"), kind))
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer stopped after hostile failures")
	}
	m.Stop()
	mu.Lock()
	defer mu.Unlock()
	for _, kind := range []string{"typed-nil", "is-panics", "panic"} {
		assert.Equal(t, 2, seen[kind], "%s: attempts", kind)
	}
}

// deleteOnBroker deletes a queue or an exchange behind the engine's back.
func deleteOnBroker(t *testing.T, queue, exchange string) {
	t.Helper()
	conn, err := amqp091.Dial(broker(t).URL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	if queue != "" {
		_, err = ch.QueueDelete(queue, false, false, false)
		require.NoError(t, err)
	}
	if exchange != "" {
		require.NoError(t, ch.ExchangeDelete(exchange, false, false))
	}
}

// TestTopologyDeletedOnTheBrokerIsDeclaredAgain: a queue deleted under a
// consumer (the broker cancels it) and an exchange deleted under a publisher
// (the broker closes the publishing channel) come back.
func TestTopologyDeletedOnTheBrokerIsDeclaredAgain(t *testing.T) {
	n := uniq(t)
	got := make(chan string, 16)
	m := newMQ(t)
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, tinymq.Handler(func(_ context.Context, s string) error {
		got <- s
		return nil
	}), 1, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(n("ex"), "before"))
	assert.Equal(t, "before", <-got)

	deleteOnBroker(t, n("q"), "")
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := m.Publish(n("ex"), "after queue deleted")
		if err == nil {
			break
		}
		require.ErrorIs(t, err, tinymq.ErrNoRoute, "until the queue is back")
		require.True(t, time.Now().Before(deadline), "the queue never came back")
		<-time.After(20 * time.Millisecond) // the consumer's cancel notice is on its way
	}
	select {
	case s := <-got:
		assert.Equal(t, "after queue deleted", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer did not resume on the declared-again queue")
	}

	deleteOnBroker(t, "", n("ex"))
	require.NoError(t, m.Publish(n("ex"), "after exchange deleted"), "sent again after the topology was declared again")
	select {
	case s := <-got:
		assert.Equal(t, "after exchange deleted", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the message sent again was not delivered")
	}
}

type blockHandler struct{ release <-chan struct{} }

func (blockHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockHandler) Handle(context.Context, slog.Record) error {
	<-h.release
	return nil
}
func (h blockHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockHandler) WithGroup(string) slog.Handler      { return h }

// TestBlockingLoggerDoesNotHoldShutdown: a log handler that blocks a worker
// (and the supervisor) cannot hold Shutdown far past its deadline; Stop, once
// the handler returns, joins everything.
func TestBlockingLoggerDoesNotHoldShutdown(t *testing.T) {
	n := uniq(t)
	b := broker(t)
	release := make(chan struct{})
	m := tinymq.New(amqp.Engine(b.URL()), tinymq.WithLogger(slog.New(blockHandler{release})))
	failed := make(chan struct{})
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		close(failed)
		return errors.New("logged by a handler that blocks")
	}, 1, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(n("ex"), 1))
	<-failed
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.Shutdown(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second, "Shutdown kept its deadline, roughly")
	close(release)
	m.Stop()
}

// lineHandler signals seen (once) when a line with message msg is logged.
type lineHandler struct {
	msg  string
	once *sync.Once
	seen chan struct{}
}

func newLineHandler(msg string) lineHandler {
	return lineHandler{msg: msg, once: new(sync.Once), seen: make(chan struct{})}
}

func (lineHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h lineHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h lineHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lineHandler) WithGroup(string) slog.Handler      { return h }

// closedPort returns a loopback port on which nothing listens.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// TestShutdownKeepsItsDeadlineWhileADeclarationWaitsForTheBroker: with the
// broker down, a RegisterQueue waiting for a connection (up to the publish
// timeout) neither holds Shutdown past its deadline nor outlives it.
func TestShutdownKeepsItsDeadlineWhileADeclarationWaitsForTheBroker(t *testing.T) {
	h := newLineHandler("tinymq/amqp: no connection to the broker; reconnecting")
	url := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", closedPort(t))
	m := tinymq.New(amqp.Engine(url, amqp.WithPublishTimeout(20*time.Second),
		amqp.WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond)), tinymq.WithLogger(slog.New(h)))
	declared := make(chan error, 1)
	go func() { declared <- m.RegisterQueue("ex", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q")) }()
	select {
	case <-h.seen: // the declaration started the engine, which found no broker
	case <-time.After(10 * time.Second):
		t.Fatal("the engine never tried to connect")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := m.Shutdown(ctx)
	took := time.Since(start)
	assert.Less(t, took, 2500*time.Millisecond, "Shutdown(1s) returned after %v (err %v)", took, err)
	select {
	case err := <-declared:
		assert.ErrorIs(t, err, tinymq.ErrStopped)
	case <-time.After(100 * time.Millisecond):
		t.Error("the RegisterQueue under way outlived Shutdown")
		<-declared
	}
	m.Stop()
}

// TestShutdownMakesAPublishWaitingForItsConfirmReturn: with a broker that
// holds back its replies, a Publish whose confirm is pending returns by the
// time Shutdown(1s) does, and says that its outcome is unknown (the broker
// has the message): not ErrStopped, which would mean no queue got it.
func TestShutdownMakesAPublishWaitingForItsConfirmReturn(t *testing.T) {
	n := uniq(t)
	proxy, err := broker(t).Proxy()
	require.NoError(t, err)
	defer proxy.Close()
	m := tinymq.New(amqp.Engine(proxy.URL(), amqp.WithPublishTimeout(time.Minute)), tinymq.WithLogger(logger()))
	defer m.Stop() // after proxy.Close, which lets it finish
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))

	proxy.Hold()
	published := make(chan error, 1)
	go func() { published <- m.Publish(n("ex"), "held") }()
	waitFor(t, "the broker routing the message", func() bool { return brokerQueue(t, n("q")).Messages == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	serr := m.Shutdown(ctx)
	took := time.Since(start)
	assert.Less(t, took, 2500*time.Millisecond, "Shutdown(1s) returned after %v (err %v)", took, serr)
	select {
	case err := <-published:
		assert.ErrorIs(t, err, amqp.ErrUnconfirmed)
		assert.NotErrorIs(t, err, tinymq.ErrStopped, "the message is in the queue")
	case <-time.After(100 * time.Millisecond):
		t.Error("the Publish under way outlived Shutdown")
		proxy.Close()
		<-published
	}
}
