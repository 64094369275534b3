package tinymq_test

import (
	"context"
	"errors"
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

// hPayload is the payload of the handler tests. A *hPayload boxes into an
// interface without allocating, so Publish of one allocates nothing.
type hPayload struct{ N int }

// hNilErr is an error type whose Error method panics on a nil receiver.
type hNilErr struct{ msg string }

func (e *hNilErr) Error() string { return e.msg }

// hForm is one way of registering a typed consumer. The three forms must
// behave alike, apart from what they allocate; attempt is 0 for the forms
// that do not see it.
type hForm struct {
	name     string
	attempts bool
	register func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
		consume func(ctx context.Context, attempt int, v *hPayload) error, concurrency int, opts ...tinymq.QueueOption) error
}

func hForms() []hForm {
	return []hForm{
		{name: "RegisterQueue+Handler", register: func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
			consume func(context.Context, int, *hPayload) error, concurrency int, opts ...tinymq.QueueOption) error {
			return m.RegisterQueue(exchange, kind, tinymq.Handler(func(ctx context.Context, v *hPayload) error {
				return consume(ctx, 0, v)
			}), concurrency, opts...)
		}},
		{name: "RegisterHandler", register: func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
			consume func(context.Context, int, *hPayload) error, concurrency int, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterHandler(m, exchange, kind, func(ctx context.Context, v *hPayload) error {
				return consume(ctx, 0, v)
			}, concurrency, opts...)
		}},
		{name: "RegisterDeliveryHandler", attempts: true, register: func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
			consume func(context.Context, int, *hPayload) error, concurrency int, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterDeliveryHandler(m, exchange, kind, func(ctx context.Context, d tinymq.Delivery[*hPayload]) error {
				return consume(ctx, d.Attempt, d.Data)
			}, concurrency, opts...)
		}},
	}
}

// hCounts are the counters of QueueStats that the failure tests check.
type hCounts struct {
	Delivered, Succeeded, Failed, Retried, DeadLettered, Dropped, Undelivered uint64
}

func hCountsOf(s tinymq.QueueStats) hCounts {
	return hCounts{Delivered: s.Delivered, Succeeded: s.Succeeded, Failed: s.Failed, Retried: s.Retried,
		DeadLettered: s.DeadLettered, Dropped: s.Dropped, Undelivered: s.Undelivered}
}

// hDeadQueue registers a queue "dead" on the fanout exchange "dlx" with
// RegisterDeliveryHandler, sending what it gets to the returned channel.
func hDeadQueue(t *testing.T, m *tinymq.MQ, capacity int) <-chan tinymq.Delivery[any] {
	t.Helper()
	ch := make(chan tinymq.Delivery[any], capacity)
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "dlx", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[any]) error {
		ch <- d
		return nil
	}, 1, tinymq.WithQueueName("dead")))
	return ch
}

// stopWithin stops m, failing the test if that takes longer than the bound.
func stopWithin(t *testing.T, m *tinymq.MQ) {
	t.Helper()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		m.Stop()
	}()
	closedWithin(t, stopped, "Stop")
}

func TestHandlerDeliversWithoutAllocating(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const rounds, batch = 100, 100 // 10,000 messages
	type form struct {
		name     string
		direct   bool
		register func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType, sig chan<- struct{}, opts ...tinymq.QueueOption) error
	}
	forms := []form{
		{"RegisterHandler", true, func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType, sig chan<- struct{}, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterHandler(m, exchange, kind, func(_ context.Context, p *hPayload) error {
				if p == nil || p.N != 1 {
					return errors.New("wrong payload") // no signal: the test times out
				}
				sig <- struct{}{}
				return nil
			}, 1, opts...)
		}},
		{"RegisterDeliveryHandler", true, func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType, sig chan<- struct{}, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterDeliveryHandler(m, exchange, kind, func(_ context.Context, d tinymq.Delivery[*hPayload]) error {
				if d.Data == nil || d.Data.N != 1 || d.Attempt != 1 || d.ID == 0 || d.Queue == "" {
					return errors.New("wrong delivery")
				}
				sig <- struct{}{}
				return nil
			}, 1, opts...)
		}},
		{"RegisterQueue", false, func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType, sig chan<- struct{}, opts ...tinymq.QueueOption) error {
			return m.RegisterQueue(exchange, kind, func(_ context.Context, msg *tinymq.Msg) error {
				sig <- struct{}{}
				return nil
			}, 1, opts...)
		}},
	}
	cases := []struct {
		name   string
		kind   tinymq.ExchangeType
		queues int
		bind   []tinymq.QueueOption
		pub    []tinymq.PublishOption
		// directMax is the most a direct consumer may allocate per message;
		// msgMin the least a *Msg consumer does (so the test can fail).
		directMax, msgMin float64
	}{
		{name: "plain fanout to one queue", kind: tinymq.Fanout, queues: 1, directMax: 0.05, msgMin: 1},
		{name: "plain fanout to three queues", kind: tinymq.Fanout, queues: 3, directMax: 0.05, msgMin: 3},
		// A keyed message needs one record per publish, shared by every
		// queue it reaches: about 1 per message, however many queues.
		{name: "keyed direct to three queues", kind: tinymq.Direct, queues: 3,
			bind: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub:  []tinymq.PublishOption{tinymq.WithRoutingKey("k")}, directMax: 1.05, msgMin: 4},
	}
	for _, c := range cases {
		for _, f := range forms {
			t.Run(c.name+"/"+f.name, func(t *testing.T) {
				m := tinymq.New()
				sig := make(chan struct{}, batch*c.queues)
				for range c.queues {
					require.NoError(t, f.register(m, "ev", c.kind, sig, c.bind...))
				}
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				got := hMallocsPerMessage(t, m, &hPayload{N: 1}, c.pub, sig, c.queues, rounds, batch)
				t.Logf("%.4f allocations per message", got)
				if f.direct {
					assert.Less(t, got, c.directMax, "a direct consumer allocates per delivery")
				} else {
					assert.GreaterOrEqual(t, got, c.msgMin, "a *Msg consumer gets a new Msg per delivery")
				}
				st := m.Stats()
				assert.Equal(t, uint64(rounds+5)*batch, st.Exchanges["ev"].Published)
				for name, q := range st.Queues {
					assert.Equal(t, uint64(rounds+5)*batch, q.Succeeded, name)
				}
			})
		}
	}
}

// hMallocsPerMessage publishes v (boxed already, so that the box is not
// counted) to "ev" in rounds of batch messages, waiting after each round for
// the consumers of the queues to signal every delivery, and returns the heap
// allocations per message, after a warm-up.
func hMallocsPerMessage(t *testing.T, m *tinymq.MQ, v any, opts []tinymq.PublishOption, sig <-chan struct{}, queues, rounds, batch int) float64 {
	t.Helper()
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	run := func(rounds int) {
		for range rounds {
			for range batch {
				if err := m.Publish("ev", v, opts...); err != nil {
					t.Fatalf("Publish: %v", err)
				}
			}
			for range batch * queues {
				select {
				case <-sig:
				case <-timeout.C:
					t.Fatal("the consumers did not get every message in time")
				}
			}
		}
	}
	run(5) // warm up: worker stacks, chunks, caches
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run(rounds)
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(rounds*batch)
}

func TestDeliveryHandlerFields(t *testing.T) {
	h := map[string]any{"t": "v", "n": 1}
	type route struct {
		name     string
		alt      bool // "main" is a direct exchange with alternate "alt"
		exchange string
		kind     tinymq.ExchangeType
		bind     []tinymq.QueueOption
		publish  string // the exchange published to
		pub      []tinymq.PublishOption
		key      string
		headers  map[string]any
	}
	routes := []route{
		{name: "fanout keyed", exchange: "fan", kind: tinymq.Fanout, publish: "fan",
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("any.key"), tinymq.WithHeaders(h)}, key: "any.key", headers: h},
		{name: "fanout plain", exchange: "fan", kind: tinymq.Fanout, publish: "fan"},
		{name: "direct", exchange: "dir", kind: tinymq.Direct, bind: []tinymq.QueueOption{tinymq.WithBindingKey("k1")}, publish: "dir",
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k1"), tinymq.WithHeaders(h)}, key: "k1", headers: h},
		{name: "topic", exchange: "top", kind: tinymq.Topic, bind: []tinymq.QueueOption{tinymq.WithBindingKey("a.*.c")}, publish: "top",
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("a.b.c")}, key: "a.b.c"},
		{name: "headers", exchange: "hdr", kind: tinymq.Headers,
			bind:    []tinymq.QueueOption{tinymq.WithBindingArgs(map[string]any{"x-match": "all", "t": "v"})},
			publish: "hdr", pub: []tinymq.PublishOption{tinymq.WithRoutingKey("rk"), tinymq.WithHeaders(h)}, key: "rk", headers: h},
		{name: "alternate keyed", alt: true, exchange: "alt", kind: tinymq.Fanout, publish: "main",
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("nowhere"), tinymq.WithHeaders(h)}, key: "nowhere", headers: h},
		{name: "alternate plain", alt: true, exchange: "alt", kind: tinymq.Fanout, publish: "main"},
	}
	// The paths a message can take to a direct consumer: a shared entry, or a
	// Msg of the queue's own.
	paths := []struct {
		name  string
		queue []tinymq.QueueOption
		pub   []tinymq.PublishOption
	}{
		{name: "shared"},
		{name: "queue TTL", queue: []tinymq.QueueOption{tinymq.WithMessageTTL(time.Hour)}},
		{name: "length limit", queue: []tinymq.QueueOption{tinymq.WithMaxLen(10, tinymq.RejectPublish)}},
		{name: "filter", queue: []tinymq.QueueOption{tinymq.WithFilter(func(*tinymq.Msg) bool { return true })}},
		{name: "message TTL", pub: []tinymq.PublishOption{tinymq.WithExpiration(time.Hour)}},
		{name: "delay", pub: []tinymq.PublishOption{tinymq.WithDelay(time.Millisecond)}},
	}
	for _, r := range routes {
		for _, p := range paths {
			t.Run(r.name+"/"+p.name, func(t *testing.T) {
				m := tinymq.New()
				if r.alt {
					require.NoError(t, m.DeclareExchange("main", tinymq.Direct, tinymq.WithAlternateExchange("alt")))
				}
				got := make(chan tinymq.Delivery[*hPayload], 2)
				values := make(chan *hPayload, 2)
				opts := slices.Concat(r.bind, p.queue, []tinymq.QueueOption{tinymq.WithQueueName("q")})
				require.NoError(t, tinymq.RegisterDeliveryHandler(m, r.exchange, r.kind, func(_ context.Context, d tinymq.Delivery[*hPayload]) error {
					got <- d
					return nil
				}, 1, opts...))
				opts = slices.Concat(r.bind, p.queue, []tinymq.QueueOption{tinymq.WithQueueName("q2")})
				require.NoError(t, tinymq.RegisterHandler(m, r.exchange, r.kind, func(_ context.Context, v *hPayload) error {
					values <- v
					return nil
				}, 1, opts...))
				require.NoError(t, m.Start(context.Background()))
				sent := []*hPayload{{N: 1}, {N: 2}}
				for _, v := range sent {
					require.NoError(t, m.Publish(r.publish, v, slices.Concat(r.pub, p.pub)...))
				}
				stopWithin(t, m)
				ds := recv(t, got, 2)
				slices.SortFunc(ds, func(a, b tinymq.Delivery[*hPayload]) int { return int(a.ID) - int(b.ID) })
				for i, d := range ds {
					assert.Equal(t, uint64(i+1), d.ID, "ID")
					assert.Equal(t, r.publish, d.Exchange, "Exchange is the one published to")
					assert.Equal(t, "q", d.Queue, "Queue")
					assert.Equal(t, r.key, d.RoutingKey, "RoutingKey")
					assert.Equal(t, r.headers, d.Headers, "Headers")
					assert.Same(t, sent[i], d.Data, "Data")
					assert.Equal(t, 1, d.Attempt, "Attempt")
					assert.Nil(t, d.Deaths, "Deaths")
					assert.False(t, d.Redelivered, "Redelivered")
				}
				vs := recv(t, values, 2)
				assert.ElementsMatch(t, sent, vs, "RegisterHandler gets the published values")
				for _, q := range []string{"q", "q2"} {
					st := m.Stats().Queues[q]
					assert.Equal(t, hCounts{Delivered: 2, Succeeded: 2}, hCountsOf(st), q)
				}
			})
		}
	}
}

// hScenario is what a consumer does with one message, and what must follow.
type hScenario struct {
	name        string
	data        any
	maxAttempts int // 0: no WithRetry
	act         func(call int, v *hPayload) error
	calls       int // consumer calls
	want        hCounts
	death       string // in the death's LastError; "": not dead-lettered
	attempts    int    // the death's Attempts
	stack       bool   // a panic: logged with its stack
}

func hScenarios() []hScenario {
	ok := func(int, *hPayload) error { return nil }
	transient := errors.New("transient")
	failFirst := func(err error) func(int, *hPayload) error {
		return func(call int, _ *hPayload) error {
			if call == 1 {
				return err
			}
			return nil
		}
	}
	var typedNil *hNilErr
	good := tinymq.Encoded{Body: []byte(`{"N":42}`), Codec: tinymq.JSONCodec{}}
	return []hScenario{
		{name: "success", data: &hPayload{N: 1}, act: ok, calls: 1, want: hCounts{Delivered: 1, Succeeded: 1}},
		{name: "error then success", data: &hPayload{N: 1}, maxAttempts: 3, calls: 3,
			act: func(call int, _ *hPayload) error {
				if call < 3 {
					return transient
				}
				return nil
			},
			want: hCounts{Delivered: 3, Succeeded: 1, Failed: 2, Retried: 2}},
		{name: "errors until dead-lettered", data: &hPayload{N: 1}, maxAttempts: 3, calls: 3,
			act:  func(int, *hPayload) error { return errors.New("boom") },
			want: hCounts{Delivered: 3, Failed: 3, Retried: 2, DeadLettered: 1}, death: "boom", attempts: 3},
		{name: "permanent", data: &hPayload{N: 1}, maxAttempts: 3, calls: 1,
			act:  func(int, *hPayload) error { return tinymq.Permanent(errors.New("bad input")) },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: "bad input", attempts: 1},
		{name: "panic then success", data: &hPayload{N: 1}, maxAttempts: 2, calls: 2, stack: true,
			act: func(call int, _ *hPayload) error {
				if call == 1 {
					panic("kaboom")
				}
				return nil
			},
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "panic dead-lettered", data: &hPayload{N: 1}, calls: 1, stack: true,
			act:  func(int, *hPayload) error { panic("kaboom") },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: "kaboom", attempts: 1},
		{name: "typed nil then success", data: &hPayload{N: 1}, maxAttempts: 2, calls: 2, act: failFirst(typedNil),
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "typed nil dead-lettered", data: &hPayload{N: 1}, calls: 1,
			act:  func(int, *hPayload) error { return typedNil },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: tinymq.ErrTypedNil.Error(), attempts: 1},
		{name: "goexit then success", data: &hPayload{N: 1}, maxAttempts: 2, calls: 2,
			act: func(call int, _ *hPayload) error {
				if call == 1 {
					runtime.Goexit()
				}
				return nil
			},
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "goexit dead-lettered", data: &hPayload{N: 1}, calls: 1,
			act:  func(int, *hPayload) error { runtime.Goexit(); return nil },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: tinymq.ErrGoexit.Error(), attempts: 1},
		{name: "wrong type", data: "not a payload", maxAttempts: 3, act: ok,
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: "got string", attempts: 1},
		{name: "nil data", data: nil, maxAttempts: 3, act: ok,
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: "got nil", attempts: 1},
		{name: "encoded", data: good, calls: 1, act: ok, want: hCounts{Delivered: 1, Succeeded: 1}},
		{name: "encoded retried", data: good, maxAttempts: 2, calls: 2, act: failFirst(transient),
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "undecodable", data: tinymq.Encoded{Body: []byte(`{"N":`), Codec: tinymq.JSONCodec{}}, maxAttempts: 3, act: ok,
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: tinymq.ErrPayloadType.Error(), attempts: 1},
	}
}

func TestHandlerFailuresBehaveAsRegisterQueue(t *testing.T) {
	paths := []struct {
		name string
		opts []tinymq.QueueOption
	}{
		{name: "shared"},
		{name: "owned", opts: []tinymq.QueueOption{tinymq.WithMessageTTL(time.Hour)}},
	}
	for _, f := range hForms() {
		for _, p := range paths {
			for _, sc := range hScenarios() {
				t.Run(f.name+"/"+p.name+"/"+sc.name, func(t *testing.T) {
					runScenario(t, f, p.opts, sc)
				})
			}
		}
	}
}

type hCall struct {
	attempt int
	v       *hPayload
}

func runScenario(t *testing.T, f hForm, pathOpts []tinymq.QueueOption, sc hScenario) {
	logger, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(logger))
	dead := hDeadQueue(t, m, 4)
	var mu sync.Mutex
	var calls []hCall
	consume := func(ctx context.Context, attempt int, v *hPayload) error {
		if ctx == nil || ctx.Err() != nil {
			return errors.New("no live context")
		}
		mu.Lock()
		calls = append(calls, hCall{attempt, v})
		n := len(calls)
		mu.Unlock()
		return sc.act(n, v)
	}
	opts := slices.Concat([]tinymq.QueueOption{tinymq.WithQueueName("work"), tinymq.WithDeadLetter("dlx", "")}, pathOpts)
	if sc.maxAttempts > 0 {
		opts = append(opts, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: sc.maxAttempts, InitialBackoff: time.Millisecond}))
	}
	require.NoError(t, f.register(m, "ev", tinymq.Fanout, consume, 1, opts...))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", sc.data))
	stopWithin(t, m)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, sc.calls, "consumer calls")
	for i, c := range calls {
		if f.attempts {
			assert.Equal(t, i+1, c.attempt, "Attempt of call %d", i+1)
		}
		switch d := sc.data.(type) {
		case *hPayload:
			assert.Same(t, d, c.v, "the published pointer")
		case tinymq.Encoded:
			require.NotNil(t, c.v)
			assert.Equal(t, 42, c.v.N, "decoded")
		}
	}
	st := m.Stats()
	work := st.Queues["work"]
	assert.Equal(t, sc.want, hCountsOf(work), "counts of work")
	assert.Equal(t, uint64(1), work.Accepted)
	assert.Zero(t, work.Depth+work.InFlight)

	if sc.death == "" {
		assert.Empty(t, dead, "dead-lettered")
		assert.Zero(t, st.Queues["dead"].Delivered)
	} else {
		require.Len(t, dead, 1, "dead-lettered")
		d := <-dead
		assert.Equal(t, uint64(1), d.ID)
		assert.Equal(t, "dlx", d.Exchange)
		assert.Equal(t, "dead", d.Queue)
		assert.Equal(t, 1, d.Attempt)
		assert.Equal(t, sc.data, d.Data, "the dead letter keeps its data")
		require.Len(t, d.Deaths, 1)
		death := d.Deaths[0]
		assert.Equal(t, tinymq.ReasonRejected, death.Reason)
		assert.Equal(t, "work", death.Queue)
		assert.Equal(t, "ev", death.Exchange)
		assert.Equal(t, sc.attempts, death.Attempts)
		assert.Equal(t, 1, death.Count)
		assert.Equal(t, uint64(1), death.MessageID)
		assert.Contains(t, death.LastError, sc.death)
		assert.Equal(t, hCounts{Delivered: 1, Succeeded: 1}, hCountsOf(st.Queues["dead"]), "counts of dead")
	}
	stack := false
	for _, r := range records(t) {
		if _, ok := r["stack"]; ok {
			stack = true
		}
	}
	assert.Equal(t, sc.stack, stack, "a failure logged with a stack")
}

func TestHandlerGoexitKeepsTheWorkerSlot(t *testing.T) {
	for _, f := range hForms() {
		t.Run(f.name, func(t *testing.T) {
			const n = 20
			m := tinymq.New()
			done := make(chan int, n)
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, _ int, v *hPayload) error {
				if v.N < n {
					runtime.Goexit()
				}
				done <- v.N
				return nil
			}, 2, tinymq.WithQueueName("q")))
			require.NoError(t, m.Start(context.Background()))
			for i := range 2 * n {
				require.NoError(t, m.Publish("ev", &hPayload{N: i}))
			}
			recv(t, done, n) // every worker slot survived the Goexits
			stopWithin(t, m)
			assert.Equal(t, hCounts{Delivered: 2 * n, Succeeded: n, Failed: n, Dropped: n}, hCountsOf(m.Stats().Queues["q"]))
		})
	}
}

func TestHandlerStatsAreExactUnderConcurrency(t *testing.T) {
	const n = 600
	var want hCounts
	for i := range n {
		switch {
		case i%5 == 0: // permanent
			want.Delivered++
			want.Failed++
			want.DeadLettered++
		case i%3 == 0: // fails once
			want.Delivered += 2
			want.Failed++
			want.Retried++
			want.Succeeded++
		default:
			want.Delivered++
			want.Succeeded++
		}
	}
	for _, f := range hForms() {
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			dead := hDeadQueue(t, m, n)
			var failed sync.Map
			require.NoError(t, f.register(m, "ev", tinymq.Topic, func(_ context.Context, attempt int, v *hPayload) error {
				switch {
				case v.N%5 == 0:
					return tinymq.Permanent(errors.New("permanent"))
				case v.N%3 == 0:
					if _, again := failed.LoadOrStore(v.N, true); !again {
						return errors.New("once")
					}
					if f.attempts && attempt != 2 {
						return tinymq.Permanent(errors.New("wrong attempt"))
					}
				}
				return nil
			}, 4, tinymq.WithQueueName("q"), tinymq.WithBindingKey("ev.#"), tinymq.WithDeadLetter("dlx", ""),
				tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
			require.NoError(t, m.Start(context.Background()))
			for i := range n {
				require.NoError(t, m.Publish("ev", &hPayload{N: i}, tinymq.WithRoutingKey("ev.x")))
			}
			stopWithin(t, m)
			assert.Equal(t, want, hCountsOf(m.Stats().Queues["q"]))
			require.Len(t, dead, int(want.DeadLettered))
			for range want.DeadLettered {
				d := <-dead
				require.Len(t, d.Deaths, 1)
				assert.Equal(t, "permanent", d.Deaths[0].LastError)
				assert.Equal(t, "ev.x", d.RoutingKey)
				assert.Zero(t, d.Data.(*hPayload).N%5)
			}
		})
	}
}

func TestHandlerStopAndShutdown(t *testing.T) {
	for _, f := range hForms() {
		t.Run(f.name+"/Stop delivers everything", func(t *testing.T) {
			m := tinymq.New()
			entered, release := make(chan struct{}), make(chan struct{})
			var got atomic.Int64
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, _ int, v *hPayload) error {
				if v.N == 0 {
					close(entered)
					<-release
				}
				got.Add(1)
				return nil
			}, 1, tinymq.WithQueueName("q")))
			require.NoError(t, m.Start(context.Background()))
			for i := range 5 {
				require.NoError(t, m.Publish("ev", &hPayload{N: i}))
			}
			closedWithin(t, entered, "first delivery")
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				m.Stop()
			}()
			select {
			case <-stopped:
				t.Fatal("Stop returned while a consumer was running")
			default:
			}
			close(release)
			closedWithin(t, stopped, "Stop")
			assert.Equal(t, int64(5), got.Load())
			assert.Equal(t, hCounts{Delivered: 5, Succeeded: 5}, hCountsOf(m.Stats().Queues["q"]))
			assert.ErrorIs(t, m.Publish("ev", &hPayload{}), tinymq.ErrStopped)
		})
		t.Run(f.name+"/Shutdown deadline", func(t *testing.T) {
			m := tinymq.New()
			entered, returned := make(chan struct{}), make(chan struct{})
			var sawCancel atomic.Bool
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(ctx context.Context, _ int, v *hPayload) error {
				if v.N != 0 {
					return nil
				}
				close(entered)
				select {
				case <-ctx.Done():
					sawCancel.Store(true)
				case <-time.After(wait):
				}
				<-returned // Shutdown has returned: nothing else is begun
				return ctx.Err()
			}, 1, tinymq.WithQueueName("q")))
			require.NoError(t, m.Start(context.Background()))
			for i := range 3 {
				require.NoError(t, m.Publish("ev", &hPayload{N: i}))
			}
			closedWithin(t, entered, "first delivery")
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := m.Shutdown(ctx)
			close(returned)
			assert.ErrorIs(t, err, tinymq.ErrUndelivered)
			assert.ErrorIs(t, err, context.Canceled)
			stopWithin(t, m)
			assert.True(t, sawCancel.Load(), "the consumer's context was cancelled")
			assert.Equal(t, hCounts{Delivered: 1, Failed: 1, Dropped: 1, Undelivered: 2}, hCountsOf(m.Stats().Queues["q"]))
		})
	}
}

func TestDeliveryCopiesOfASharedRecordAreIsolated(t *testing.T) {
	h := map[string]any{"k": "v"}
	p := &hPayload{N: 7}
	m := tinymq.New()
	scribbled := make(chan struct{})
	awaitScribble := func() error {
		select {
		case <-scribbled:
			return nil
		case <-time.After(wait):
			return errors.New("the scribbler never ran")
		}
	}
	snaps := make(chan tinymq.Delivery[any], 8)
	var mine []*tinymq.Msg // the Msgs the *Msg consumers got
	var mu sync.Mutex
	own := func(msg *tinymq.Msg) {
		mu.Lock()
		mine = append(mine, msg)
		mu.Unlock()
	}

	// scribbler changes every field of its Msg before the others look.
	require.NoError(t, m.RegisterQueue("iso", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
		own(msg)
		snaps <- hSnap(msg)
		msg.ID, msg.Exchange, msg.Queue, msg.RoutingKey = 999, "x", "x", "x"
		msg.Headers, msg.Data, msg.Attempt = map[string]any{"x": 1}, "x", 99
		msg.Deaths, msg.Redelivered = []tinymq.Death{{Queue: "x"}}, true
		close(scribbled)
		return nil
	}, 1, tinymq.WithQueueName("scribbler"), tinymq.WithBindingKey("a.#")))
	// retrier fails once and keeps its first Msg, which its retry scribbles
	// on before it looks at its own. (The retry runs on the same, single
	// worker, after the MQ is done with the first Msg.)
	var first *tinymq.Msg
	require.NoError(t, m.RegisterQueue("iso", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
		own(msg)
		if err := awaitScribble(); err != nil {
			return tinymq.Permanent(err)
		}
		if first == nil {
			first = msg
			snaps <- hSnap(msg)
			return errors.New("again")
		}
		first.RoutingKey, first.Queue, first.Attempt, first.Headers, first.Data = "y", "y", 50, nil, nil
		snaps <- hSnap(msg)
		return nil
	}, 1, tinymq.WithQueueName("retrier"), tinymq.WithBindingKey("*.b.*"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.RegisterQueue("iso", tinymq.Topic, func(_ context.Context, msg *tinymq.Msg) error {
		own(msg)
		if err := awaitScribble(); err != nil {
			return tinymq.Permanent(err)
		}
		snaps <- hSnap(msg)
		return nil
	}, 1, tinymq.WithQueueName("plain"), tinymq.WithBindingKey("#")))
	direct := make(chan tinymq.Delivery[*hPayload], 1)
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "iso", tinymq.Topic, func(_ context.Context, d tinymq.Delivery[*hPayload]) error {
		if err := awaitScribble(); err != nil {
			return tinymq.Permanent(err)
		}
		direct <- d
		return nil
	}, 1, tinymq.WithQueueName("direct"), tinymq.WithBindingKey("a.b.c")))

	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("iso", p, tinymq.WithRoutingKey("a.b.c"), tinymq.WithHeaders(h)))
	stopWithin(t, m)

	want := func(queue string, attempt int) tinymq.Delivery[any] {
		return tinymq.Delivery[any]{ID: 1, Exchange: "iso", Queue: queue, RoutingKey: "a.b.c", Headers: h, Data: p, Attempt: attempt}
	}
	got := recv(t, snaps, 4)
	byQueue := map[string][]tinymq.Delivery[any]{}
	for _, s := range got {
		byQueue[s.Queue] = append(byQueue[s.Queue], s)
	}
	assert.Equal(t, []tinymq.Delivery[any]{want("scribbler", 1)}, byQueue["scribbler"])
	assert.Equal(t, []tinymq.Delivery[any]{want("plain", 1)}, byQueue["plain"], "another queue's scribbles do not show")
	assert.Equal(t, []tinymq.Delivery[any]{want("retrier", 1), want("retrier", 2)}, byQueue["retrier"],
		"neither another queue's scribbles nor the kept Msg's show in the retry")
	d := recv(t, direct, 1)[0]
	assert.Equal(t, tinymq.Delivery[*hPayload]{ID: 1, Exchange: "iso", Queue: "direct", RoutingKey: "a.b.c", Headers: h, Data: p, Attempt: 1}, d)
	assert.Equal(t, map[string]any{"k": "v"}, h, "the headers map is untouched")
	assert.Equal(t, hPayload{N: 7}, *p)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, mine, 4)
	for i := range mine {
		for j := range i {
			assert.NotSame(t, mine[i], mine[j], "every delivery gets a Msg of its own")
		}
	}
	assert.Equal(t, "y", first.RoutingKey, "the kept Msg is the consumer's")
	st := m.Stats()
	assert.Equal(t, hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}, hCountsOf(st.Queues["retrier"]))
	for _, q := range []string{"scribbler", "plain", "direct"} {
		assert.Equal(t, hCounts{Delivered: 1, Succeeded: 1}, hCountsOf(st.Queues[q]), q)
	}
}

// hSnap is the exported fields of msg, as they are now.
func hSnap(msg *tinymq.Msg) tinymq.Delivery[any] {
	return tinymq.Delivery[any]{ID: msg.ID, Exchange: msg.Exchange, Queue: msg.Queue, RoutingKey: msg.RoutingKey,
		Headers: msg.Headers, Data: msg.Data, Attempt: msg.Attempt, Deaths: msg.Deaths, Redelivered: msg.Redelivered}
}

func TestHandlerRegistrationErrors(t *testing.T) {
	okFn := func(context.Context, *hPayload) error { return nil }
	okDel := func(context.Context, tinymq.Delivery[*hPayload]) error { return nil }

	t.Run("nil fn", func(t *testing.T) {
		m := tinymq.New()
		assert.ErrorIs(t, tinymq.RegisterHandler[*hPayload](m, "ev", tinymq.Fanout, nil, 1), tinymq.ErrNilConsumer)
		assert.ErrorIs(t, tinymq.RegisterDeliveryHandler[*hPayload](m, "ev", tinymq.Fanout, nil, 1), tinymq.ErrNilConsumer)
		assert.Empty(t, m.Topology().Queues, "a refused registration changes nothing")
		assert.Empty(t, m.Topology().Exchanges)
		m.Stop()
	})
	t.Run("nil MQ", func(t *testing.T) {
		var m *tinymq.MQ
		assert.NotPanics(t, func() {
			assert.Error(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, okFn, 1))
			assert.Error(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, okDel, 1))
			assert.Error(t, tinymq.RegisterHandler[*hPayload](m, "ev", tinymq.Fanout, nil, 1))
		})
	})
	t.Run("bad arguments", func(t *testing.T) {
		m := tinymq.New()
		assert.ErrorIs(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, okFn, 0), tinymq.ErrInvalidConcurrency)
		assert.ErrorIs(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.ExchangeType(99), okDel, 1), tinymq.ErrInvalidKind)
		assert.ErrorIs(t, tinymq.RegisterHandler(m, "", tinymq.Fanout, okFn, 1), tinymq.ErrEmptyName)
		require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, okFn, 1, tinymq.WithQueueName("q")))
		assert.ErrorIs(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, okDel, 1, tinymq.WithQueueName("q")), tinymq.ErrDuplicateQueue)
		m.Stop()
	})
	t.Run("after Stop", func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.Start(context.Background()))
		m.Stop()
		assert.ErrorIs(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, okFn, 1), tinymq.ErrStopped)
		assert.ErrorIs(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, okDel, 1), tinymq.ErrStopped)
		assert.Empty(t, m.Topology().Queues)
	})
	t.Run("zero MQ", func(t *testing.T) {
		var m tinymq.MQ
		got := make(chan int, 1)
		require.NoError(t, tinymq.RegisterHandler(&m, "ev", tinymq.Fanout, func(_ context.Context, v *hPayload) error {
			got <- v.N
			return nil
		}, 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", &hPayload{N: 4}))
		assert.Equal(t, 4, recv(t, got, 1)[0])
		stopWithin(t, &m)
	})
	t.Run("while running", func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.Start(context.Background()))
		got := make(chan int, 1)
		require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *hPayload) error {
			got <- v.N
			return nil
		}, 1))
		require.NoError(t, m.Publish("ev", &hPayload{N: 3}))
		assert.Equal(t, 3, recv(t, got, 1)[0])
		stopWithin(t, m)
	})
}

func TestDeliveryHandlerOnADurableQueue(t *testing.T) {
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()))
	got := make(chan tinymq.Delivery[hPayload], 2)
	values := make(chan hPayload, 1)
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[hPayload]) error {
		got <- d
		if d.Attempt == 1 {
			return errors.New("once")
		}
		return nil
	}, 1, tinymq.WithQueueName("dq"), tinymq.WithDurable(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v hPayload) error {
		values <- v
		return nil
	}, 1, tinymq.WithQueueName("dq2"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", hPayload{N: 3}, tinymq.WithRoutingKey("rk")))
	stopWithin(t, m)
	ds := recv(t, got, 2)
	for i, d := range ds {
		assert.Equal(t, tinymq.Delivery[hPayload]{ID: 1, Exchange: "ev", Queue: "dq", RoutingKey: "rk", Data: hPayload{N: 3}, Attempt: i + 1}, d)
	}
	assert.Equal(t, hPayload{N: 3}, recv(t, values, 1)[0], "the Encoded data is decoded")
	st := m.Stats()
	assert.Equal(t, hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}, hCountsOf(st.Queues["dq"]))
	assert.Equal(t, hCounts{Delivered: 1, Succeeded: 1}, hCountsOf(st.Queues["dq2"]))
}

// hEngine is an Engine that records the queues declared on it.
type hEngine struct {
	mu    sync.Mutex
	specs map[string]tinymq.QueueSpec
}

func (*hEngine) Init(tinymq.EngineConfig)                         {}
func (*hEngine) DeclareExchange(tinymq.ExchangeSpec) error        { return nil }
func (*hEngine) Bind(tinymq.BindingSpec) error                    { return nil }
func (*hEngine) Publish(context.Context, tinymq.Publishing) error { return nil }
func (*hEngine) Start(context.Context) error                      { return nil }
func (*hEngine) Shutdown(context.Context) error                   { return nil }
func (*hEngine) Stats() tinymq.Stats                              { return tinymq.Stats{} }

func (e *hEngine) DeclareQueue(s tinymq.QueueSpec) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.specs[s.Name] = s
	return nil
}

func TestHandlerOnAnEngineIsAConsumerFunc(t *testing.T) {
	e := &hEngine{specs: map[string]tinymq.QueueSpec{}}
	m := tinymq.New(tinymq.WithEngine(e))
	values := make(chan *hPayload, 2)
	deliveries := make(chan tinymq.Delivery[*hPayload], 2)
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *hPayload) error {
		values <- v
		return nil
	}, 1, tinymq.WithQueueName("h")))
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[*hPayload]) error {
		deliveries <- d
		if d.Attempt > 2 {
			return errors.New("too late")
		}
		return nil
	}, 1, tinymq.WithQueueName("d")))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)

	e.mu.Lock()
	h, d := e.specs["h"], e.specs["d"]
	e.mu.Unlock()
	require.NotNil(t, h.Consumer)
	require.NotNil(t, d.Consumer)
	ctx := context.Background()
	hdr := map[string]any{"k": "v"}
	deaths := []tinymq.Death{{Reason: tinymq.ReasonExpired, Queue: "old"}}
	msg := func(data any, attempt int) *tinymq.Msg {
		return &tinymq.Msg{ID: 7, Exchange: "ev", Queue: "d", RoutingKey: "rk", Headers: hdr, Data: data,
			Attempt: attempt, Deaths: deaths, Redelivered: true}
	}
	enc := tinymq.Encoded{Body: []byte(`{"N":5}`), Codec: tinymq.JSONCodec{}}

	require.NoError(t, h.Consumer(ctx, msg(enc, 1)))
	assert.Equal(t, &hPayload{N: 5}, recv(t, values, 1)[0], "an Encoded is decoded")
	p := &hPayload{N: 6}
	require.NoError(t, h.Consumer(ctx, msg(p, 1)))
	assert.Same(t, p, recv(t, values, 1)[0])
	err := h.Consumer(ctx, msg("wrong", 1))
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)

	require.NoError(t, d.Consumer(ctx, msg(enc, 2)))
	assert.Equal(t, tinymq.Delivery[*hPayload]{ID: 7, Exchange: "ev", Queue: "d", RoutingKey: "rk", Headers: hdr,
		Data: &hPayload{N: 5}, Attempt: 2, Deaths: deaths, Redelivered: true}, recv(t, deliveries, 1)[0])
	assert.EqualError(t, d.Consumer(ctx, msg(p, 3)), "too late", "the consumer's error is returned")
	recv(t, deliveries, 1)
	err = d.Consumer(ctx, msg(nil, 1))
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)
	assert.Empty(t, deliveries)
}
