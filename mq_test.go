package tinymq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/wal"
)

func TestFanoutDeliversEveryAcceptedMessageOnceToEveryQueue(t *testing.T) {
	const publishers, perPublisher = 8, 500
	c := newCounter()
	m := tinymq.New()
	queues := []string{"email", "audit", "search"}
	for i, name := range queues {
		require.NoError(t, m.RegisterQueue("users", tinymq.Fanout, c.consume, i+1, tinymq.WithQueueName(name)))
	}
	require.NoError(t, m.Start(context.Background()))

	var wg sync.WaitGroup
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perPublisher {
				assert.NoError(t, m.Publish("users", fmt.Sprint(p, i)))
			}
		}()
	}
	wg.Wait()
	m.Stop() // delivers everything accepted before it returns

	for _, q := range queues {
		got := c.seen[q]
		require.Len(t, got, publishers*perPublisher, "queue %s: distinct IDs", q)
		for id := uint64(1); id <= publishers*perPublisher; id++ {
			require.Equal(t, 1, got[id], "queue %s: deliveries of message %d", q, id)
		}
	}
}

func TestEveryQueueGetsItsOwnCopySharingData(t *testing.T) {
	a, b := make(chan *tinymq.Msg, 1), make(chan *tinymq.Msg, 1)
	m := started(t)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(a), 1, tinymq.WithQueueName("a")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(b), 1, tinymq.WithQueueName("b")))
	payload := &struct{ N int }{N: 7}
	require.NoError(t, m.Publish("ev", payload))
	ma, mb := recv(t, a, 1)[0], recv(t, b, 1)[0]
	assert.NotSame(t, ma, mb, "each queue gets its own Msg")
	assert.Equal(t, ma.ID, mb.ID, "the same ID in every copy")
	assert.Equal(t, uint64(1), ma.ID)
	assert.Same(t, payload, ma.Data)
	assert.Same(t, payload, mb.Data)
	assert.Equal(t, "a", ma.Queue)
	assert.Equal(t, "b", mb.Queue)
	assert.Equal(t, "ev", ma.Exchange)
}

func TestConsumersMayKeepAndModifyTheirMsg(t *testing.T) {
	// A queue with a length limit takes another publish path than one
	// without: a fanout to both must hand each its own, complete Msg.
	plain, bounded := make(chan *tinymq.Msg, 3), make(chan *tinymq.Msg, 3)
	scribble := func(ch chan<- *tinymq.Msg) tinymq.ConsumerFunc {
		return func(_ context.Context, msg *tinymq.Msg) error {
			ch <- msg
			msg.Exchange, msg.Queue, msg.ID, msg.Data = "scribbled", "scribbled", 0, nil
			return nil
		}
	}
	m := started(t)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, scribble(plain), 1, tinymq.WithQueueName("plain")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, scribble(bounded), 1, tinymq.WithQueueName("bounded"),
		tinymq.WithMaxLen(10, tinymq.RejectPublish)))
	for i := range 3 {
		require.NoError(t, m.Publish("ev", i))
	}
	m.Stop()
	for _, ch := range []chan *tinymq.Msg{plain, bounded} {
		msgs := recv(t, ch, 3)
		for i, msg := range msgs {
			assert.Equal(t, "scribbled", msg.Exchange, "what the consumer kept is its own")
			for _, later := range msgs[i+1:] {
				assert.NotSame(t, msg, later)
			}
		}
	}
	// The copies delivered after a consumer scribbled on its Msg are intact.
	got := make(chan *tinymq.Msg, 6)
	m2 := started(t)
	require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		got <- &tinymq.Msg{ID: msg.ID, Exchange: msg.Exchange, Queue: msg.Queue, Data: msg.Data}
		msg.Exchange, msg.ID = "scribbled", 0
		return nil
	}, 1, tinymq.WithQueueName("q")))
	for i := range 3 {
		require.NoError(t, m2.Publish("ev", i))
	}
	m2.Stop()
	for i, msg := range recv(t, got, 3) {
		assert.Equal(t, tinymq.Msg{ID: uint64(i + 1), Exchange: "ev", Queue: "q", Data: i}, *msg)
	}
}

func TestPublishNeverBlocksOnASlowQueue(t *testing.T) {
	const n = 10_000
	release := make(chan struct{})
	slowEntered := make(chan struct{}, 1)
	fast := make(chan *tinymq.Msg, n)
	m := started(t)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		select {
		case slowEntered <- struct{}{}:
		default:
		}
		<-release
		return nil
	}, 1, tinymq.WithQueueName("slow")))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(fast), 1, tinymq.WithQueueName("fast")))

	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range n {
			assert.NoError(t, m.Publish("ev", i))
		}
	}()
	// The slow consumer holds its first message until release is closed, yet
	// every publish returns and the fast queue gets every message.
	closedWithin(t, published, "publishing while a consumer is stuck")
	got := recv(t, fast, n)
	for i, msg := range got {
		require.Equal(t, i, msg.Data, "fast queue order")
	}
	closedWithin(t, slowEntered, "the slow consumer starting")
	close(release)
}

func TestExactlyConcurrencyWorkers(t *testing.T) {
	for _, concurrency := range []int{1, 3, 8} {
		t.Run(fmt.Sprint(concurrency), func(t *testing.T) {
			var active, peak atomic.Int32
			entered := make(chan struct{}, 100)
			release := make(chan struct{})
			done := make(chan struct{}, 100)
			m := started(t)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				n := active.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				entered <- struct{}{}
				<-release
				active.Add(-1)
				done <- struct{}{}
				return nil
			}, concurrency))
			const msgs = 40
			for i := range msgs {
				require.NoError(t, m.Publish("ev", i))
			}
			// Every worker is busy before any is released, so the peak equals the
			// number of workers exactly when no more than that many run.
			recv(t, entered, concurrency)
			close(release)
			recv(t, done, msgs)
			assert.Equal(t, int32(concurrency), peak.Load())
		})
	}
}

func TestConcurrencyOneDeliversInPublishOrder(t *testing.T) {
	const n = 20_000
	got := make(chan *tinymq.Msg, n)
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1))
	// Half before Start, half while running, so both paths keep the order.
	for i := range n / 2 {
		require.NoError(t, m.Publish("ev", i))
	}
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(m.Stop)
	for i := n / 2; i < n; i++ {
		require.NoError(t, m.Publish("ev", i))
	}
	for i, msg := range recv(t, got, n) {
		require.Equal(t, i, msg.Data)
		require.Equal(t, uint64(i+1), msg.ID)
	}
}

func TestPanicAndErrorAreRecoveredPerMessageAndLogged(t *testing.T) {
	log, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	handled := make(chan int, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		handled <- msg.Data.(int)
		switch msg.Data.(int) {
		case 1:
			panic("boom")
		case 3:
			return errors.New("smtp down")
		}
		return nil
	}, 1, tinymq.WithQueueName("email")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 5 {
		require.NoError(t, m.Publish("ev", i))
	}
	// One worker handles all five: the panic did not retire it.
	assert.Equal(t, []int{0, 1, 2, 3, 4}, recv(t, handled, 5))
	m.Stop()

	recs := records(t)
	require.Len(t, recs, 2)
	assert.Equal(t, "ERROR", recs[0]["level"])
	assert.Equal(t, "tinymq: message dropped", recs[0]["msg"])
	assert.Equal(t, "rejected", recs[0]["reason"])
	assert.Equal(t, "ev", recs[0]["exchange"])
	assert.Equal(t, "email", recs[0]["queue"])
	assert.Equal(t, float64(2), recs[0]["msg_id"])
	assert.Equal(t, float64(1), recs[0]["attempt"])
	assert.Contains(t, recs[0]["err"], "boom")
	assert.Contains(t, recs[0]["stack"], "TestPanicAndErrorAreRecoveredPerMessageAndLogged")
	assert.Equal(t, float64(4), recs[1]["msg_id"])
	assert.Equal(t, "smtp down", recs[1]["err"])
	assert.NotContains(t, recs[1], "stack")
}

func TestPanicErrorUnwrapsAnErrorValue(t *testing.T) {
	sentinel := errors.New("sentinel")
	pe := &tinymq.PanicError{Value: sentinel}
	assert.ErrorIs(t, pe, sentinel)
	assert.Nil(t, (&tinymq.PanicError{Value: 3}).Unwrap())
	assert.Equal(t, "tinymq: panic: 3", (&tinymq.PanicError{Value: 3}).Error())
}

func TestPublishBeforeStartIsDeliveredAfterStart(t *testing.T) {
	got := make(chan *tinymq.Msg, 3)
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 2))
	for i := range 3 {
		require.NoError(t, m.Publish("ev", i))
	}
	select {
	case <-got:
		t.Fatal("delivered before Start")
	default:
	}
	require.NoError(t, m.Start(context.Background()))
	recv(t, got, 3)
	m.Stop()
}

func TestRegisterQueueWhileRunning(t *testing.T) {
	m := started(t)
	first := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(first), 1))
	require.NoError(t, m.Publish("ev", "before"))
	late := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(late), 1))
	require.NoError(t, m.Publish("ev", "after"))
	assert.Equal(t, "after", recv(t, late, 1)[0].Data, "a queue added while running gets what follows, not what preceded")
	assert.Len(t, recv(t, first, 2), 2)
}

func TestCancellingStartContextStopsLikeStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	m := tinymq.New()
	entered := make(chan struct{})
	sawCancel := make(chan struct{})
	after := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
		if msg.Data == "block" {
			close(entered)
			<-ctx.Done()
			close(sawCancel)
			return ctx.Err()
		}
		after <- msg
		return nil
	}, 1))
	require.NoError(t, m.Start(ctx))
	require.NoError(t, m.Publish("ev", "block"))
	require.NoError(t, m.Publish("ev", "queued"))
	closedWithin(t, entered, "first delivery")
	cancel()
	closedWithin(t, sawCancel, "consumer context cancellation")
	// Stopping is graceful: what was accepted is still handed to the consumer.
	assert.Equal(t, "queued", recv(t, after, 1)[0].Data)
	m.Stop() // returns once the stop that cancel began has finished
	assert.ErrorIs(t, m.Publish("ev", "late"), tinymq.ErrStopped)
	assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrStopped)
}

func TestStopRacingPublishersLosesNothing(t *testing.T) {
	const publishers = 6
	var delivered atomic.Int64
	m := tinymq.New()
	for i := range 3 {
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			delivered.Add(1)
			return nil
		}, i+1))
	}
	require.NoError(t, m.Start(context.Background()))

	var accepted atomic.Int64
	var wg sync.WaitGroup
	running := make(chan struct{}, publishers)
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				err := m.Publish("ev", i)
				if err != nil {
					assert.ErrorIs(t, err, tinymq.ErrStopped)
					return
				}
				accepted.Add(1)
				if i == 100 {
					running <- struct{}{}
				}
			}
		}()
	}
	recv(t, running, publishers) // every publisher is in full flow
	m.Stop()
	wg.Wait()
	assert.Positive(t, accepted.Load())
	assert.Equal(t, 3*accepted.Load(), delivered.Load(), "every accepted message reached all 3 queues")
}

func TestStopIsIdempotentAndConcurrent(t *testing.T) {
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2))
	require.NoError(t, m.Start(context.Background()))
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() { defer wg.Done(); m.Stop() }()
	}
	wg.Wait()
	m.Stop()
	assert.NoError(t, m.Shutdown(context.Background()))
}

func TestStopBeforeStart(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		m := tinymq.New()
		m.Stop()
		assert.NoError(t, m.Shutdown(context.Background()))
		assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrStopped)
	})
	t.Run("with accepted messages it reports them", func(t *testing.T) {
		log, records := logRecords()
		m := tinymq.New(tinymq.WithLogger(log))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			t.Error("delivered after a stop before Start")
			return nil
		}, 1))
		require.NoError(t, m.Publish("ev", 1))
		require.NoError(t, m.Publish("ev", 2))
		err := m.Shutdown(context.Background())
		require.ErrorIs(t, err, tinymq.ErrUndelivered)
		assert.Contains(t, err.Error(), "2 messages")
		recs := records(t)
		require.Len(t, recs, 1)
		assert.Equal(t, float64(2), recs[0]["count"])
	})
}

func TestShutdownReturnsNilWhenDrained(t *testing.T) {
	var n atomic.Int32
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		n.Add(1)
		return nil
	}, 2))
	for i := range 100 {
		require.NoError(t, m.Publish("ev", i))
	}
	require.NoError(t, m.Start(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, m.Shutdown(ctx))
	assert.Equal(t, int32(100), n.Load())
}

func TestShutdownDeadlineCancelsConsumersAndCountsUndelivered(t *testing.T) {
	log, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	entered := make(chan struct{}, 1)
	var calls atomic.Int32
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, _ *tinymq.Msg) error {
		calls.Add(1)
		entered <- struct{}{}
		<-ctx.Done() // a consumer that is stuck until cancelled
		return ctx.Err()
	}, 1, tinymq.WithQueueName("stuck")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 10 {
		require.NoError(t, m.Publish("ev", i))
	}
	recv(t, entered, 1)

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has passed
	err := m.Shutdown(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, tinymq.ErrUndelivered)
	assert.Contains(t, err.Error(), "9 never reached a consumer, 1 were in consumers")
	m.Stop() // waits for the consumer, which returns now that its context is cancelled
	assert.Equal(t, int32(1), calls.Load(), "dropped messages never reach the consumer")
	assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrStopped)

	var found bool
	for _, r := range records(t) {
		if r["msg"] == "tinymq: shutdown deadline passed, messages not delivered" {
			found = true
			assert.Equal(t, "stuck", r["queue"])
			assert.Equal(t, float64(9), r["count"])
		}
	}
	assert.True(t, found, "undelivered messages are logged")
}

func TestBadInputGetsSentinelErrors(t *testing.T) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	var nilCtx context.Context // Start must reject it, not panic
	m := tinymq.New()
	require.NoError(t, m.RegisterQueue("fan", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q1")))
	require.NoError(t, m.DeclareExchange("empty", tinymq.Fanout))

	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"empty exchange name", func() error { return m.RegisterQueue("", tinymq.Fanout, nop, 1) }, tinymq.ErrEmptyName},
		{"nil consumer", func() error { return m.RegisterQueue("x", tinymq.Fanout, nil, 1) }, tinymq.ErrNilConsumer},
		{"concurrency 0", func() error { return m.RegisterQueue("x", tinymq.Fanout, nop, 0) }, tinymq.ErrInvalidConcurrency},
		{"negative concurrency", func() error { return m.RegisterQueue("x", tinymq.Fanout, nop, -3) }, tinymq.ErrInvalidConcurrency},
		{"zero kind", func() error { return m.RegisterQueue("x", 0, nop, 1) }, tinymq.ErrInvalidKind},
		{"unknown kind", func() error { return m.RegisterQueue("x", tinymq.ExchangeType(99), nop, 1) }, tinymq.ErrInvalidKind},
		{"same exchange, other kind", func() error { return m.RegisterQueue("fan", tinymq.Direct, nop, 1, tinymq.WithBindingKey("k")) }, tinymq.ErrExchangeMismatch},
		{"duplicate queue name", func() error { return m.RegisterQueue("fan", tinymq.Fanout, nop, 1, tinymq.WithQueueName("q1")) }, tinymq.ErrDuplicateQueue},
		{"empty queue name", func() error { return m.RegisterQueue("fan", tinymq.Fanout, nop, 1, tinymq.WithQueueName("")) }, tinymq.ErrEmptyName},
		{"nil queue option", func() error { return m.RegisterQueue("fan", tinymq.Fanout, nop, 1, nil) }, tinymq.ErrInvalidOption},
		{"nil filter", func() error { return m.RegisterQueue("fan", tinymq.Fanout, nop, 1, tinymq.WithFilter(nil)) }, tinymq.ErrInvalidOption},
		{"publish to unknown exchange", func() error { return m.Publish("nope", 1) }, tinymq.ErrUnknownExchange},
		{"publish with no queue bound", func() error { return m.Publish("empty", 1) }, tinymq.ErrNoRoute},
		{"zero PublishOption", func() error { return m.Publish("fan", 1, tinymq.PublishOption{}) }, tinymq.ErrInvalidOption},
		{"nil context", func() error { return m.Start(nilCtx) }, tinymq.ErrInvalidOption},
		{"nil publish context", func() error { return m.PublishContext(nilCtx, "fan", 1) }, tinymq.ErrInvalidOption},
		{"nil shutdown context", func() error { return m.Shutdown(nilCtx) }, tinymq.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, tt.call(), tt.want)
		})
	}

	require.NoError(t, m.Start(context.Background()))
	assert.ErrorIs(t, m.Start(context.Background()), tinymq.ErrAlreadyStarted)
	require.ErrorIs(t, m.Shutdown(nilCtx), tinymq.ErrInvalidOption, "refused while running too")
	require.NoError(t, m.Publish("fan", 1), "a refused Shutdown stops nothing")
	m.Stop()
	assert.ErrorIs(t, m.Publish("fan", 1), tinymq.ErrStopped)
	assert.ErrorIs(t, m.RegisterQueue("fan", tinymq.Fanout, nop, 1), tinymq.ErrStopped)
	assert.ErrorIs(t, m.DeclareExchange("other", tinymq.Fanout), tinymq.ErrStopped)
	assert.ErrorIs(t, m.Bind("q1", "fan", tinymq.Fanout), tinymq.ErrStopped)
}

func TestFailedRegistrationChangesNothing(t *testing.T) {
	m := tinymq.New()
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	require.ErrorIs(t, m.RegisterQueue("ev", tinymq.Direct, nop, 1), tinymq.ErrInvalidBinding)
	// The exchange was not declared by the failed call, so another kind is fine.
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, nop, 1))
	m.Stop()
}

// TestConcurrentRegistrationPublishingAndStats runs registrations, Binds and
// Stats calls while publishers are busy, for the race detector, and checks
// that each queue gets every message published after it was registered.
func TestConcurrentRegistrationPublishingAndStats(t *testing.T) {
	m := started(t)
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout))
	stop := make(chan struct{})
	var started atomic.Int64 // publishes begun
	var mu sync.Mutex
	var okStarts []int64 // the start number of every accepted publish
	progress := make(chan int64, 1)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := started.Add(1)
				if err := m.Publish("ev", 1); err != nil {
					assert.ErrorIs(t, err, tinymq.ErrNoRoute)
					continue
				}
				mu.Lock()
				okStarts = append(okStarts, n)
				mu.Unlock()
				select {
				case progress <- n:
				default:
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = m.Stats()
			}
		}
	}()
	type reg struct {
		name string
		mark int64 // publishes numbered above this began after the queue was registered
		got  atomic.Int64
	}
	regs := make([]*reg, 20)
	for i := range regs {
		r := &reg{name: fmt.Sprint("q", i)}
		regs[i] = r
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			r.got.Add(1)
			return nil
		}, 1, tinymq.WithQueueName(r.name)))
		r.mark = started.Load()
		require.NoError(t, m.Bind(r.name, "other", tinymq.Direct, tinymq.WithBindingKey(r.name)))
	}
	// Let publishing go on past the last registration before stopping.
	timeout := time.After(wait)
	for n := int64(0); n <= regs[len(regs)-1].mark; {
		select {
		case n = <-progress:
		case <-timeout:
			t.Fatal("publishers made no progress")
		}
	}
	close(stop)
	wg.Wait()
	m.Stop()
	s := m.Stats()
	for _, r := range regs {
		var after int64
		for _, n := range okStarts {
			if n > r.mark {
				after++
			}
		}
		assert.Equal(t, s.Queues[r.name].Accepted, uint64(r.got.Load()), "queue %s delivered all it accepted", r.name)
		assert.GreaterOrEqual(t, r.got.Load(), after, "queue %s got every message published after it was registered", r.name)
	}
}

// WithMaxMessageSize applies to every publish, in-memory queues included, as
// RabbitMQ's max_message_size does: Data whose size is known without
// encoding ([]byte, string, json.RawMessage, Encoded) is refused over the
// limit; other values bound for in-memory queues are never encoded and have
// no size to limit.
func TestMaxMessageSize(t *testing.T) {
	m := tinymq.New(tinymq.WithMaxMessageSize(10))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q")))
	defer m.Stop() // never started: the messages wait
	tests := []struct {
		name string
		data any
		want error
	}{
		{"[]byte over", make([]byte, 11), tinymq.ErrTooLarge},
		{"string over", "12345678901", tinymq.ErrTooLarge},
		{"json.RawMessage over", json.RawMessage(`"123456789"`), tinymq.ErrTooLarge},
		{"Encoded over", tinymq.Encoded{Body: make([]byte, 11)}, tinymq.ErrTooLarge},
		{"[]byte at the limit", make([]byte, 10), nil},
		{"string at the limit", "1234567890", nil},
		{"a struct, never encoded", struct{ A [100]byte }{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { require.ErrorIs(t, m.Publish("ev", tt.data), tt.want) })
	}
	require.Equal(t, 3, m.Stats().Queues["q"].Depth, "the queue holds only the messages accepted")
}

// WithMaxMessageSize(n) with n zero or negative means the default, 1020 MiB.
func TestMaxMessageSizeOfZeroOrLessIsTheDefault(t *testing.T) {
	for _, n := range []int{0, -5} {
		m := tinymq.New(tinymq.WithMaxMessageSize(n), quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1))
		require.NoError(t, m.Publish("ev", make([]byte, 4<<20)), "WithMaxMessageSize(%d) means the default", n)
		m.Stop()
	}
}

// A message over the limit is refused at once, also when its queue is full
// with a Block policy that would make a publish wait for room (and with a
// delay); after Stop it is refused as stopped or too large, never accepted.
func TestTooLargeIsRefusedBeforeWaitingForRoom(t *testing.T) {
	m := tinymq.New(tinymq.WithMaxMessageSize(10), quiet())
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"), tinymq.WithMaxLen(1, tinymq.Block)))
	require.NoError(t, m.Publish("ev", "small")) // not started: the queue is full
	done := make(chan error, 1)
	go func() {
		done <- m.PublishContext(context.Background(), "ev", strings.Repeat("x", 11), tinymq.WithDelay(time.Millisecond))
	}()
	assert.ErrorIs(t, recv(t, done, 1)[0], tinymq.ErrTooLarge, "an oversized publish to a full Block queue")
	m.Stop()
	err := m.Publish("ev", strings.Repeat("x", 11))
	assert.True(t, errors.Is(err, tinymq.ErrStopped) || errors.Is(err, tinymq.ErrTooLarge), "%v", err)
	assert.Equal(t, uint64(1), m.Stats().Queues["q"].Accepted)
}

func TestPublishRacingStopOrShutdownEndsEveryAcceptedMessageOnce(t *testing.T) {
	for _, how := range []string{"stop", "shutdown", "cancel start ctx", "durable stop", "mixed durable stop"} {
		t.Run(how, func(t *testing.T) {
			var mopts []tinymq.Option
			dir := t.TempDir()
			var dq, dq2 []tinymq.QueueOption
			if how == "durable stop" || how == "mixed durable stop" {
				mopts = append(mopts, tinymq.WithDataDir(dir), tinymq.WithSync(time.Millisecond))
				dq = []tinymq.QueueOption{tinymq.WithDurable()}
				if how == "durable stop" {
					dq2 = dq
				}
			}
			m := tinymq.New(mopts...)
			var okMu sync.Mutex
			okSeen := map[string]map[int]int{"q1": {}, "q2": {}}
			note := func(q string, n int) {
				okMu.Lock()
				okSeen[q][n]++
				okMu.Unlock()
			}
			var deadGot atomic.Int64
			require.NoError(t, tinymq.RegisterDeliveryHandler(m, "dlx", tinymq.Fanout, func(context.Context, tinymq.Delivery[any]) error {
				deadGot.Add(1)
				return nil
			}, 1, tinymq.WithQueueName("dead")))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
				n, _ := numberOf(msg.Data)
				if n%4 == 0 {
					return errors.New("fails")
				}
				if n%9 == 0 {
					select { // some work
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(time.Millisecond):
					}
				}
				note("q1", n)
				return nil
			}, 3, append([]tinymq.QueueOption{tinymq.WithQueueName("q1"), tinymq.WithDeadLetter("dlx", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})}, dq...)...))
			require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, p *numbered) error {
				note("q2", p.N)
				return nil
			}, 1, append([]tinymq.QueueOption{tinymq.WithQueueName("q2")}, dq2...)...))
			startCtx, cancelStart := context.WithCancel(context.Background())
			defer cancelStart()
			require.NoError(t, m.Start(startCtx))

			const pubs = 8
			var accepted sync.Map
			var okCount atomic.Int64
			var wg sync.WaitGroup
			started := make(chan struct{}, pubs)
			var badErr atomic.Value
			for p := range pubs {
				wg.Go(func() {
					for i := 0; ; i++ {
						n := p*1000000 + i
						err := m.Publish("ev", &numbered{N: n})
						if i == 50 {
							started <- struct{}{}
						}
						if err != nil {
							if !errors.Is(err, tinymq.ErrStopped) {
								badErr.Store(err)
							}
							return
						}
						accepted.Store(n, true)
						okCount.Add(1)
						if i > 200000 {
							return
						}
					}
				})
			}
			recv(t, started, pubs)
			switch how {
			case "stop", "durable stop", "mixed durable stop":
				stopWithin(t, m)
			case "shutdown":
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				err := m.Shutdown(ctx)
				cancel()
				if err != nil {
					require.ErrorIs(t, err, tinymq.ErrUndelivered)
				}
				stopWithin(t, m)
			case "cancel start ctx":
				cancelStart()
				stopWithin(t, m)
			}
			wg.Wait()
			assert.Nil(t, badErr.Load(), "Publish failed with something other than ErrStopped")
			st := m.Stats()
			ok := uint64(okCount.Load())
			t.Logf("%d publishes accepted; q1 %+v", ok, hCountsOf(st.Queues["q1"]))
			assert.Equal(t, ok, st.Exchanges["ev"].Published)
			for _, q := range []string{"q1", "q2"} {
				s := st.Queues[q]
				assert.Equal(t, ok, s.Accepted, "%s: all or nothing", q)
				assertLedger(t, q, s)
				okMu.Lock()
				assert.Equal(t, int(s.Succeeded), len(okSeen[q]), "%s: Succeeded vs consumer", q)
				for n, c := range okSeen[q] {
					if _, in := accepted.Load(n); !in {
						t.Errorf("%s: message %d consumed but its Publish failed", q, n)
					}
					if c != 1 {
						t.Errorf("%s: message %d succeeded %d times", q, n, c)
					}
				}
				okMu.Unlock()
			}
			s1 := st.Queues["q1"]
			assert.Equal(t, s1.DeadLettered, st.Queues["dead"].Accepted)
			assertLedger(t, "dead", st.Queues["dead"])
			if how != "shutdown" {
				assert.Zero(t, s1.Undelivered, "Stop delivers everything accepted")
				assert.Zero(t, st.Queues["q2"].Undelivered)
			}
			// A dead letter accepted by the dead queue reaches its consumer,
			// unless a Shutdown deadline dropped it there.
			assert.Equal(t, int64(s1.DeadLettered), deadGot.Load()+int64(st.Queues["dead"].Undelivered))
			if dq == nil {
				return
			}
			// Nothing is owed after a clean Stop: a restart redelivers nothing.
			m = tinymq.New(tinymq.WithDataDir(dir))
			got := make(chan *tinymq.Msg, 10)
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q1"), tinymq.WithDurable()))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, append([]tinymq.QueueOption{tinymq.WithQueueName("q2")}, dq2...)...))
			require.NoError(t, m.Start(context.Background()))
			st = m.Stats()
			assert.Zero(t, st.Queues["q1"].Depth)
			assert.Zero(t, st.Queues["q2"].Depth)
			stopWithin(t, m)
		})
	}
}

// A queue registered while publishers run receives every message published
// after RegisterQueue (or RegisterHandler...) returned.
func TestQueueRegisteredWhilePublishingGetsEveryLaterMessage(t *testing.T) {
	for _, f := range consumerForms() {
		for _, keyed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/keyed=%v", f.name, keyed), func(t *testing.T) {
				m := tinymq.New()
				kind := tinymq.Fanout
				var bind []tinymq.QueueOption
				var pub []tinymq.PublishOption
				if keyed {
					kind = tinymq.Direct
					bind = []tinymq.QueueOption{tinymq.WithBindingKey("k")}
					pub = []tinymq.PublishOption{tinymq.WithRoutingKey("k")}
				}
				require.NoError(t, m.RegisterQueue("ev", kind, func(context.Context, *tinymq.Msg) error { return nil }, 1,
					append([]tinymq.QueueOption{tinymq.WithQueueName("old")}, bind...)...))
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				var registered atomic.Bool
				var mu sync.Mutex
				must := map[int]bool{}
				got := map[int]bool{}
				progress := make(chan struct{}, 1)
				var wg sync.WaitGroup
				for p := range 2 {
					wg.Go(func() {
						after := 0
						for i := 0; after < 1000; i++ {
							n := p*1000000 + i
							was := registered.Load()
							if err := m.Publish("ev", &numbered{N: n}, pub...); err != nil {
								t.Errorf("Publish: %v", err)
								return
							}
							if was {
								mu.Lock()
								must[n] = true
								mu.Unlock()
								after++
							}
							if i == 100 {
								select {
								case progress <- struct{}{}:
								default:
								}
							}
						}
					})
				}
				recv(t, progress, 1)
				require.NoError(t, f.register(m, "ev", kind, func(_ context.Context, c formCall) error {
					mu.Lock()
					got[c.N] = true
					mu.Unlock()
					return nil
				}, 2, append([]tinymq.QueueOption{tinymq.WithQueueName("new")}, bind...)...))
				registered.Store(true)
				wg.Wait()
				stopWithin(t, m)
				missing := 0
				for n := range must {
					if !got[n] {
						missing++
					}
				}
				assert.Zero(t, missing, "messages published after RegisterQueue returned that the new queue never got (of %d)", len(must))
				s := m.Stats().Queues["new"]
				assert.Equal(t, uint64(len(got)), s.Succeeded)
				assertLedger(t, "new", s)
			})
		}
	}
}

// After a Shutdown deadline, delayed and retrying messages are counted
// undelivered once, and leave Depth and Scheduled.
func TestShutdownDeadlineClearsScheduledMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "retrying"))
		require.NoError(t, m.Publish("ev", "delayed", tinymq.WithDelay(time.Hour)))
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.ErrorIs(t, m.Shutdown(ctx), tinymq.ErrUndelivered)
		m.Stop()
		st := m.Stats().Queues["q"]
		assert.Zero(t, st.Depth)
		assert.Zero(t, st.Scheduled)
		assert.Equal(t, uint64(2), st.Undelivered)
		assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered+st.Dropped+st.Undelivered)
	})
}

// Shutdown with a context that has already ended, on an MQ with nothing to
// do, reports nothing undelivered: every time, not only when a race goes its
// way.
func TestShutdownOfAnIdleMQWithAnEndedContextIsClean(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 200 {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Shutdown(ctx), "run %d", i)
	}
}

// Shutdown returns ErrUndelivered for the messages the stop finds waiting in
// an in-memory queue that no consumer takes (paused, or without a
// consumer): whether the stop strands them before ctx ends or the abort of
// an ended ctx counts them, never nil (they are lost), and each is counted
// once.
func TestShutdownReportsWhatWaitsInAQueueThatNoConsumerTakes(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		paused bool
	}{
		{"paused, the stop completes", context.Background(), true},
		{"paused, ctx already ended", ended, true},
		{"no consumer, the stop completes", context.Background(), false},
		{"no consumer, ctx already ended", ended, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 200 {
				m := tinymq.New(quiet())
				require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
				if tc.paused {
					_, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 1)
					require.NoError(t, err)
					require.NoError(t, m.PauseQueue("q"))
				}
				require.NoError(t, m.Start(context.Background()))
				require.NoError(t, m.Publish("ev", i))
				err := m.Shutdown(tc.ctx)
				require.ErrorIs(t, err, tinymq.ErrUndelivered, "run %d", i)
				require.Contains(t, err.Error(), "1 ", "run %d: counted once", i)
				require.Equal(t, uint64(1), m.Stats().Queues["q"].Undelivered, "run %d", i)
			}
		})
	}
}

// A graceful stop waits for the dead letters on their way from a queue that
// no longer holds them to the dead-letter exchange's queues: a message that
// expires at the head of a queue no consumer takes, or that a publish
// evicts from a full DropHead queue, as the stop begins. Each is delivered
// to the dead-letter queue's consumer or stranded and returned by Shutdown,
// never dropped because the stop closed its target.
func TestStopWaitsForDeadLettersOnTheirWay(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  func(run int) tinymq.QueueOption
		pubs bool // a publisher goroutine races the stop
	}{
		{"expired at the head", func(run int) tinymq.QueueOption {
			return tinymq.WithMessageTTL(time.Duration(1+run%40) * 5 * time.Microsecond) // around the stop's own time
		}, false},
		{"evicted by a publish", func(int) tinymq.QueueOption { return tinymq.WithMaxLen(2, tinymq.DropHead) }, true},
	} {
		for _, consumed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, dead letters consumed %v", tc.name, consumed), func(t *testing.T) {
				for i := range 300 {
					m := tinymq.New(quiet())
					// A filter that yields widens the window between a dead
					// letter's leaving its queue and its arrival.
					require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
						runtime.Gosched()
						return true
					})))
					var got atomic.Uint64
					if consumed {
						_, err := m.Consume("dead", func(context.Context, *tinymq.Msg) error {
							got.Add(1)
							return nil
						}, 1)
						require.NoError(t, err)
					}
					require.NoError(t, m.DeclareQueue("src", "ev", tinymq.Fanout, tc.opt(i), tinymq.WithDeadLetter("dlx", "")))
					require.NoError(t, m.Start(context.Background()))
					for j := range 5 {
						require.NoError(t, m.Publish("ev", j))
					}
					published := make(chan struct{})
					go func() {
						defer close(published)
						for tc.pubs && m.Publish("ev", 0) == nil {
						}
					}()
					err := m.Shutdown(context.Background())
					<-published
					src, dead := m.Stats().Queues["src"], m.Stats().Queues["dead"]
					require.Zero(t, src.Dropped, "run %d: a dead letter was dropped by the stop: %+v", i, src)
					require.Equal(t, src.DeadLettered, dead.Accepted, "run %d", i)
					if consumed {
						require.Equal(t, dead.Accepted, got.Load(), "run %d: every dead letter reached the consumer", i)
					} else {
						require.Equal(t, dead.Accepted, dead.Undelivered, "run %d: every dead letter was stranded", i)
					}
					if src.Undelivered+dead.Undelivered > 0 {
						require.ErrorIs(t, err, tinymq.ErrUndelivered, "run %d", i)
					} else {
						require.NoError(t, err, "run %d", i)
					}
					assertLedger(t, "src", src)
					assertLedger(t, "dead", dead)
				}
			})
		}
	}
}

// A stop waits for a dead letter on its way from a queue that no longer
// holds it into a queue that no consumer takes (here held in the target's
// filter): it lands, and the stop strands it there with what waits in the
// source, and says so; it is neither dropped nor left uncounted.
func TestStopWaitsForADeadLetterOnItsWayIntoAQueueWithNoConsumer(t *testing.T) {
	m := tinymq.New(quiet())
	inFilter, releaseFilter := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	openFilter := sync.OnceFunc(func() { close(releaseFilter) })
	t.Cleanup(openFilter)
	require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
		once.Do(func() {
			inFilter <- struct{}{}
			<-releaseFilter
		})
		return true
	})))
	declareQ(t, m, "src", tinymq.WithDeadLetter("dlx", ""))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "expires", tinymq.WithExpiration(time.Millisecond)))
	require.NoError(t, m.Publish("ev", "waits"))
	recv(t, inFilter, 1) // the head expired; its dead letter is in dead's filter

	stopped := make(chan error, 1)
	go func() { stopped <- m.Shutdown(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned %v with a dead letter on its way", err)
	case <-time.After(20 * time.Millisecond): // the stop has begun and waits
	}
	openFilter()
	var err error
	select {
	case err = <-stopped:
	case <-time.After(wait):
		t.Fatal("Shutdown did not return once the dead letter landed")
	}
	require.ErrorIs(t, err, tinymq.ErrUndelivered)
	assert.Contains(t, err.Error(), "2 messages")
	s := m.Stats().Queues
	assertLedger(t, "src", s["src"])
	assertLedger(t, "dead", s["dead"])
	assert.Equal(t, uint64(1), s["src"].Undelivered)
	assert.Equal(t, uint64(1), s["src"].DeadLettered)
	assert.Zero(t, s["src"].Dropped)
	assert.Equal(t, uint64(1), s["dead"].Undelivered, "the dead letter landed, and was stranded")
}

// A stop ends while messages cycle through a queue that no consumer takes:
// the classic retry loop, a consumer that always fails dead-letters into a
// queue with no consumer, which dead-letters back when the TTL passes or
// when DropHead evicts for the next one. Once the stop begins, that queue
// holds still (its messages no longer expire, its limit no longer evicts),
// the rest drains into it, and the stop strands what it holds, counted and
// returned by Shutdown.
func TestStopEndsWhileMessagesCycleThroughAQueueThatNoConsumerTakes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opt   tinymq.QueueOption
		stats func(tinymq.QueueStats) uint64
	}{
		{"TTL", tinymq.WithMessageTTL(time.Millisecond), func(s tinymq.QueueStats) uint64 { return s.Expired }},
		{"DropHead", tinymq.WithMaxLen(5, tinymq.DropHead), func(s tinymq.QueueStats) uint64 { return s.Overflowed }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tinymq.New(quiet())
			require.NoError(t, m.RegisterQueue("work", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
				return errors.New("poison")
			}, 2, tinymq.WithQueueName("work"), tinymq.WithDeadLetter("wait", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, Jitter: 1})))
			require.NoError(t, m.DeclareQueue("wait", "wait", tinymq.Fanout, tc.opt, tinymq.WithDeadLetter("work", "")))
			require.NoError(t, m.Start(context.Background()))
			for i := range 50 {
				require.NoError(t, m.Publish("work", i))
			}
			require.Eventually(t, func() bool { return tc.stats(m.Stats().Queues["wait"]) >= 100 }, wait, time.Millisecond, "the messages cycle")
			stopped := make(chan error, 1)
			go func() { stopped <- m.Shutdown(context.Background()) }()
			var err error
			select {
			case err = <-stopped:
			case <-time.After(wait):
				buf := make([]byte, 1<<20)
				t.Fatalf("the stop did not end: %+v\n%s", m.Stats().Queues, buf[:runtime.Stack(buf, true)])
			}
			st := m.Stats().Queues
			require.ErrorIs(t, err, tinymq.ErrUndelivered)
			assert.Equal(t, uint64(50), st["wait"].Undelivered, "every message ended in the queue that holds still")
			assertLedger(t, "work", st["work"])
			assertLedger(t, "wait", st["wait"])
		})
	}
}

// A Shutdown deadline that passes while a dead letter is on its way (an
// eviction settled by the publisher, held in the dead-letter queue's filter)
// does not return nil, and the Stop after it waits until that dead letter
// has reached its end: every accepted message is then accounted for.
func TestStopAfterAShutdownDeadlineWaitsForADeadLetterOnItsWay(t *testing.T) {
	m := tinymq.New(quiet())
	entered, release := make(chan struct{}, 1), make(chan struct{})
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open)
	require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout, tinymq.WithFilter(func(*tinymq.Msg) bool {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return true
	})))
	require.NoError(t, m.DeclareQueue("src", "ev", tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.DropHead), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", 1))
	published := make(chan error, 1)
	go func() { published <- m.Publish("ev", 2) }() // evicts 1, whose dead letter waits in the filter
	recv(t, entered, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := m.Shutdown(ctx)
	require.Error(t, err, "a dead letter was on its way")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	stopped := make(chan struct{})
	go func() {
		m.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatalf("Stop returned with the dead letter still on its way: %+v", m.Stats().Queues["src"])
	case <-time.After(50 * time.Millisecond): // it waits
	}
	open()
	closedWithin(t, stopped, "Stop")
	require.NoError(t, <-published)
	st := m.Stats().Queues
	assertLedger(t, "src", st["src"])
	assertLedger(t, "dead", st["dead"])
	assert.Equal(t, uint64(1), st["src"].Overflowed)
	assert.Equal(t, uint64(1), st["src"].Dropped+st["src"].DeadLettered)
}

func TestStopReleasesBlockedPublishers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release
			return nil
		}, 1, tinymq.WithMaxLen(1, tinymq.Block)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		synctest.Wait()
		require.NoError(t, m.Publish("ev", 2))
		done := make(chan error)
		go func() { done <- m.Publish("ev", 3) }()
		synctest.Wait()
		stopped := make(chan struct{})
		go func() { m.Stop(); close(stopped) }()
		require.ErrorIs(t, <-done, tinymq.ErrStopped)
		close(release)
		<-stopped
	})
}

func TestShutdownCountsScheduledMessagesAsUndelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			t.Error("the delayed message must not be delivered after the deadline")
			return nil
		}, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1, tinymq.WithDelay(time.Hour)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := m.Shutdown(ctx)
		require.ErrorIs(t, err, tinymq.ErrUndelivered)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "1 never reached a consumer")
		m.Stop()
		assert.Equal(t, uint64(1), m.Stats().Queues["q"].Undelivered)
		time.Sleep(2 * time.Hour) // the scheduler is gone; nothing fires
	})
}

// TestStressEveryAcceptedMessageEndsOnce publishes from many goroutines into
// consumers that fail and panic at random, stops in the middle of it, and
// checks that every accepted message ended exactly once, delivered or
// dead-lettered, and that the counters agree.
func TestStressEveryAcceptedMessageEndsOnce(t *testing.T) {
	const publishers, perPublisher = 8, 1000
	type outcome struct {
		mu   sync.Mutex
		seen map[int]int
	}
	record := func(o *outcome, id int) {
		o.mu.Lock()
		o.seen[id]++
		o.mu.Unlock()
	}
	log, _ := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	queues := []string{"a", "b", "c"}
	succeeded := map[string]*outcome{}
	dead := map[string]*outcome{}
	for _, q := range queues {
		succeeded[q] = &outcome{seen: map[int]int{}}
		dead[q] = &outcome{seen: map[int]int{}}
	}
	require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		record(dead[msg.Deaths[0].Queue], msg.Data.(int))
		return nil
	}, 2, tinymq.WithQueueName("dead")))
	for i, name := range queues {
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			switch rand.IntN(4) {
			case 0:
				return errors.New("random failure")
			case 1:
				panic("random panic")
			}
			record(succeeded[msg.Queue], msg.Data.(int))
			return nil
		}, i+1, tinymq.WithQueueName(name), tinymq.WithDeadLetter("dlx", ""),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 50 * time.Microsecond, MaxBackoff: time.Millisecond, Jitter: 1})))
	}
	require.NoError(t, m.Start(context.Background()))

	var next atomic.Int64
	var mu sync.Mutex
	accepted := map[int]bool{}
	var wg sync.WaitGroup
	flowing := make(chan struct{}, publishers)
	// Each publisher stops at a bound of its own, so that the work left for
	// Stop to drain does not depend on how long the scheduler lets one run.
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perPublisher {
				id := int(next.Add(1))
				if err := m.Publish("ev", id); err != nil {
					assert.ErrorIs(t, err, tinymq.ErrStopped)
					return
				}
				mu.Lock()
				accepted[id] = true
				mu.Unlock()
				if i == 200 {
					flowing <- struct{}{}
				}
			}
		}()
	}
	recv(t, flowing, publishers)
	m.Stop()
	wg.Wait()

	s := m.Stats()
	for _, q := range queues {
		st := s.Queues[q]
		assert.Equal(t, uint64(len(accepted)), st.Accepted, "queue %s accepted", q)
		assert.Equal(t, st.Accepted, st.Succeeded+st.DeadLettered, "queue %s: every message succeeded or was dead-lettered", q)
		assert.Zero(t, st.Dropped+st.Undelivered+uint64(st.Depth+st.InFlight), "queue %s", q)
		assert.Equal(t, st.Failed, st.Retried+st.DeadLettered, "queue %s: each failure was retried or final", q)
		for id := range accepted {
			ok, d := succeeded[q].seen[id], dead[q].seen[id]
			if ok+d != 1 {
				t.Fatalf("queue %s, message %d: succeeded %d times, dead-lettered %d times", q, id, ok, d)
			}
		}
		assert.Len(t, succeeded[q].seen, int(st.Succeeded))
		assert.Len(t, dead[q].seen, int(st.DeadLettered))
	}
	assert.Equal(t, s.Queues["a"].DeadLettered+s.Queues["b"].DeadLettered+s.Queues["c"].DeadLettered, s.Queues["dead"].Succeeded)
}

func TestHealthSaysWhetherTheMQIsReady(t *testing.T) {
	var fail atomic.Bool
	restore := tinymq.SetWALFaults(&wal.Faults{SyncErr: func(string) error {
		if fail.Load() {
			return errors.New("injected fsync failure")
		}
		return nil
	}})
	defer restore()
	m := tinymq.New(quiet(), tinymq.WithDataDir(t.TempDir()))
	assert.ErrorIs(t, m.Health(), tinymq.ErrNotStarted)
	require.NoError(t, m.DeclareQueue("d", "ev", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	assert.NoError(t, m.Health())
	fail.Store(true)
	assert.ErrorIs(t, m.Publish("ev", 1), tinymq.ErrLog)
	assert.ErrorIs(t, m.Health(), tinymq.ErrLog, "a failed log makes the MQ unready")
	m.Stop()
	assert.ErrorIs(t, m.Health(), tinymq.ErrStopped)
}

// gateCodec is JSONCodec, except that its Marshal of the string "gate"
// says so on entered and waits for release.
type gateCodec struct {
	entered chan struct{}
	release chan struct{}
}

func (c gateCodec) Marshal(v any) ([]byte, error) {
	if s, ok := v.(string); ok && s == "gate" {
		c.entered <- struct{}{}
		<-c.release
	}
	return tinymq.JSONCodec{}.Marshal(v)
}

func (gateCodec) Unmarshal(b []byte, v any) error { return tinymq.JSONCodec{}.Unmarshal(b, v) }

func (gateCodec) ContentType() string { return "application/json" }

// A Shutdown deadline that passes while a dead letter is being written to a
// durable queue counts that message once: its goroutine is still in user
// code (here the codec), and it is not also counted as never having reached
// a consumer (it did; the abort then closes the log, and the dead letter is
// dropped where it died).
func TestShutdownDeadlineCountsADeadLetterBeingLoggedOnce(t *testing.T) {
	codec := gateCodec{entered: make(chan struct{}, 1), release: make(chan struct{})}
	open := sync.OnceFunc(func() { close(codec.release) })
	t.Cleanup(open)
	m := tinymq.New(quiet(), tinymq.WithDataDir(t.TempDir()), tinymq.WithCodec(codec))
	require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return tinymq.Permanent(errors.New("no"))
	}, 1, tinymq.WithQueueName("work"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "gate"))
	recv(t, codec.entered, 1) // its dead letter is being encoded for the log
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	err := m.Shutdown(ctx)
	open()
	stopWithin(t, m)
	require.Error(t, err)
	assert.NotErrorIs(t, err, tinymq.ErrUndelivered, "nothing waited undelivered: %v", err)
	assert.Contains(t, err.Error(), "1 of the MQ's goroutines still run")
	st := m.Stats().Queues
	assertLedger(t, "work", st["work"])
	assertLedger(t, "dead", st["dead"])
	assert.Equal(t, uint64(1), st["work"].Delivered)
	assert.Equal(t, uint64(1), st["work"].Dropped+st["work"].DeadLettered+st["dead"].Undelivered)
}

// A Shutdown deadline that stops a message's retry (its failure counted
// just before the deadline, its retry refused just after) counts the message
// in its error, once, with ErrUndelivered: never nil, never only as a
// worker still settling.
func TestShutdownDeadlineThatStopsARetryNeverReturnsNil(t *testing.T) {
	counts := regexp.MustCompile(`(\d+) never reached a consumer, (\d+) were in consumers`)
	for trial := range 300 {
		m := tinymq.New(quiet())
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return errors.New("again")
		}, 1, tinymq.WithQueueName("q"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 1 << 30, InitialBackoff: time.Microsecond, MaxBackoff: time.Microsecond})))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", 1))
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		err := m.Shutdown(ctx)
		cancel()
		stopWithin(t, m)
		st := m.Stats().Queues["q"]
		assertLedger(t, "q", st)
		require.Equal(t, uint64(1), st.Undelivered, "trial %d: the retrying message is lost to the deadline", trial)
		require.ErrorIs(t, err, tinymq.ErrUndelivered, "trial %d", trial)
		c := counts.FindStringSubmatch(err.Error())
		require.NotNil(t, c, "trial %d: %v", trial, err)
		never, _ := strconv.Atoi(c[1])
		in, _ := strconv.Atoi(c[2])
		require.Equal(t, 1, never+in, "trial %d: counted once: %v", trial, err)
	}
}

// A Shutdown whose deadline has passed counts each accepted message once:
// either no worker had begun it (never reached a consumer) or a worker had
// (in a consumer), even when the deadline falls between the worker's begin
// and its call of the consumer; it returns at once, without waiting for a
// consumer that ignores its context.
func TestShutdownDeadlineCountsAMessageBegunJustBeforeIt(t *testing.T) {
	counts := regexp.MustCompile(`(\d+) never reached a consumer, (\d+) were in consumers`)
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	for round := range rounds {
		release := make(chan struct{})
		m := tinymq.New()
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			<-release // ignores its context
			return nil
		}, 1, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", round))
		for range rand.IntN(64) { // let the deadline fall anywhere around the worker's begin
			runtime.Gosched()
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res := make(chan error, 1)
		go func() { res <- m.Shutdown(ctx) }()
		var err error
		select {
		case err = <-res:
		case <-time.After(10 * time.Second):
			close(release)
			<-res
			t.Fatalf("round %d: Shutdown waited past its deadline for a consumer that ignores its context", round)
		}
		close(release)
		m.Stop()
		require.ErrorIs(t, err, tinymq.ErrUndelivered, "round %d: the message cannot have ended before the deadline", round)
		c := counts.FindStringSubmatch(err.Error())
		require.NotNil(t, c, "round %d: %v", round, err)
		never, _ := strconv.Atoi(c[1])
		in, _ := strconv.Atoi(c[2])
		require.Equal(t, 1, never+in, "round %d: the one message counted once: %v", round, err)
		st := m.Stats().Queues["q"]
		require.Equal(t, st.Accepted, st.Succeeded+st.Undelivered, "round %d: %+v", round, st)
	}
}

// Shutdown before Start with a context that has already ended says what the
// stop dropped, every time: nil when nothing was published, ErrUndelivered
// counting it otherwise.
func TestShutdownBeforeStartWithAnEndedContextSaysWhatItDropped(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 200 {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		require.NoError(t, m.Shutdown(ended), "run %d: nothing published", i)

		m = tinymq.New(quiet())
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
		require.NoError(t, m.Publish("ev", i))
		err := m.Shutdown(ended)
		require.ErrorIs(t, err, tinymq.ErrUndelivered, "run %d", i)
		require.Contains(t, err.Error(), "1 messages published before Start were dropped", "run %d", i)
		m.Stop()
	}
}

// A publish with no options to the exchange last published to takes a
// shorter path when the message is plain (see MQ.publishPlain): a repeated
// publish must fail exactly as a first one would, whatever changed in
// between.
func TestARepeatedPublishFailsAsAFirstOneWould(t *testing.T) {
	m := tinymq.New(quiet(), tinymq.WithMaxMessageSize(8))
	got := make(chan int, 10)
	require.NoError(t, tinymq.RegisterHandler(m, "typed", tinymq.Fanout, func(_ context.Context, v *orderSeq) error {
		got <- v.N
		return nil
	}, 1))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1, tinymq.WithQueueName("q")))

	// Before Start, and then again on the shorter path.
	require.NoError(t, m.Publish("ev", []byte("x")))
	require.NoError(t, m.Publish("ev", []byte("x")))
	require.ErrorIs(t, m.Publish("ev", []byte("0123456789")), tinymq.ErrTooLarge)
	require.ErrorIs(t, m.Publish("nope", []byte("x")), tinymq.ErrUnknownExchange)
	require.NoError(t, m.Publish("typed", &orderSeq{1}))
	require.NoError(t, m.Publish("typed", &orderSeq{2}))
	require.ErrorIs(t, m.Publish("typed", "s"), tinymq.ErrPayloadType)
	require.ErrorIs(t, m.Publish("typed", 5), tinymq.ErrPayloadType)

	require.NoError(t, m.Start(context.Background()))
	assert.ElementsMatch(t, []int{1, 2}, recv(t, got, 2))
	require.NoError(t, m.Publish("ev", []byte("x")))
	require.NoError(t, m.Unbind("q", "ev"))
	require.ErrorIs(t, m.Publish("ev", []byte("x")), tinymq.ErrNoRoute)
	require.NoError(t, m.Bind("q", "ev", tinymq.Fanout))
	require.NoError(t, m.Publish("ev", []byte("x")))
	require.NoError(t, m.Publish("ev", []byte("x")))
	require.NoError(t, m.DeleteExchange("ev"))
	require.ErrorIs(t, m.Publish("ev", []byte("x")), tinymq.ErrUnknownExchange)
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout))
	require.ErrorIs(t, m.Publish("ev", []byte("x")), tinymq.ErrNoRoute)
	require.NoError(t, m.Publish("typed", &orderSeq{3}))
	assert.Equal(t, []int{3}, recv(t, got, 1))

	// Once Stop has begun, while a consumer still holds it up and the
	// queues are open, a publish is refused.
	in, release := make(chan struct{}), make(chan struct{})
	require.NoError(t, m.RegisterQueue("slow", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		close(in)
		<-release
		return nil
	}, 1))
	require.NoError(t, m.Publish("slow", []byte("x")))
	closedWithin(t, in, "the slow consumer's call")
	require.NoError(t, m.Publish("typed", &orderSeq{4}))
	assert.Equal(t, []int{4}, recv(t, got, 1))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		m.Stop()
	}()
	deadline := time.Now().Add(wait)
	for !errors.Is(m.Publish("nope", []byte("x")), tinymq.ErrStopped) { // the exchange last published to stays "typed"
		require.True(t, time.Now().Before(deadline), "Stop did not begin")
		runtime.Gosched()
	}
	require.ErrorIs(t, m.Publish("typed", &orderSeq{5}), tinymq.ErrStopped)
	close(release)
	closedWithin(t, stopped, "Stop")
}
