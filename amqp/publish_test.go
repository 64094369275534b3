package amqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// fullQueue declares, on m, exchange ex with a queue of length limit 1 and
// reject-publish, and fills it.
func fullQueue(t *testing.T, m *tinymq.MQ, ex, queue string) {
	t.Helper()
	require.NoError(t, m.DeclareQueue(queue, ex, tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.RejectPublish)))
	require.NoError(t, m.Publish(ex, "fill"))
	require.ErrorIs(t, m.Publish(ex, "over"), tinymq.ErrQueueFull)
}

// publishers runs n goroutines that each call publish(i) for i in [0, each),
// and joins them.
func publishers(n, each int, publish func(i int)) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				publish(i)
			}
		}()
	}
	wg.Wait()
}

// TestRefusedPublishNeverReturnsNilUnderConcurrency: concurrent publishers
// alternating between a full reject-publish queue and one with room get
// ErrQueueFull for every refused message and nil for every one taken, though
// the broker confirms them out of order (a nack at once, acks after the
// fsync, several acks in one multiple ack).
func TestRefusedPublishNeverReturnsNilUnderConcurrency(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	fullQueue(t, m, n("full"), n("qfull"))
	require.NoError(t, m.DeclareQueue(n("qroom"), n("room"), tinymq.Fanout))

	const goroutines, each = 8, 60
	var mu sync.Mutex
	wrong := map[string]int{}
	taken := 0
	publishers(goroutines, each, func(i int) {
		if i%2 == 0 {
			err := m.Publish(n("full"), i)
			if !errors.Is(err, tinymq.ErrQueueFull) {
				mu.Lock()
				wrong[fmt.Sprint(err)]++
				mu.Unlock()
			}
			return
		}
		err := m.Publish(n("room"), i)
		mu.Lock()
		if err == nil {
			taken++
		} else {
			wrong["room: "+err.Error()]++
		}
		mu.Unlock()
	})
	assert.Empty(t, wrong, "publishes that got the wrong answer, by answer")
	assert.Equal(t, goroutines*each/2, taken)
	assert.Equal(t, 1, brokerQueue(t, n("qfull")).Messages, "the full queue took nothing")
	assert.Equal(t, taken, brokerQueue(t, n("qroom")).Messages, "the queue with room has every message confirmed")
}

// TestUnroutablePublishIsNoRouteAmongRefusals: concurrent publishers
// alternating between an exchange that routes nowhere and a full
// reject-publish queue get ErrNoRoute and ErrQueueFull, each for its own
// publish (a basic.return comes before the ack of the same message, and a
// nack may cover several messages).
func TestUnroutablePublishIsNoRouteAmongRefusals(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	fullQueue(t, m, n("full"), n("qfull"))
	require.NoError(t, m.DeclareExchange(n("nowhere"), tinymq.Fanout))

	const goroutines, each = 8, 100
	var mu sync.Mutex
	wrong := map[string]int{}
	publishers(goroutines, each, func(i int) {
		ex, want := n("full"), tinymq.ErrQueueFull
		if i%2 == 0 {
			ex, want = n("nowhere"), tinymq.ErrNoRoute
		}
		if err := m.Publish(ex, i); !errors.Is(err, want) {
			mu.Lock()
			wrong[fmt.Sprintf("want %v, got %v", want, err)]++
			mu.Unlock()
		}
	})
	assert.Empty(t, wrong, "publishes that got the wrong answer, by answer")
}

// TestPublishCutByShutdownSaysItsOutcomeIsUnknown: ErrStopped means that
// no queue got the message. A publish whose connection was lost before its
// confirm, and that the engine's Shutdown then kept from being sent again,
// returns ErrUnconfirmed (the broker may have it: here its queue's consumer
// had it), never ErrStopped.
func TestPublishCutByShutdownSaysItsOutcomeIsUnknown(t *testing.T) {
	n := uniq(t)
	proxy, err := broker(t).Proxy()
	require.NoError(t, err)
	defer proxy.Close()
	m := tinymq.New(amqp.Engine(proxy.URL(), amqp.WithPublishTimeout(time.Minute),
		amqp.WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond)), tinymq.WithLogger(logger()))
	defer m.Stop()
	got, goOn := make(chan struct{}), make(chan struct{})
	stopErr := make(chan error, 1)
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		close(got)
		<-goOn
		stopErr <- m.Shutdown(context.Background())
		return nil
	}, 1, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m.Start(context.Background()))

	require.True(t, proxy.HoldConn(0), "the publishing connection, dialed first") // its confirm never comes
	published := make(chan error, 1)
	go func() { published <- m.Publish(n("ex"), "seen by the consumer") }()
	select {
	case <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("the consumer never got the message")
	}
	proxy.Refuse()    // no connection to send it again on
	proxy.DropConn(0) // the confirm is lost with the connection
	close(goOn)
	assert.ErrorIs(t, <-stopErr, tinymq.ErrCalledFromConsumer)
	select {
	case err := <-published:
		assert.ErrorIs(t, err, amqp.ErrUnconfirmed)
		assert.NotErrorIs(t, err, tinymq.ErrStopped, "the consumer had the message")
	case <-time.After(15 * time.Second):
		t.Fatal("the Publish did not return after the Shutdown")
	}
}

// TestNamesOverAMQPsLimitAreRefusedAtOnce: a name over 255 bytes, or one
// whose retry wait queue (tinymq.retry.<queue>.<ms>) or delay queue
// (tinymq.delay.<exchange>.<ms>) would be, is refused at once with
// ErrKeyTooLong; nothing reaches the client library, which would close the
// connection that every other publish shares.
func TestNamesOverAMQPsLimitAreRefusedAtOnce(t *testing.T) {
	n := uniq(t)
	m := newMQ(t, amqp.WithPublishTimeout(time.Minute))
	long := func(size int) string { return n(strings.Repeat("x", size-len(n("")))) }
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	require.NoError(t, m.DeclareExchange(long(240), tinymq.Fanout), "a name of 240 bytes is fine")

	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second})
	tests := []struct {
		name string
		call func() error
	}{
		{"exchange", func() error { return m.DeclareExchange(long(256), tinymq.Fanout) }},
		{"alternate exchange", func() error {
			return m.DeclareExchange(n("ae"), tinymq.Fanout, tinymq.WithAlternateExchange(long(256)))
		}},
		{"queue", func() error { return m.DeclareQueue(long(256), n("ex"), tinymq.Fanout) }},
		{"queue's exchange", func() error {
			return m.RegisterQueue(long(256), tinymq.Fanout, nop, 1, tinymq.WithQueueName(n("q2")))
		}},
		{"dead-letter exchange", func() error {
			return m.DeclareQueue(n("q3"), n("ex"), tinymq.Fanout, tinymq.WithDeadLetter(long(256), ""))
		}},
		{"bound exchange", func() error { return m.Bind(n("q"), long(256), tinymq.Fanout) }},
		{"retry wait queue", func() error {
			return m.RegisterQueue(n("ex"), tinymq.Fanout, nop, 1, tinymq.WithQueueName(long(250)), retry)
		}},
		{"delay queue", func() error { return m.Publish(long(240), 1, tinymq.WithDelay(time.Second)) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := tc.call()
			assert.ErrorIs(t, err, tinymq.ErrKeyTooLong)
			assert.NotErrorIs(t, err, amqp.ErrUnconfirmed)
			assert.Less(t, time.Since(start), time.Second, "refused at once")
		})
	}
	start := time.Now()
	require.NoError(t, m.Publish(n("ex"), "unrelated"))
	assert.Less(t, time.Since(start), time.Second, "the connection was never closed")
	assert.Equal(t, 1, brokerQueue(t, n("q")).Messages)
}

// TestPublishCannotForgeTheEnginesOrTheBrokersHeaders: the engine's headers
// (tinymq-*) route retries and delays, and the broker's dead-lettering
// headers (x-death, x-first-death-*, x-last-death-*) say how often a message
// failed (Msg.Attempt, Msg.Deaths): a publish setting any of them is refused
// with ErrUnsupported, and nothing is sent.
func TestPublishCannotForgeTheEnginesOrTheBrokersHeaders(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	forged := []map[string]any{
		{"tinymq-attempt": int64(8)},
		{"tinymq-wait": "tinymq.retry.q.1000"},
		{"x-death": []any{map[string]any{"queue": "tinymq.retry." + n("q") + ".1000", "reason": "expired", "count": int64(7)}}},
		{"x-first-death-queue": n("q")},
		{"x-last-death-reason": "rejected"},
	}
	for _, h := range forged {
		assert.ErrorIs(t, m.Publish(n("ex"), "forged", tinymq.WithHeaders(h)), tinymq.ErrUnsupported, "%v", h)
	}
	assert.Equal(t, 0, brokerQueue(t, n("q")).Messages, "nothing was sent")
	require.NoError(t, m.Publish(n("ex"), "plain", tinymq.WithHeaders(map[string]any{"x-trace": "ok", "death": "fine"})))
}

// TestPublishCannotRouteWithCCOrBCC: RabbitMQ's sender-selected
// distribution routes a message with a CC or BCC header to the routing keys
// they list too, so a header of those names would reach queues that the
// exchange and the routing key do not route it to: the publish is refused
// with ErrUnsupported, and nothing is sent. (The broker reads those two
// names only, as they are written.)
func TestPublishCannotRouteWithCCOrBCC(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.DeclareQueue(n("a"), n("ex"), tinymq.Direct, tinymq.WithBindingKey("a")))
	require.NoError(t, m.DeclareQueue(n("b"), n("ex"), tinymq.Direct, tinymq.WithBindingKey("b")))
	for _, name := range []string{"CC", "BCC"} {
		err := m.Publish(n("ex"), "to a only", tinymq.WithRoutingKey("a"), tinymq.WithHeaders(map[string]any{name: []any{"b"}}))
		assert.ErrorIs(t, err, tinymq.ErrUnsupported, name)
	}
	assert.Equal(t, 0, brokerQueue(t, n("a")).Messages, "nothing was sent")
	require.NoError(t, m.Publish(n("ex"), "to a", tinymq.WithRoutingKey("a"), tinymq.WithHeaders(map[string]any{"cc": []any{"b"}})))
	assert.Equal(t, 1, brokerQueue(t, n("a")).Messages)
	assert.Equal(t, 0, brokerQueue(t, n("b")).Messages, "a header the broker does not read routes nothing")
}

// TestOneEngineOptionServesOneMQ: the option of one amqp.Engine call given to
// a second tinymq.New is refused with ErrInvalidOption (by the core, which
// never hands the engine to the second MQ), and the first MQ is unaffected.
func TestOneEngineOptionServesOneMQ(t *testing.T) {
	n := uniq(t)
	opt := amqp.Engine(broker(t).URL(), amqp.WithPublishTimeout(10*time.Second))
	first := tinymq.New(opt)
	defer first.Stop()
	second := tinymq.New(opt)
	defer second.Stop()
	err := second.DeclareExchange(n("ex"), tinymq.Fanout)
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	assert.ErrorContains(t, err, "serves another MQ")
	assert.ErrorIs(t, second.Publish(n("ex"), 1), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, second.Start(context.Background()), tinymq.ErrInvalidOption)
	require.NoError(t, first.DeclareQueue(n("q"), n("ex"), tinymq.Fanout), "the first MQ is not affected")
	require.NoError(t, first.Publish(n("ex"), 1))
}

// setMaxMessageSize sets the broker's max_message_size for the channels
// opened from now on, and puts back its default when the test ends.
func setMaxMessageSize(t *testing.T, n int) {
	t.Helper()
	b := broker(t)
	set := func(n int) error {
		out, err := b.Ctl(context.Background(), "eval", fmt.Sprintf("application:set_env(rabbit, max_message_size, %d).", n))
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	require.NoError(t, set(n))
	t.Cleanup(func() { assert.NoError(t, set(128<<20)) })
}

// TestMessageOverTheBrokersLimitIsRefusedWithoutDuplicates: a message
// larger than the broker's max_message_size fails with ErrTooLarge as soon
// as the broker refuses it (closing the channel), and the next one at once,
// without a round trip. The publishes that shared the channel are not sent
// again if the broker had them (they would be delivered twice): each is
// confirmed or says its outcome is unknown, and no message is in the queue
// twice.
func TestMessageOverTheBrokersLimitIsRefusedWithoutDuplicates(t *testing.T) {
	setMaxMessageSize(t, 1<<20)
	n := uniq(t)
	m := newMQ(t, amqp.WithPublishTimeout(time.Minute))
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	big := strings.Repeat("x", 2<<20)

	const goroutines = 4
	var (
		mu        sync.Mutex
		confirmed = map[int]bool{}
		wrong     = map[string]int{}
		wg        sync.WaitGroup
	)
	stop := make(chan struct{})
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g * 1_000_000; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				err := m.Publish(n("ex"), i)
				mu.Lock()
				switch {
				case err == nil:
					confirmed[i] = true
				case !errors.Is(err, amqp.ErrUnconfirmed):
					wrong[err.Error()]++
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	err := m.Publish(n("ex"), big)
	assert.ErrorIs(t, err, tinymq.ErrTooLarge)
	assert.Less(t, time.Since(start), 10*time.Second, "refused when the broker said so, not at the publish timeout")
	start = time.Now()
	assert.ErrorIs(t, m.Publish(n("ex"), big), tinymq.ErrTooLarge)
	assert.Less(t, time.Since(start), 10*time.Second, "the second is refused too, not at the publish timeout")
	close(stop)
	wg.Wait()
	assert.Empty(t, wrong, "small publishes that failed, by error")

	ch := rawChannel(t)
	seen := map[int]int{}
	for {
		d, ok, err := ch.Get(n("q"), true)
		require.NoError(t, err)
		if !ok {
			break
		}
		var i int
		require.NoError(t, json.Unmarshal(d.Body, &i))
		seen[i]++
	}
	for i, c := range seen {
		if c > 1 {
			t.Errorf("message %d is in the queue %d times", i, c)
		}
	}
	for i := range confirmed {
		assert.Equal(t, 1, seen[i], "confirmed message %d", i)
	}
	t.Logf("%d messages confirmed, %d in the queue", len(confirmed), len(seen))
}
