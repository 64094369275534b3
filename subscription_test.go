package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// gate is a consumer of int payloads that reports each one on in as it
// begins, then holds it until release is closed (it ignores its context, as
// a consumer stuck in a call may).
type gate struct {
	in      chan int
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{in: make(chan int, 1000), release: make(chan struct{})} }

func (g *gate) consume(_ context.Context, m *tinymq.Msg) error {
	g.in <- m.Data.(int)
	<-g.release
	return nil
}

// open lets every held delivery finish; it may be called more than once.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// ints is a consumer of int payloads that sends each one to a channel.
func ints(ch chan<- int) tinymq.ConsumerFunc {
	return func(_ context.Context, m *tinymq.Msg) error {
		ch <- m.Data.(int)
		return nil
	}
}

// cancelled is a context that has ended already: Cancel with it gives back
// and returns at once.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// cancelWithin cancels s, failing the test unless it returns nil in time.
func cancelWithin(t *testing.T, s *tinymq.Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, s.Cancel(ctx))
}

// declareQ declares the queue name on the fanout exchange "ev".
func declareQ(t *testing.T, m *tinymq.MQ, name string, opts ...tinymq.QueueOption) {
	t.Helper()
	require.NoError(t, m.DeclareQueue(name, "ev", tinymq.Fanout, opts...))
}

// A declared queue keeps what was published before anyone consumed it;
// Consume, before or after Start, delivers that backlog in publish order.
func TestConsumeDeliversTheBacklogOfADeclaredQueue(t *testing.T) {
	for _, before := range []bool{true, false} {
		name := map[bool]string{true: "Consume before Start", false: "Consume while running"}[before]
		t.Run(name, func(t *testing.T) {
			m := tinymq.New()
			declareQ(t, m, "q")
			for i := range 100 {
				require.NoError(t, m.Publish("ev", i))
			}
			got := make(chan int, 100)
			if before {
				_, err := m.Consume("q", ints(got), 1)
				require.NoError(t, err)
			}
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			if !before {
				assert.Equal(t, 100, m.Stats().Queues["q"].Depth, "no consumer: every message waits")
				_, err := m.Consume("q", ints(got), 1)
				require.NoError(t, err)
			}
			for i, n := range recv(t, got, 100) {
				require.Equal(t, i, n, "concurrency 1 delivers in publish order")
			}
			stopWithin(t, m)
			assertLedger(t, "q", m.Stats().Queues["q"])
		})
	}
}

// Several subscriptions on one queue compete for its messages: each message
// goes to exactly one of them, and they run side by side.
func TestCompetingSubscriptionsTakeEachMessageOnce(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	const n = 2000
	b := newBarrier(3)
	var mu sync.Mutex
	seen := map[int]int{}
	bySub := make([]atomic.Int64, 3)
	for i := range 3 {
		_, err := m.Consume("q", func(ctx context.Context, msg *tinymq.Msg) error {
			v := msg.Data.(int)
			if v < 3 {
				if err := b.arrive(ctx); err != nil { // one at a time, or each one its own
					return err
				}
			}
			bySub[i].Add(1)
			mu.Lock()
			seen[v]++
			mu.Unlock()
			return nil
		}, 1)
		require.NoError(t, err)
	}
	for i := range n {
		require.NoError(t, m.Publish("ev", i))
	}
	expectBarrier(t, b, m, "q")
	waitDrained(t, m, "q")
	stopWithin(t, m)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, n, "every message was delivered")
	for v, c := range seen {
		require.Equal(t, 1, c, "message %d reached the subscriptions %d times", v, c)
	}
	for i := range bySub {
		assert.NotZero(t, bySub[i].Load(), "subscription %d took messages", i)
	}
	st := m.Stats().Queues["q"]
	assertLedger(t, "q", st)
	assert.Equal(t, uint64(n), st.Succeeded)
	assert.Equal(t, 3, st.Consumers)
}

// Cancel gives back what the subscription had taken and not begun: to the
// head of the queue, in publish order, for the next consumer; what it had
// begun stays with it and finishes.
func TestCancelGivesBackTakenMessagesInTheirOrder(t *testing.T) {
	m := tinymq.New()
	declareQ(t, m, "q")
	const n = 30
	for i := range n {
		require.NoError(t, m.Publish("ev", i))
	}
	g := newGate()
	t.Cleanup(g.open)
	a, err := m.Consume("q", g.consume, 3)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	begun := recv(t, g.in, 3) // every worker holds a batch and is inside its first message

	require.ErrorIs(t, a.Cancel(cancelled()), context.Canceled, "the begun messages are still in the consumer")
	st := m.Stats().Queues["q"]
	assert.Equal(t, n-3, st.Ready, "what the workers took and had not begun waits again")
	assert.Equal(t, 3, st.InFlight)
	assert.Zero(t, st.Consumers)

	got := make(chan int, n)
	_, err = m.Consume("q", ints(got), 1)
	require.NoError(t, err)
	var want []int
	for i := range n {
		if !slices.Contains(begun, i) {
			want = append(want, i)
		}
	}
	assert.Equal(t, want, recv(t, got, n-3), "the messages given back come first, in publish order, and none twice")
	select {
	case v := <-g.in:
		t.Fatalf("the cancelled subscription began message %d", v)
	default:
	}
	g.open()
	cancelWithin(t, a) // a second Cancel waits for the deliveries in flight
	stopWithin(t, m)
	st = m.Stats().Queues["q"]
	assertLedger(t, "q", st)
	assert.Equal(t, uint64(n), st.Succeeded, "the deliveries in flight at the Cancel finished and counted")
}

// Cancel takes no new message, waits for the deliveries in flight until its
// context ends and then returns the context's error; they finish and are
// settled in the background, and a second Cancel waits as the first did.
func TestCancelWaitsForDeliveriesInFlightUntilItsContextEnds(t *testing.T) {
	m := started(t, quiet())
	declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}))
	var aCalls atomic.Int64
	in := make(chan int, 10)
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	a, err := m.Consume("q", func(_ context.Context, msg *tinymq.Msg) error {
		aCalls.Add(1)
		in <- msg.Data.(int)
		<-release
		return errors.New("fails after the Cancel: retried by the others")
	}, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", 0))
	recv(t, in, 1)

	got := make(chan int, 10)
	_, err = m.Consume("q", ints(got), 1)
	require.NoError(t, err)

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = a.Cancel(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "Cancel waited for its context")

	second := make(chan error, 1)
	go func() { second <- a.Cancel(context.Background()) }()
	for i := 1; i <= 5; i++ {
		require.NoError(t, m.Publish("ev", i))
	}
	assert.ElementsMatch(t, []int{1, 2, 3, 4, 5}, recv(t, got, 5), "the other subscription takes everything new")
	select {
	case err := <-second:
		t.Fatalf("a second Cancel returned (%v) while a delivery was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	require.NoError(t, recv(t, second, 1)[0])
	assert.Equal(t, 0, recv(t, got, 1)[0], "the failed delivery is retried by the remaining subscription")
	assert.Equal(t, int64(1), aCalls.Load(), "the cancelled subscription took nothing more")
	waitDrained(t, m, "q")
	stopWithin(t, m)
	st := m.Stats().Queues["q"]
	assertLedger(t, "q", st)
	assert.Equal(t, uint64(6), st.Succeeded)
	assert.Equal(t, uint64(1), st.Retried)
}

// Cancel is idempotent and safe to call concurrently: every call returns
// once the subscription has ended.
func TestCancelIsIdempotentAndConcurrent(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	g := newGate()
	t.Cleanup(g.open)
	s, err := m.Consume("q", g.consume, 2)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", 1))
	recv(t, g.in, 1)
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- s.Cancel(context.Background()) }()
	}
	select {
	case err := <-errs:
		t.Fatalf("a Cancel returned (%v) while a delivery was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.open()
	for _, err := range recv(t, errs, 8) {
		assert.NoError(t, err)
	}
	cancelWithin(t, s)
	assert.Zero(t, m.Stats().Queues["q"].Consumers)
	require.NoError(t, m.Publish("ev", 2))
	assert.Equal(t, 1, m.Stats().Queues["q"].Depth, "a cancelled subscription takes nothing")
}

// Cancel called from inside the subscription's own consumer cancels it and
// returns nil at once: waiting would wait for itself. The rest waits for the
// next consumer.
func TestCancelFromItsOwnConsumerReturnsAtOnce(t *testing.T) {
	for _, typed := range []bool{false, true} {
		t.Run(map[bool]string{false: "Consume", true: "ConsumeHandler"}[typed], func(t *testing.T) {
			m := started(t)
			declareQ(t, m, "q")
			var sub atomic.Pointer[tinymq.Subscription]
			cancelErr := make(chan error, 10)
			calls := make(chan int, 10)
			body := func(ctx context.Context, v int) error {
				calls <- v
				if v == 0 {
					cancelErr <- sub.Load().Cancel(context.Background())
				}
				return nil
			}
			var s *tinymq.Subscription
			var err error
			if typed {
				s, err = tinymq.ConsumeHandler(m, "q", body, 1)
			} else {
				s, err = m.Consume("q", func(ctx context.Context, msg *tinymq.Msg) error { return body(ctx, msg.Data.(int)) }, 1)
			}
			require.NoError(t, err)
			sub.Store(s)
			require.NoError(t, m.PauseQueue("q")) // so that all three wait behind the first
			for i := range 3 {
				require.NoError(t, m.Publish("ev", i))
			}
			require.NoError(t, m.ResumeQueue("q"))
			require.NoError(t, recv(t, cancelErr, 1)[0])
			assert.Equal(t, 0, recv(t, calls, 1)[0])
			cancelWithin(t, s)
			st := m.Stats().Queues["q"]
			assert.Equal(t, 2, st.Depth, "what the subscription had not begun waits")
			assert.Zero(t, st.Consumers)
			got := make(chan int, 10)
			_, err = m.Consume("q", ints(got), 1)
			require.NoError(t, err)
			assert.Equal(t, []int{1, 2}, recv(t, got, 2))
			assert.Empty(t, calls, "the cancelled consumer was not called again")
		})
	}
}

// ConsumeHandler and ConsumeDeliveries are Consume for one payload type: the
// value (and, for ConsumeDeliveries, the metadata) as RegisterHandler and
// RegisterDeliveryHandler give it, and a payload of another type fails
// permanently with ErrPayloadType, dead-lettered without a retry.
func TestTypedConsumeForms(t *testing.T) {
	m := started(t, quiet())
	dead := deadLetters(t, m)
	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})
	require.NoError(t, m.DeclareQueue("h", "ev", tinymq.Fanout, retry, tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.DeclareQueue("d", "ev", tinymq.Fanout, retry, tinymq.WithDeadLetter("dlx", "")))
	// Accepted before the queues know their type; after, Publish refuses it.
	require.NoError(t, m.Publish("ev", "not a *numbered"))
	values := make(chan int, 10)
	_, err := tinymq.ConsumeHandler(m, "h", func(_ context.Context, p *numbered) error {
		values <- p.N
		return nil
	}, 1)
	require.NoError(t, err)
	deliveries := make(chan tinymq.Delivery[*numbered], 10)
	_, err = tinymq.ConsumeDeliveries(m, "d", func(_ context.Context, d tinymq.Delivery[*numbered]) error {
		deliveries <- d
		return nil
	}, 1)
	require.NoError(t, err)

	require.NoError(t, m.Publish("ev", &numbered{N: 7}, tinymq.WithHeaders(map[string]any{"k": "v"})))
	assert.Equal(t, 7, recv(t, values, 1)[0])
	d := recv(t, deliveries, 1)[0]
	assert.Equal(t, 7, d.Data.N)
	assert.Equal(t, "ev", d.Exchange)
	assert.Equal(t, "d", d.Queue)
	assert.Equal(t, 1, d.Attempt)
	assert.Equal(t, "v", d.Headers["k"])
	assert.NotZero(t, d.ID)

	require.ErrorIs(t, m.Publish("ev", "not a *numbered"), tinymq.ErrPayloadType)
	for _, msg := range recv(t, dead, 2) {
		require.Len(t, msg.Deaths, 1)
		assert.Contains(t, msg.Deaths[0].LastError, tinymq.ErrPayloadType.Error())
		assert.Equal(t, 1, msg.Deaths[0].Attempts, "a payload of the wrong type is not retried")
	}
	stopWithin(t, m)
	for _, q := range []string{"h", "d"} {
		st := m.Stats().Queues[q]
		assertLedger(t, q, st)
		assert.Equal(t, uint64(1), st.Succeeded, q)
		assert.Equal(t, uint64(1), st.DeadLettered, q)
		assert.Zero(t, st.Retried, q)
	}
}

// Bad arguments to Consume, its typed forms and Cancel get sentinel errors
// and change nothing.
func TestConsumeAndCancelRefuseBadInput(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	nopT := func(context.Context, int) error { return nil }
	nopD := func(context.Context, tinymq.Delivery[int]) error { return nil }
	for _, c := range []struct {
		name string
		call func() (*tinymq.Subscription, error)
		want error
	}{
		{"nil consumer", func() (*tinymq.Subscription, error) { return m.Consume("q", nil, 1) }, tinymq.ErrNilConsumer},
		{"concurrency 0", func() (*tinymq.Subscription, error) { return m.Consume("q", nop, 0) }, tinymq.ErrInvalidConcurrency},
		{"negative concurrency", func() (*tinymq.Subscription, error) { return m.Consume("q", nop, -1) }, tinymq.ErrInvalidConcurrency},
		{"concurrency over the limit", func() (*tinymq.Subscription, error) { return m.Consume("q", nop, tinymq.MaxConcurrency+1) }, tinymq.ErrInvalidConcurrency},
		{"unknown queue", func() (*tinymq.Subscription, error) { return m.Consume("nope", nop, 1) }, tinymq.ErrUnknownQueue},
		{"empty queue name", func() (*tinymq.Subscription, error) { return m.Consume("", nop, 1) }, tinymq.ErrUnknownQueue},
		{"ConsumeHandler nil fn", func() (*tinymq.Subscription, error) { return tinymq.ConsumeHandler[int](m, "q", nil, 1) }, tinymq.ErrNilConsumer},
		{"ConsumeHandler nil MQ", func() (*tinymq.Subscription, error) { return tinymq.ConsumeHandler(nil, "q", nopT, 1) }, tinymq.ErrInvalidOption},
		{"ConsumeHandler unknown queue", func() (*tinymq.Subscription, error) { return tinymq.ConsumeHandler(m, "nope", nopT, 1) }, tinymq.ErrUnknownQueue},
		{"ConsumeDeliveries nil fn", func() (*tinymq.Subscription, error) { return tinymq.ConsumeDeliveries[int](m, "q", nil, 1) }, tinymq.ErrNilConsumer},
		{"ConsumeDeliveries nil MQ", func() (*tinymq.Subscription, error) { return tinymq.ConsumeDeliveries(nil, "q", nopD, 1) }, tinymq.ErrInvalidOption},
		{"ConsumeDeliveries concurrency 0", func() (*tinymq.Subscription, error) { return tinymq.ConsumeDeliveries(m, "q", nopD, 0) }, tinymq.ErrInvalidConcurrency},
	} {
		s, err := c.call()
		assert.ErrorIs(t, err, c.want, c.name)
		assert.Nil(t, s, c.name)
	}
	assert.Zero(t, m.Stats().Queues["q"].Consumers, "no bad call subscribed anything")

	var nilSub *tinymq.Subscription
	assert.ErrorIs(t, nilSub.Cancel(context.Background()), tinymq.ErrInvalidOption)
	got := make(chan int, 1)
	s, err := m.Consume("q", ints(got), 1)
	require.NoError(t, err)
	var nilCtx context.Context
	assert.ErrorIs(t, s.Cancel(nilCtx), tinymq.ErrInvalidOption)
	require.NoError(t, m.Publish("ev", 1))
	assert.Equal(t, 1, recv(t, got, 1)[0], "a Cancel with a nil context cancelled nothing")
	cancelWithin(t, s)
}

// After Stop, Consume and its typed forms return ErrStopped, and Cancel of
// a subscription that ended with the MQ returns nil at once.
func TestConsumeAfterStopAndCancelAfterStop(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	s, err := m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 2)
	require.NoError(t, err)
	stopWithin(t, m)
	_, err = m.Consume("q", func(context.Context, *tinymq.Msg) error { return nil }, 1)
	assert.ErrorIs(t, err, tinymq.ErrStopped)
	_, err = tinymq.ConsumeHandler(m, "q", func(context.Context, int) error { return nil }, 1)
	assert.ErrorIs(t, err, tinymq.ErrStopped)
	_, err = tinymq.ConsumeDeliveries(m, "q", func(context.Context, tinymq.Delivery[int]) error { return nil }, 1)
	assert.ErrorIs(t, err, tinymq.ErrStopped)
	assert.NoError(t, s.Cancel(cancelled()), "its workers have ended with the MQ")
	assert.NoError(t, s.Cancel(cancelled()))
}

// A subscription cancelled before Start never runs; what it would have
// taken waits for the next consumer. Stop before Start with a subscription
// that never started does not hang, and its Cancel returns at once.
func TestCancelBeforeStart(t *testing.T) {
	m := tinymq.New()
	declareQ(t, m, "q")
	calls := make(chan int, 10)
	s, err := m.Consume("q", ints(calls), 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", 1))
	require.NoError(t, s.Cancel(cancelled()), "nothing was started: nothing to wait for")
	got := make(chan int, 10)
	_, err = m.Consume("q", ints(got), 1)
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	assert.Equal(t, 1, recv(t, got, 1)[0])
	stopWithin(t, m)
	assert.Empty(t, calls)

	m = tinymq.New(quiet())
	declareQ(t, m, "q")
	s, err = m.Consume("q", ints(calls), 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", 1))
	stopWithin(t, m)
	assert.NoError(t, s.Cancel(cancelled()))
	st := m.Stats().Queues["q"]
	assertLedger(t, "q", st)
	assert.Equal(t, uint64(1), st.Undelivered)
}

// Stop waits for a retry backing off in a queue with a consumer; once the
// queue's last subscription is cancelled, what waits has no consumer and
// the stop ends, counting it undelivered.
func TestCancellingTheLastSubscriptionDuringStopLetsStopEnd(t *testing.T) {
	m := started(t, quiet())
	declareQ(t, m, "q", tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour}))
	failed := make(chan struct{}, 1)
	s, err := m.Consume("q", func(context.Context, *tinymq.Msg) error {
		failed <- struct{}{}
		return errors.New("fail: retry in an hour")
	}, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", 1))
	recv(t, failed, 1)
	require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 1 }, wait, time.Millisecond)

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		m.Stop()
	}()
	select {
	case <-stopped:
		t.Fatal("Stop did not wait for the retry of a queue with a consumer")
	case <-time.After(20 * time.Millisecond):
	}
	cancelWithin(t, s)
	closedWithin(t, stopped, "Stop once the queue lost its last consumer")
	st := m.Stats().Queues["q"]
	assertLedger(t, "q", st)
	assert.Equal(t, uint64(1), st.Undelivered)
}

// Subscribing while a backlog wakes a queue's parked workers one at a time
// loses no wakeup: every message is delivered, round after round.
func TestConsumeWhileWorkersWakeLosesNoWakeup(t *testing.T) {
	m := started(t)
	declareQ(t, m, "q")
	var done atomic.Int64
	work := func(context.Context, *tinymq.Msg) error {
		for range 50 {
			runtime.Gosched() // a little work: the workers are busy while more arrive
		}
		done.Add(1)
		return nil
	}
	_, err := m.Consume("q", work, 4)
	require.NoError(t, err)
	var subs []*tinymq.Subscription
	total := int64(0)
	for round := range 200 {
		for range 8 {
			require.NoError(t, m.Publish("ev", round))
			total++
		}
		s, err := m.Consume("q", work, 1)
		require.NoError(t, err)
		subs = append(subs, s)
		for range 8 {
			require.NoError(t, m.Publish("ev", round))
			total++
		}
		require.Eventually(t, func() bool { return done.Load() == total }, settleWait, time.Millisecond)
		// Every worker is parked now: one more message must wake one.
		require.NoError(t, m.Publish("ev", round))
		total++
		if !assert.Eventually(t, func() bool { return done.Load() == total }, settleWait, time.Millisecond,
			"round %d: a message waits while every worker is parked", round) {
			t.Logf("the queue: %+v", m.Stats().Queues["q"])
			_ = m.PauseQueue("q") // a pause and a resume wake them all, so that the Stop of the cleanup ends
			_ = m.ResumeQueue("q")
			t.FailNow()
		}
	}
	for _, s := range subs {
		cancelWithin(t, s)
	}
}

// A subscription that leaves while messages arrive takes no wake from the
// workers that stay: whatever a parked worker was woken for, another takes,
// so that a slow message never holds back the ones behind it while a worker
// of the queue is idle. The workers of a wide subscription are woken by its
// Cancel; each that takes a wake off the queue's count must pass it on.
func TestASubscriptionLeavingTakesNoWakeFromTheWorkersThatStay(t *testing.T) {
	for _, workers := range []int{2, 3} {
		t.Run(fmt.Sprint(workers, " workers"), func(t *testing.T) {
			m := started(t)
			declareQ(t, m, "q")
			slowIn, release := make(chan struct{}, 1), make(chan struct{})
			fast := make(chan struct{}, 1024)
			consume := func(ctx context.Context, msg *tinymq.Msg) error {
				if msg.Data.(int) < 0 { // the slow one
					slowIn <- struct{}{}
					<-release
					return nil
				}
				fast <- struct{}{}
				return nil
			}
			_, err := m.Consume("q", consume, workers)
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(uint64(workers), 1))
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			for start, round := time.Now(), 0; time.Since(start) < 3*time.Second; round++ {
				wide, err := m.Consume("q", consume, 64+rng.IntN(512))
				require.NoError(t, err)
				for range rng.IntN(100) {
					runtime.Gosched() // some of its workers park, some do not
				}
				_ = wide.Cancel(ended) // returns at once: its workers leave as the messages come
				n := 4 + rng.IntN(60)
				slowAt := rng.IntN(n)
				for i := range n {
					v := i
					if i == slowAt {
						v = -1
					}
					require.NoError(t, m.Publish("ev", v))
				}
				select {
				case <-slowIn:
				case <-time.After(settleWait):
					t.Fatalf("round %d: the slow message was not delivered within %v", round, settleWait)
				}
				for got := 0; got < n-1; got++ {
					select {
					case <-fast:
					case <-time.After(settleWait):
						release <- struct{}{} // let the Stop of the cleanup end
						t.Fatalf("round %d: %d of %d messages delivered in %v while one blocks and a worker is idle; %+v",
							round, got, n-1, settleWait, m.Stats().Queues["q"])
					}
				}
				release <- struct{}{}
				cancelWithin(t, wide)
			}
		})
	}
}

// A delivery in flight that ends its goroutine with runtime.Goexit still
// ends: Cancel returns once it has, and the failure is settled.
func TestCancelWaitsForADeliveryThatCallsGoexit(t *testing.T) {
	m := started(t, quiet())
	declareQ(t, m, "q")
	in, release := make(chan struct{}, 1), make(chan struct{})
	s, err := m.Consume("q", func(context.Context, *tinymq.Msg) error {
		in <- struct{}{}
		<-release
		runtime.Goexit()
		return nil
	}, 1)
	require.NoError(t, err)
	require.NoError(t, m.Publish("ev", 1))
	recv(t, in, 1)
	done := make(chan error, 1)
	go func() { done <- s.Cancel(context.Background()) }()
	close(release)
	require.NoError(t, recv(t, done, 1)[0])
	stopWithin(t, m)
	st := m.Stats().Queues["q"]
	assertLedger(t, "q", st)
	assert.Equal(t, uint64(1), st.Failed)
	assert.Equal(t, uint64(1), st.Dropped, "no retry, no dead-letter exchange")
}
