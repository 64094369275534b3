package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// The run-time topology on the broker: what the conformance suite cannot see
// (the broker's own state, reconnects, other processes, prefetch).

// rawChannel returns a channel on a connection of the test's own, closed
// when the test ends.
func rawChannel(t *testing.T) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(broker(t).URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	return ch
}

// brokerHasQueue asks the broker whether it has the queue without using it
// (a passive declaration would start a queue's x-expires again): it binds
// the queue to amq.fanout, which nothing publishes to, and unbinds it.
func brokerHasQueue(t *testing.T, queue string) bool {
	t.Helper()
	ch := rawChannel(t)
	err := ch.QueueBind(queue, "", "amq.fanout", false, nil)
	if err == nil {
		require.NoError(t, ch.QueueUnbind(queue, "", "amq.fanout", nil))
		return true
	}
	var ae *amqp091.Error
	require.True(t, errors.As(err, &ae) && ae.Code == amqp091.NotFound, "binding %q: %v", queue, err)
	return false
}

// brokerHasExchange asks the broker whether it has the exchange.
func brokerHasExchange(t *testing.T, exchange string) bool {
	t.Helper()
	err := rawChannel(t).ExchangeDeclarePassive(exchange, "fanout", true, false, false, false, nil)
	var ae *amqp091.Error
	if errors.As(err, &ae) && ae.Code == amqp091.NotFound {
		return false
	}
	require.NoError(t, err, "exchange %q", exchange)
	return true
}

// brokerQueue reads the queue's ready messages and consumers from the
// broker.
func brokerQueue(t *testing.T, queue string) amqp091.Queue {
	t.Helper()
	qi, err := rawChannel(t).QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err, "queue %q", queue)
	return qi
}

// waitFor polls cond until it holds, for at most 15 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}
		<-time.After(10 * time.Millisecond) // polling the broker: nothing to wait on
	}
}

// receive waits for one message from got and returns its string payload.
func receive(t *testing.T, got <-chan *tinymq.Msg, what string) string {
	t.Helper()
	select {
	case m := <-got:
		var s string
		require.NoError(t, m.Data.(tinymq.Encoded).Decode(&s), what)
		return s
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no message within 15s", what)
		return ""
	}
}

// collect returns a consumer that hands each message to the channel it
// returns.
func collect() (tinymq.ConsumerFunc, chan *tinymq.Msg) {
	got := make(chan *tinymq.Msg, 64)
	return func(_ context.Context, m *tinymq.Msg) error {
		got <- m
		return nil
	}, got
}

// connects is a log handler that signals each connection the engine made.
type connects chan struct{}

func (c connects) Enabled(context.Context, slog.Level) bool { return true }
func (c connects) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c connects) WithGroup(string) slog.Handler            { return c }
func (c connects) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "tinymq/amqp: connected to the broker" {
		c <- struct{}{}
	}
	return nil
}

func (c connects) await(t *testing.T, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the engine did not connect within 30s", what)
	}
}

func TestQueueExpiryIsTheXExpiresArgument(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout, tinymq.WithQueueExpiry(90*time.Second+time.Microsecond)))
	_, err := rawChannel(t).QueueDeclare(n("q"), true, false, false, false, amqp091.Table{"x-expires": int64(90001)})
	require.NoError(t, err, "the same queue, declared with x-expires in ms, rounded up")
	_, err = rawChannel(t).QueueDeclare(n("q"), true, false, false, false, amqp091.Table{"x-expires": int64(1000)})
	var ae *amqp091.Error
	require.True(t, errors.As(err, &ae) && ae.Code == amqp091.PreconditionFailed, "another x-expires: got %v", err)
	_, err = m.DeleteQueue(n("q"))
	require.NoError(t, err)
}

// TestRetryingMessagesGoWithTheirQueue: a message waiting for its retry, in
// the queue's wait queue, counts for IfEmpty, is purged with the queue, and
// is deleted with it, its wait queue too.
func TestRetryingMessagesGoWithTheirQueue(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	failed := make(chan struct{}, 8)
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		failed <- struct{}{}
		return errors.New("retry me in a minute")
	}, 1, tinymq.WithQueueName(n("q")),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Minute, MaxBackoff: time.Minute})))
	require.NoError(t, m.Start(context.Background()))
	scheduled := func(k int) func() bool {
		return func() bool { return m.Stats().Queues[n("q")].Scheduled == k }
	}
	wait := "tinymq.retry." + n("q") + ".60000ms" // declared at its first use

	for range 2 {
		require.NoError(t, m.Publish(n("ex"), "job"))
	}
	waitFor(t, "two messages waiting for their retry", scheduled(2))
	require.True(t, brokerHasQueue(t, wait), "the wait queue")
	_, err := m.DeleteQueue(n("q"), tinymq.IfEmpty())
	assert.ErrorIs(t, err, tinymq.ErrNotEmpty, "DeleteQueue IfEmpty of a queue whose messages wait for a retry")
	purged, err := m.PurgeQueue(n("q"))
	require.NoError(t, err)
	assert.Equal(t, 2, purged, "PurgeQueue counts the messages waiting for a retry")
	assert.Equal(t, 0, brokerQueue(t, wait).Messages, "the wait queue after the purge")

	require.NoError(t, m.Publish(n("ex"), "job"))
	waitFor(t, "a message waiting for its retry", scheduled(1))
	removed, err := m.DeleteQueue(n("q"))
	require.NoError(t, err)
	assert.Equal(t, 1, removed, "DeleteQueue counts the messages waiting for a retry")
	assert.False(t, brokerHasQueue(t, n("q")), "the queue on the broker")
	assert.False(t, brokerHasQueue(t, wait), "its wait queue on the broker")
}

// TestDeleteQueueIfUnusedCountsOtherProcessesConsumers: the broker refuses
// if-unused for a consumer of another MQ, which this one cannot see.
func TestDeleteQueueIfUnusedCountsOtherProcessesConsumers(t *testing.T) {
	n := uniq(t)
	m1 := newMQ(t)
	require.NoError(t, m1.RegisterQueue(n("ex"), tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m1.Start(context.Background()))
	waitFor(t, "the first MQ consumes", func() bool { return brokerQueue(t, n("q")).Consumers == 1 })

	m2 := newMQ(t)
	require.NoError(t, m2.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	_, err := m2.DeleteQueue(n("q"), tinymq.IfUnused())
	assert.ErrorIs(t, err, tinymq.ErrInUse)
	assert.True(t, brokerHasQueue(t, n("q")), "the queue after the refused delete")
	require.NoError(t, m2.Publish(n("ex"), "still declared"), "the refused delete kept the binding")
}

// TestCancelHandsPrefetchedMessagesBack: messages a subscription prefetched
// and did not begin go back to the queue at its Cancel, while its delivery
// in flight goes on.
func TestCancelHandsPrefetchedMessagesBack(t *testing.T) {
	n := uniq(t)
	m := newMQ(t, amqp.WithPrefetch(10))
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	require.NoError(t, m.Start(context.Background()))
	begun, release := make(chan struct{}), make(chan struct{})
	a, err := m.Consume(n("q"), func(context.Context, *tinymq.Msg) error {
		close(begun) // once: a second delivery to a would panic here
		<-release
		return nil
	}, 1)
	require.NoError(t, err)
	for range 4 {
		require.NoError(t, m.Publish(n("ex"), "job"))
	}
	<-begun
	waitFor(t, "the other three prefetched", func() bool { return brokerQueue(t, n("q")).Messages == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, a.Cancel(ctx), context.DeadlineExceeded, "Cancel with a delivery in flight")
	waitFor(t, "the prefetched messages back in the queue", func() bool { return brokerQueue(t, n("q")).Messages == 3 })
	close(release)
	require.NoError(t, a.Cancel(context.Background()))
	waitFor(t, "the delivery in flight acked", func() bool { return m.Stats().Queues[n("q")].Succeeded == 1 })

	consume, got := collect()
	_, err = m.Consume(n("q"), consume, 1)
	require.NoError(t, err)
	for range 3 {
		assert.Equal(t, "job", receive(t, got, "the other subscription"))
	}
}

// TestCancelFromItsOwnConsumerStopsTheBrokersDeliveries: a Cancel from the
// subscription's own consumer returns once the broker no longer lists the
// consumer (not waiting for the delivery it is called from), so that what is
// published after it goes to the queue's other consumers, not to this one,
// which would hand it back behind them.
func TestCancelFromItsOwnConsumerStopsTheBrokersDeliveries(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	require.NoError(t, m.Start(context.Background()))
	raw := rawChannel(t)
	type listed struct {
		consumers int
		err       error
	}
	after := make(chan listed, 1)
	var self atomic.Pointer[tinymq.Subscription]
	sub, err := m.Consume(n("q"), func(context.Context, *tinymq.Msg) error {
		if err := self.Load().Cancel(context.Background()); err != nil {
			after <- listed{err: err}
			return nil
		}
		qi, err := raw.QueueDeclarePassive(n("q"), true, false, false, false, nil)
		after <- listed{qi.Consumers, err}
		return nil
	}, 1)
	require.NoError(t, err)
	self.Store(sub)
	require.NoError(t, m.Publish(n("ex"), "cancel"))
	select {
	case got := <-after:
		require.NoError(t, got.err)
		assert.Equal(t, 0, got.consumers, "consumers the broker lists once Cancel returned")
	case <-time.After(15 * time.Second):
		t.Fatal("Cancel from the subscription's own consumer did not return")
	}
	require.NoError(t, sub.Cancel(context.Background()))
	assert.Equal(t, uint64(1), m.Stats().Queues[n("q")].Succeeded, "the delivery Cancel was called from")
}

// TestCancelledWhilePausedNeverConsumesAgain: a subscription whose consumer
// cancels it while its queue is paused (so the broker was not delivering to
// it and Cancel returns at once) does not consume again when the queue is
// resumed: what is published after the resume goes to the queue's other
// consumer, in order, never redelivered. Rounds, as the manager's choice
// between the resume and the cancel is a race.
func TestCancelledWhilePausedNeverConsumesAgain(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.Start(context.Background()))
	const rounds, k = 12, 10
	for r := range rounds {
		q, ex := n(fmt.Sprintf("q%d", r)), n(fmt.Sprintf("ex%d", r))
		require.NoError(t, m.DeclareQueue(q, ex, tinymq.Fanout))
		entered, goOn := make(chan struct{}, 1), make(chan struct{})
		done := make(chan error, 1)
		var calls atomic.Int32
		var self atomic.Pointer[tinymq.Subscription]
		a, err := m.Consume(q, func(context.Context, *tinymq.Msg) error {
			if calls.Add(1) > 1 {
				return nil // counted: the cancelled subscription consumed again
			}
			entered <- struct{}{}
			<-goOn
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := self.Load().Cancel(ctx)
			if err == nil {
				err = m.ResumeQueue(q)
			}
			for i := range k {
				if err == nil {
					err = m.Publish(ex, fmt.Sprintf("after-%d", i))
				}
			}
			done <- err
			return nil
		}, 1)
		require.NoError(t, err)
		self.Store(a)
		require.NoError(t, m.Publish(ex, "first"))
		select {
		case <-entered:
		case <-time.After(15 * time.Second):
			t.Fatalf("round %d: the first delivery did not come", r)
		}
		require.NoError(t, m.PauseQueue(q))
		got := make(chan *tinymq.Msg, 64)
		b, err := m.Consume(q, func(_ context.Context, msg *tinymq.Msg) error { got <- msg; return nil }, 1)
		require.NoError(t, err)
		close(goOn)
		select {
		case err := <-done:
			require.NoError(t, err, "round %d: Cancel, ResumeQueue and Publish from the consumer", r)
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the consumer that cancels did not return", r)
		}
		for i := range k {
			select {
			case msg := <-got:
				var s string
				require.NoError(t, msg.Data.(tinymq.Encoded).Decode(&s))
				require.Equal(t, fmt.Sprintf("after-%d", i), s, "round %d: the other subscription's order", r)
				require.False(t, msg.Redelivered, "round %d: %s came back from the cancelled subscription", r, s)
			case <-time.After(15 * time.Second):
				t.Fatalf("round %d: message %d did not reach the other subscription", r, i)
			}
		}
		require.NoError(t, b.Cancel(context.Background()))
		require.NoError(t, a.Cancel(context.Background()))
		require.Equal(t, int32(1), calls.Load(), "round %d: deliveries to the cancelled subscription", r)
	}
}

// TestDeleteQueueLetsDeliveriesInFlightFinish: the broker cancels the
// consumers of a deleted queue; a delivery in flight finishes, its
// subscription ends, and the queue is not declared again.
func TestDeleteQueueLetsDeliveriesInFlightFinish(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	require.NoError(t, m.Start(context.Background()))
	begun, release := make(chan struct{}), make(chan struct{})
	sub, err := m.Consume(n("q"), func(context.Context, *tinymq.Msg) error {
		close(begun)
		<-release
		return nil
	}, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish(n("ex"), "job"))
	require.NoError(t, m.Publish(n("ex"), "waits"))
	<-begun
	removed, err := m.DeleteQueue(n("q"))
	require.NoError(t, err)
	assert.Equal(t, 1, removed, "the message that waited")
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, sub.Cancel(ctx), "the subscription of the deleted queue ended")
	st := m.Stats()
	assert.Equal(t, uint64(1), st.Deleted.Succeeded, "the delivery in flight finished")
	assert.Equal(t, uint64(1), st.Deleted.Removed)
	assert.False(t, brokerHasQueue(t, n("q")), "the deleted queue, after its consumer's cancel")
}

// TestTopologyChangesSurviveAReconnect makes every kind of change, has the
// broker close every connection, and checks, once the engine connected again
// and declared its topology again, that what was removed stays removed and
// what consumes goes on.
func TestTopologyChangesSurviveAReconnect(t *testing.T) {
	b := broker(t)
	n := uniq(t)
	conns := make(connects, 16)
	m := tinymq.New(amqp.Engine(b.URL(), amqp.WithReconnectBackoff(20*time.Millisecond, 200*time.Millisecond)),
		tinymq.WithLogger(slog.New(conns)))
	t.Cleanup(m.Stop)
	require.NoError(t, m.Start(context.Background()))
	conns.await(t, "at Start")

	// A queue deleted under a consumer, and one expired unnoticed.
	require.NoError(t, m.RegisterQueue(n("deleted"), tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("deleted")),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Minute, MaxBackoff: time.Minute})))
	waitFor(t, "the consumer of the queue to delete", func() bool { return brokerQueue(t, n("deleted")).Consumers == 1 })
	_, err := m.DeleteQueue(n("deleted"))
	require.NoError(t, err)
	require.NoError(t, m.DeclareQueue(n("expired"), n("expired"), tinymq.Fanout, tinymq.WithQueueExpiry(100*time.Millisecond)))
	waitFor(t, "the broker expires the unused queue", func() bool { return !brokerHasQueue(t, n("expired")) })
	// A binding removed, and an exchange deleted with its delay queue.
	require.NoError(t, m.DeclareQueue(n("bound"), n("direct"), tinymq.Direct, tinymq.WithBindingKey("a"), tinymq.WithBindingKey("b")))
	require.NoError(t, m.Unbind(n("bound"), n("direct"), tinymq.WithBindingKey("a")))
	require.NoError(t, m.DeclareQueue(n("orphan"), n("gone"), tinymq.Fanout))
	require.NoError(t, m.Publish(n("gone"), "later", tinymq.WithDelay(time.Minute)))
	delay := "tinymq.delay." + n("gone") + ".60000ms"
	require.True(t, brokerHasQueue(t, delay), "the delay queue")
	require.NoError(t, m.DeleteExchange(n("gone")))
	// A subscription cancelled, one consuming, and one paused.
	cancelled, cancelledGot := collect()
	require.NoError(t, m.DeclareQueue(n("cancelled"), n("cancelled"), tinymq.Fanout))
	sub, err := m.Consume(n("cancelled"), cancelled, 1)
	require.NoError(t, err)
	waitFor(t, "the subscription to cancel consumes", func() bool { return brokerQueue(t, n("cancelled")).Consumers == 1 })
	require.NoError(t, sub.Cancel(context.Background()))
	consuming, consumingGot := collect()
	require.NoError(t, m.DeclareQueue(n("consumed"), n("consumed"), tinymq.Fanout))
	_, err = m.Consume(n("consumed"), consuming, 1)
	require.NoError(t, err)
	paused, pausedGot := collect()
	require.NoError(t, m.DeclareQueue(n("paused"), n("paused"), tinymq.Fanout))
	_, err = m.Consume(n("paused"), paused, 1)
	require.NoError(t, err)
	require.NoError(t, m.PauseQueue(n("paused")))

	out, err := b.Ctl(context.Background(), "close_all_connections", "tinymq test: reconnect")
	require.NoError(t, err, out)
	conns.await(t, "after the broker closed the connections")
	require.NoError(t, m.Publish(n("consumed"), "after the reconnect"))

	t.Run("ConsumeResumes", func(t *testing.T) {
		assert.Equal(t, "after the reconnect", receive(t, consumingGot, "the subscription"))
	})
	t.Run("DeletedQueueIsNotDeclaredAgain", func(t *testing.T) {
		assert.False(t, brokerHasQueue(t, n("deleted")), "the queue")
		assert.False(t, brokerHasQueue(t, "tinymq.retry."+n("deleted")+".60000ms"), "its wait queue")
	})
	t.Run("ExpiredQueueIsNotDeclaredAgain", func(t *testing.T) {
		assert.False(t, brokerHasQueue(t, n("expired")))
		waitFor(t, "Stats forgets the expired queue", func() bool {
			_, ok := m.Stats().Queues[n("expired")]
			return !ok
		})
		assert.Equal(t, uint64(1), m.Stats().ExpiredQueues)
		waitFor(t, "the MQ forgets the expired queue", func() bool {
			return !slices.ContainsFunc(m.Topology().Queues, func(q tinymq.QueueInfo) bool { return q.Name == n("expired") })
		})
		assert.ErrorIs(t, m.Bind(n("expired"), n("expired"), tinymq.Fanout), tinymq.ErrUnknownQueue, "a Bind of the expired queue")
	})
	t.Run("UnboundBindingIsNotDeclaredAgain", func(t *testing.T) {
		assert.ErrorIs(t, m.Publish(n("direct"), "a", tinymq.WithRoutingKey("a")), tinymq.ErrNoRoute)
		assert.NoError(t, m.Publish(n("direct"), "b", tinymq.WithRoutingKey("b")))
	})
	t.Run("DeletedExchangeIsNotDeclaredAgain", func(t *testing.T) {
		assert.False(t, brokerHasExchange(t, n("gone")), "the exchange")
		assert.False(t, brokerHasQueue(t, delay), "its delay queue")
		assert.True(t, brokerHasQueue(t, n("orphan")), "the queue that was bound to it")
	})
	t.Run("CancelledSubscriptionDoesNotComeBack", func(t *testing.T) {
		require.NoError(t, m.Publish(n("cancelled"), "nobody takes it"))
		qi := brokerQueue(t, n("cancelled"))
		assert.Equal(t, 0, qi.Consumers, "consumers")
		assert.Equal(t, 1, qi.Messages, "ready messages")
		assert.Empty(t, cancelledGot)
	})
	t.Run("PausedQueueStaysPaused", func(t *testing.T) {
		require.NoError(t, m.Publish(n("paused"), "held"))
		qi := brokerQueue(t, n("paused"))
		assert.Equal(t, 0, qi.Consumers, "consumers")
		assert.Equal(t, 1, qi.Messages, "ready messages")
		assert.Empty(t, pausedGot)
		require.NoError(t, m.ResumeQueue(n("paused")))
		assert.Equal(t, "held", receive(t, pausedGot, "the resumed subscription"))
	})
	m.Stop()
}

// reentrant is a log handler that publishes, through the MQ it logs for,
// for every line it gets.
type reentrant struct {
	m         *atomic.Pointer[tinymq.MQ]
	exchange  string
	published chan error
}

func (h reentrant) Enabled(context.Context, slog.Level) bool { return true }
func (h reentrant) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h reentrant) WithGroup(string) slog.Handler            { return h }
func (h reentrant) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "tinymq/amqp: queue deleted") {
		h.published <- h.m.Load().Publish(h.exchange, "from the logger")
	}
	return nil
}

// TestLoggerThatCallsTheMQDoesNotBlockTopologyChanges: DeleteQueue is
// called with the MQ's lock held; a logger that publishes, as it logs the
// delete, must not wait for that lock while the delete waits for it.
func TestLoggerThatCallsTheMQDoesNotBlockTopologyChanges(t *testing.T) {
	n := uniq(t)
	var mp atomic.Pointer[tinymq.MQ]
	h := reentrant{m: &mp, exchange: n("log"), published: make(chan error, 1)}
	m := tinymq.New(amqp.Engine(broker(t).URL()), tinymq.WithLogger(slog.New(h)))
	t.Cleanup(m.Stop)
	mp.Store(m)
	require.NoError(t, m.DeclareQueue(n("log"), n("log"), tinymq.Fanout))
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	deleted := make(chan error, 1)
	go func() { // joined below
		_, err := m.DeleteQueue(n("q"))
		deleted <- err
	}()
	select {
	case err := <-deleted:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("DeleteQueue did not return: it waits for a logger that waits for the MQ")
	}
	select {
	case err := <-h.published:
		require.NoError(t, err, "the logger's publish")
	case <-time.After(15 * time.Second):
		t.Fatal("the delete was not logged")
	}
}
