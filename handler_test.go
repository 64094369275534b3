package tinymq_test

import (
	"context"
	"errors"
	"fmt"
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

// hForm is one way of registering a typed consumer. The three forms must
// behave alike, apart from what they allocate; attempt is 0 for the forms
// that do not see it.
type hForm struct {
	name     string
	attempts bool
	register func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
		consume func(ctx context.Context, attempt int, v *numbered) error, concurrency int, opts ...tinymq.QueueOption) error
}

func hForms() []hForm {
	return []hForm{
		{name: "RegisterQueue+Handler", register: func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
			consume func(context.Context, int, *numbered) error, concurrency int, opts ...tinymq.QueueOption) error {
			return m.RegisterQueue(exchange, kind, tinymq.Handler(func(ctx context.Context, v *numbered) error {
				return consume(ctx, 0, v)
			}), concurrency, opts...)
		}},
		{name: "RegisterHandler", register: func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
			consume func(context.Context, int, *numbered) error, concurrency int, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterHandler(m, exchange, kind, func(ctx context.Context, v *numbered) error {
				return consume(ctx, 0, v)
			}, concurrency, opts...)
		}},
		{name: "RegisterDeliveryHandler", attempts: true, register: func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType,
			consume func(context.Context, int, *numbered) error, concurrency int, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterDeliveryHandler(m, exchange, kind, func(ctx context.Context, d tinymq.Delivery[*numbered]) error {
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
			return tinymq.RegisterHandler(m, exchange, kind, func(_ context.Context, p *numbered) error {
				if p == nil || p.N != 1 {
					return errors.New("wrong payload") // no signal: the test times out
				}
				sig <- struct{}{}
				return nil
			}, 1, opts...)
		}},
		{"RegisterDeliveryHandler", true, func(m *tinymq.MQ, exchange string, kind tinymq.ExchangeType, sig chan<- struct{}, opts ...tinymq.QueueOption) error {
			return tinymq.RegisterDeliveryHandler(m, exchange, kind, func(_ context.Context, d tinymq.Delivery[*numbered]) error {
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
				got := hMallocsPerMessage(t, m, &numbered{N: 1}, c.pub, sig, c.queues, rounds, batch)
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
				got := make(chan tinymq.Delivery[*numbered], 2)
				values := make(chan *numbered, 2)
				opts := slices.Concat(r.bind, p.queue, []tinymq.QueueOption{tinymq.WithQueueName("q")})
				require.NoError(t, tinymq.RegisterDeliveryHandler(m, r.exchange, r.kind, func(_ context.Context, d tinymq.Delivery[*numbered]) error {
					got <- d
					return nil
				}, 1, opts...))
				opts = slices.Concat(r.bind, p.queue, []tinymq.QueueOption{tinymq.WithQueueName("q2")})
				require.NoError(t, tinymq.RegisterHandler(m, r.exchange, r.kind, func(_ context.Context, v *numbered) error {
					values <- v
					return nil
				}, 1, opts...))
				require.NoError(t, m.Start(context.Background()))
				sent := []*numbered{{N: 1}, {N: 2}}
				for _, v := range sent {
					require.NoError(t, m.Publish(r.publish, v, slices.Concat(r.pub, p.pub)...))
				}
				stopWithin(t, m)
				ds := recv(t, got, 2)
				slices.SortFunc(ds, func(a, b tinymq.Delivery[*numbered]) int { return int(a.ID) - int(b.ID) })
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
	act         func(call int, v *numbered) error
	calls       int // consumer calls
	want        hCounts
	death       string // in the death's LastError; "": not dead-lettered
	attempts    int    // the death's Attempts
	stack       bool   // a panic: logged with its stack
}

func hScenarios() []hScenario {
	ok := func(int, *numbered) error { return nil }
	transient := errors.New("transient")
	failFirst := func(err error) func(int, *numbered) error {
		return func(call int, _ *numbered) error {
			if call == 1 {
				return err
			}
			return nil
		}
	}
	var typedNil *nilErr
	good := tinymq.Encoded{Body: []byte(`{"N":42}`), Codec: tinymq.JSONCodec{}}
	return []hScenario{
		{name: "success", data: &numbered{N: 1}, act: ok, calls: 1, want: hCounts{Delivered: 1, Succeeded: 1}},
		{name: "error then success", data: &numbered{N: 1}, maxAttempts: 3, calls: 3,
			act: func(call int, _ *numbered) error {
				if call < 3 {
					return transient
				}
				return nil
			},
			want: hCounts{Delivered: 3, Succeeded: 1, Failed: 2, Retried: 2}},
		{name: "errors until dead-lettered", data: &numbered{N: 1}, maxAttempts: 3, calls: 3,
			act:  func(int, *numbered) error { return errors.New("boom") },
			want: hCounts{Delivered: 3, Failed: 3, Retried: 2, DeadLettered: 1}, death: "boom", attempts: 3},
		{name: "permanent", data: &numbered{N: 1}, maxAttempts: 3, calls: 1,
			act:  func(int, *numbered) error { return tinymq.Permanent(errors.New("bad input")) },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: "bad input", attempts: 1},
		{name: "panic then success", data: &numbered{N: 1}, maxAttempts: 2, calls: 2, stack: true,
			act: func(call int, _ *numbered) error {
				if call == 1 {
					panic("kaboom")
				}
				return nil
			},
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "panic dead-lettered", data: &numbered{N: 1}, calls: 1, stack: true,
			act:  func(int, *numbered) error { panic("kaboom") },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: "kaboom", attempts: 1},
		{name: "typed nil then success", data: &numbered{N: 1}, maxAttempts: 2, calls: 2, act: failFirst(typedNil),
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "typed nil dead-lettered", data: &numbered{N: 1}, calls: 1,
			act:  func(int, *numbered) error { return typedNil },
			want: hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, death: tinymq.ErrTypedNil.Error(), attempts: 1},
		{name: "goexit then success", data: &numbered{N: 1}, maxAttempts: 2, calls: 2,
			act: func(call int, _ *numbered) error {
				if call == 1 {
					runtime.Goexit()
				}
				return nil
			},
			want: hCounts{Delivered: 2, Succeeded: 1, Failed: 1, Retried: 1}},
		{name: "goexit dead-lettered", data: &numbered{N: 1}, calls: 1,
			act:  func(int, *numbered) error { runtime.Goexit(); return nil },
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
	v       *numbered
}

func runScenario(t *testing.T, f hForm, pathOpts []tinymq.QueueOption, sc hScenario) {
	logger, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(logger))
	dead := hDeadQueue(t, m, 4)
	var mu sync.Mutex
	var calls []hCall
	consume := func(ctx context.Context, attempt int, v *numbered) error {
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
	if f.name != "RegisterQueue+Handler" && (sc.name == "wrong type" || sc.name == "nil data") {
		// The queue knows its payload type: Publish refuses what its
		// consumer could never take (see typed_publish_test.go).
		require.ErrorIs(t, m.Publish("ev", sc.data), tinymq.ErrPayloadType)
		stopWithin(t, m)
		assert.Zero(t, m.Stats().Queues["work"].Accepted)
		return
	}
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
		case *numbered:
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
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, _ int, v *numbered) error {
				if v.N < n {
					runtime.Goexit()
				}
				done <- v.N
				return nil
			}, 2, tinymq.WithQueueName("q")))
			require.NoError(t, m.Start(context.Background()))
			for i := range 2 * n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
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
			require.NoError(t, f.register(m, "ev", tinymq.Topic, func(_ context.Context, attempt int, v *numbered) error {
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
				require.NoError(t, m.Publish("ev", &numbered{N: i}, tinymq.WithRoutingKey("ev.x")))
			}
			stopWithin(t, m)
			assert.Equal(t, want, hCountsOf(m.Stats().Queues["q"]))
			require.Len(t, dead, int(want.DeadLettered))
			for range want.DeadLettered {
				d := <-dead
				require.Len(t, d.Deaths, 1)
				assert.Equal(t, "permanent", d.Deaths[0].LastError)
				assert.Equal(t, "ev.x", d.RoutingKey)
				assert.Zero(t, d.Data.(*numbered).N%5)
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
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, _ int, v *numbered) error {
				if v.N == 0 {
					close(entered)
					<-release
				}
				got.Add(1)
				return nil
			}, 1, tinymq.WithQueueName("q")))
			require.NoError(t, m.Start(context.Background()))
			for i := range 5 {
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
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
			assert.ErrorIs(t, m.Publish("ev", &numbered{}), tinymq.ErrStopped)
		})
		t.Run(f.name+"/Shutdown deadline", func(t *testing.T) {
			m := tinymq.New()
			entered, returned := make(chan struct{}), make(chan struct{})
			var sawCancel atomic.Bool
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(ctx context.Context, _ int, v *numbered) error {
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
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
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
	p := &numbered{N: 7}
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
	direct := make(chan tinymq.Delivery[*numbered], 1)
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "iso", tinymq.Topic, func(_ context.Context, d tinymq.Delivery[*numbered]) error {
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
	assert.Equal(t, tinymq.Delivery[*numbered]{ID: 1, Exchange: "iso", Queue: "direct", RoutingKey: "a.b.c", Headers: h, Data: p, Attempt: 1}, d)
	assert.Equal(t, map[string]any{"k": "v"}, h, "the headers map is untouched")
	assert.Equal(t, numbered{N: 7}, *p)
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
	okFn := func(context.Context, *numbered) error { return nil }
	okDel := func(context.Context, tinymq.Delivery[*numbered]) error { return nil }

	t.Run("nil fn", func(t *testing.T) {
		m := tinymq.New()
		assert.ErrorIs(t, tinymq.RegisterHandler[*numbered](m, "ev", tinymq.Fanout, nil, 1), tinymq.ErrNilConsumer)
		assert.ErrorIs(t, tinymq.RegisterDeliveryHandler[*numbered](m, "ev", tinymq.Fanout, nil, 1), tinymq.ErrNilConsumer)
		assert.Empty(t, m.Topology().Queues, "a refused registration changes nothing")
		assert.Empty(t, m.Topology().Exchanges)
		m.Stop()
	})
	t.Run("nil MQ", func(t *testing.T) {
		var m *tinymq.MQ
		assert.NotPanics(t, func() {
			assert.Error(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, okFn, 1))
			assert.Error(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, okDel, 1))
			assert.Error(t, tinymq.RegisterHandler[*numbered](m, "ev", tinymq.Fanout, nil, 1))
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
		require.NoError(t, tinymq.RegisterHandler(&m, "ev", tinymq.Fanout, func(_ context.Context, v *numbered) error {
			got <- v.N
			return nil
		}, 1))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", &numbered{N: 4}))
		assert.Equal(t, 4, recv(t, got, 1)[0])
		stopWithin(t, &m)
	})
	t.Run("while running", func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.Start(context.Background()))
		got := make(chan int, 1)
		require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *numbered) error {
			got <- v.N
			return nil
		}, 1))
		require.NoError(t, m.Publish("ev", &numbered{N: 3}))
		assert.Equal(t, 3, recv(t, got, 1)[0])
		stopWithin(t, m)
	})
}

func TestDeliveryHandlerOnADurableQueue(t *testing.T) {
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()))
	got := make(chan tinymq.Delivery[numbered], 2)
	values := make(chan numbered, 1)
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[numbered]) error {
		got <- d
		if d.Attempt == 1 {
			return errors.New("once")
		}
		return nil
	}, 1, tinymq.WithQueueName("dq"), tinymq.WithDurable(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond})))
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v numbered) error {
		values <- v
		return nil
	}, 1, tinymq.WithQueueName("dq2"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", numbered{N: 3}, tinymq.WithRoutingKey("rk")))
	stopWithin(t, m)
	ds := recv(t, got, 2)
	for i, d := range ds {
		assert.Equal(t, tinymq.Delivery[numbered]{ID: 1, Exchange: "ev", Queue: "dq", RoutingKey: "rk", Data: numbered{N: 3}, Attempt: i + 1}, d)
	}
	assert.Equal(t, numbered{N: 3}, recv(t, values, 1)[0], "the Encoded data is decoded")
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
func (*hEngine) Unbind(tinymq.BindingSpec) error                  { return nil }
func (*hEngine) Consume(string, tinymq.ConsumerFunc, int) (tinymq.EngineSubscription, error) {
	return nil, tinymq.ErrUnsupported
}
func (*hEngine) DeleteQueue(string, bool, bool) (int, error) { return 0, tinymq.ErrUnsupported }
func (*hEngine) PurgeQueue(string) (int, error)              { return 0, tinymq.ErrUnsupported }
func (*hEngine) DeleteExchange(string, bool) error           { return tinymq.ErrUnsupported }
func (*hEngine) PauseQueue(string) error                     { return tinymq.ErrUnsupported }
func (*hEngine) ResumeQueue(string) error                    { return tinymq.ErrUnsupported }
func (*hEngine) Shutdown(context.Context) error              { return nil }
func (*hEngine) Stats() tinymq.Stats                         { return tinymq.Stats{} }

func (e *hEngine) DeclareQueue(s tinymq.QueueSpec) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.specs[s.Name] = s
	return nil
}

func TestHandlerOnAnEngineIsAConsumerFunc(t *testing.T) {
	e := &hEngine{specs: map[string]tinymq.QueueSpec{}}
	m := tinymq.New(tinymq.WithEngine(e))
	values := make(chan *numbered, 2)
	deliveries := make(chan tinymq.Delivery[*numbered], 2)
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, v *numbered) error {
		values <- v
		return nil
	}, 1, tinymq.WithQueueName("h")))
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[*numbered]) error {
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
	assert.Equal(t, &numbered{N: 5}, recv(t, values, 1)[0], "an Encoded is decoded")
	p := &numbered{N: 6}
	require.NoError(t, h.Consumer(ctx, msg(p, 1)))
	assert.Same(t, p, recv(t, values, 1)[0])
	err := h.Consumer(ctx, msg("wrong", 1))
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)

	require.NoError(t, d.Consumer(ctx, msg(enc, 2)))
	assert.Equal(t, tinymq.Delivery[*numbered]{ID: 7, Exchange: "ev", Queue: "d", RoutingKey: "rk", Headers: hdr,
		Data: &numbered{N: 5}, Attempt: 2, Deaths: deaths, Redelivered: true}, recv(t, deliveries, 1)[0])
	assert.EqualError(t, d.Consumer(ctx, msg(p, 3)), "too late", "the consumer's error is returned")
	recv(t, deliveries, 1)
	err = d.Consumer(ctx, msg(nil, 1))
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)
	assert.Empty(t, deliveries)
}

// Every failure mode (error, panic, typed nil, Goexit, Permanent) is retried,
// dead-lettered and counted alike by every consumer form, and never costs a
// worker: afterwards the queue's 2 workers still run side by side.
func TestEveryConsumerFormRetriesDeadLettersAndCountsFailuresAlike(t *testing.T) {
	modes := []struct {
		name     string
		attempts int
		mark     string
	}{
		{"error", 3, "rv-boom"},
		{"panic", 3, "rv-panic"},
		{"typednil", 3, "typed nil"},
		{"goexit", 3, "Goexit"},
		{"permanent", 1, "rv-perm"},
	}
	for _, f := range consumerForms() {
		for _, mode := range modes {
			t.Run(f.name+"/"+mode.name, func(t *testing.T) {
				m := tinymq.New()
				dead := hDeadQueue(t, m, 100)
				bar := newBarrier(2)
				fn := func(ctx context.Context, c formCall) error {
					if c.N >= 1000 {
						return bar.arrive(ctx)
					}
					switch mode.name {
					case "error":
						return errors.New("rv-boom")
					case "panic":
						panic("rv-panic")
					case "typednil":
						var e *nilErr
						return e
					case "goexit":
						runtime.Goexit()
					case "permanent":
						return tinymq.Permanent(errors.New("rv-perm"))
					}
					return nil
				}
				require.NoError(t, f.register(m, "ev", tinymq.Fanout, fn, 2, tinymq.WithQueueName("q"),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}),
					tinymq.WithDeadLetter("dlx", "")))
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				for i := range 10 {
					require.NoError(t, m.Publish("ev", &numbered{N: i}))
				}
				for _, d := range recv(t, dead, 10) {
					if assert.Len(t, d.Deaths, 1) {
						assert.Equal(t, tinymq.ReasonRejected, d.Deaths[0].Reason)
						assert.Equal(t, "q", d.Deaths[0].Queue)
						assert.Equal(t, mode.attempts, d.Deaths[0].Attempts)
						assert.Contains(t, d.Deaths[0].LastError, mode.mark)
					}
				}
				require.NoError(t, m.Publish("ev", &numbered{N: 1000}))
				require.NoError(t, m.Publish("ev", &numbered{N: 1001}))
				expectBarrier(t, bar, m, "q")
				stopWithin(t, m)
				s := m.Stats().Queues["q"]
				a := uint64(mode.attempts)
				assert.Equal(t, hCounts{Delivered: 10*a + 2, Succeeded: 2, Failed: 10 * a, Retried: 10 * (a - 1), DeadLettered: 10},
					hCountsOf(s))
				assert.Equal(t, uint64(12), s.Accepted)
				assertLedger(t, "q", s)
			})
		}
	}
}

// The payload rules are Handler's for every typed form: nil or foreign Data
// fails permanently with ErrPayloadType; a typed nil *T is a T. A typed
// form whose queue knows its type (all but Handler, a plain ConsumerFunc)
// refuses such Data at Publish instead (see typed_publish_test.go).
func TestTypedFormsFollowHandlersPayloadRules(t *testing.T) {
	cases := []struct {
		name string
		data any
		ok   bool
	}{
		{"nil data", nil, false},
		{"string data", "str", false},
		{"value instead of pointer", numbered{N: 1}, false},
		{"typed nil pointer", (*numbered)(nil), true},
	}
	for _, f := range consumerForms()[1:] { // the three typed forms
		for _, c := range cases {
			t.Run(f.name+"/"+c.name, func(t *testing.T) {
				m := tinymq.New()
				dead := hDeadQueue(t, m, 10)
				got := make(chan int, 10)
				require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, rc formCall) error {
					got <- rc.N
					return nil
				}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", ""),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				if !c.ok && f.name != "Handler" {
					require.ErrorIs(t, m.Publish("ev", c.data), tinymq.ErrPayloadType, "refused at Publish")
					stopWithin(t, m)
					s := m.Stats().Queues["q"]
					assert.Equal(t, hCounts{}, hCountsOf(s))
					assert.Zero(t, s.Accepted)
					return
				}
				require.NoError(t, m.Publish("ev", c.data))
				if c.ok {
					assert.Equal(t, []int{-1}, recv(t, got, 1))
				} else {
					d := recv(t, dead, 1)[0]
					if assert.Len(t, d.Deaths, 1) {
						assert.Equal(t, 1, d.Deaths[0].Attempts, "permanent: no retries")
						assert.Contains(t, d.Deaths[0].LastError, "payload")
					}
				}
				stopWithin(t, m)
				s := m.Stats().Queues["q"]
				if c.ok {
					assert.Equal(t, hCounts{Delivered: 1, Succeeded: 1}, hCountsOf(s))
				} else {
					assert.Equal(t, hCounts{Delivered: 1, Failed: 1, DeadLettered: 1}, hCountsOf(s), "as Handler counts it")
				}
				assertLedger(t, "q", s)
			})
		}
	}
	t.Run("interface T gets nil Data as zero T", func(t *testing.T) {
		m := tinymq.New()
		got := make(chan fmt.Stringer, 2)
		gotErr := make(chan error, 2)
		require.NoError(t, tinymq.RegisterDeliveryHandler(m, "s", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[fmt.Stringer]) error {
			got <- d.Data
			return nil
		}, 1, tinymq.WithQueueName("s")))
		require.NoError(t, tinymq.RegisterHandler(m, "e", tinymq.Fanout, func(_ context.Context, e error) error {
			gotErr <- e
			return nil
		}, 1, tinymq.WithQueueName("e")))
		require.NoError(t, m.Start(context.Background()))
		defer stopWithin(t, m)
		require.NoError(t, m.Publish("s", nil))
		require.NoError(t, m.Publish("e", nil))
		assert.Nil(t, recv(t, got, 1)[0])
		assert.Nil(t, recv(t, gotErr, 1)[0])
		require.NoError(t, m.Publish("s", time.Second)) // a time.Duration is a Stringer
		assert.Equal(t, "1s", recv(t, got, 1)[0].String())
		require.ErrorIs(t, m.Publish("s", 5), tinymq.ErrPayloadType) // an int is not: refused at Publish
		stopWithin(t, m)
		s := m.Stats().Queues["s"]
		assert.Equal(t, hCounts{Delivered: 2, Succeeded: 2}, hCountsOf(s))
		assertLedger(t, "s", s)
	})
}

// bigPayload is a payload larger than an interface word.
type bigPayload struct{ A [16]int64 }

func typedAllocCase[T any](t *testing.T, name string, v T, check func(T) bool) {
	for _, conc := range []int{1, 4} {
		for _, queues := range []int{1, 3} {
			for _, delivery := range []bool{false, true} {
				form := "RegisterHandler"
				if delivery {
					form = "RegisterDeliveryHandler"
				}
				for _, headers := range []bool{false, true} {
					label := fmt.Sprintf("%s/%s/conc%d/queues%d/headers=%v", name, form, conc, queues, headers)
					t.Run(label, func(t *testing.T) {
						m := tinymq.New()
						sig := make(chan struct{}, 100*queues)
						var bad atomic.Int64
						for range queues {
							var err error
							if delivery {
								err = tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[T]) error {
									if !check(d.Data) || d.Attempt != 1 {
										bad.Add(1)
									}
									sig <- struct{}{}
									return nil
								}, conc)
							} else {
								err = tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, got T) error {
									if !check(got) {
										bad.Add(1)
									}
									sig <- struct{}{}
									return nil
								}, conc)
							}
							require.NoError(t, err)
						}
						require.NoError(t, m.Start(context.Background()))
						defer stopWithin(t, m)
						var opts []tinymq.PublishOption
						limit := 0.05
						if headers {
							// A message with headers may need one record per
							// publish (README: made by Publish for any other).
							opts = []tinymq.PublishOption{tinymq.WithHeaders(map[string]any{"h": "v"})}
							limit = 1.05
						}
						var boxed any = v
						got := hMallocsPerMessage(t, m, boxed, opts, sig, queues, 50, 100)
						t.Logf("%.3f allocations per published message", got)
						assert.LessOrEqual(t, got, limit, "a typed delivery of Data already a T allocates nothing")
						assert.Zero(t, bad.Load(), "wrong payload delivered")
					})
				}
			}
		}
	}
}

// "neither allocates anything to deliver a message whose Data is already of
// that type": value types, big structs, strings, slices; several workers;
// several queues.
func TestTypedFormsAllocateNothingPerDelivery(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	typedAllocCase(t, "string", "hello", func(s string) bool { return s == "hello" })
	typedAllocCase(t, "int", 77, func(n int) bool { return n == 77 })
	typedAllocCase(t, "bigstruct", bigPayload{A: [16]int64{15: 9}}, func(b bigPayload) bool { return b.A[15] == 9 })
	typedAllocCase(t, "slice", []byte("abc"), func(b []byte) bool { return len(b) == 3 })
	typedAllocCase(t, "pointer", &numbered{N: 3}, func(p *numbered) bool { return p.N == 3 })
}

// Stop and Shutdown called from inside a typed consumer begin the stop and
// return at once.
func TestStopAndShutdownFromATypedConsumerReturnAtOnce(t *testing.T) {
	for _, f := range consumerForms() {
		t.Run(f.name, func(t *testing.T) {
			m := tinymq.New()
			res := make(chan error, 2)
			require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, c formCall) error {
				if c.N == 0 {
					res <- m.Shutdown(context.Background())
					m.Stop()
					res <- nil
				}
				return nil
			}, 2, tinymq.WithQueueName("q")))
			for i := range 5 { // before Start: the stop begins with the first
				require.NoError(t, m.Publish("ev", &numbered{N: i}))
			}
			require.NoError(t, m.Start(context.Background()))
			got := recv(t, res, 2)
			assert.ErrorIs(t, got[0], tinymq.ErrCalledFromConsumer)
			stopWithin(t, m)
			assert.ErrorIs(t, m.Publish("ev", &numbered{N: 9}), tinymq.ErrStopped)
			s := m.Stats().Queues["q"]
			assert.Equal(t, uint64(5), s.Succeeded)
			assertLedger(t, "q", s)
		})
	}
}

// Retries waiting on their backoff: Stop waits for them; a Shutdown deadline
// drops them and counts them Undelivered.
func TestTypedFormsRetriesWaitingAtStopOrShutdown(t *testing.T) {
	for _, f := range consumerForms() {
		for _, how := range []string{"stop", "shutdown"} {
			t.Run(f.name+"/"+how, func(t *testing.T) {
				m := tinymq.New()
				var calls callCounts
				failed := make(chan struct{}, 10)
				backoff := 100 * time.Millisecond
				if how == "shutdown" {
					backoff = time.Hour
				}
				require.NoError(t, f.register(m, "ev", tinymq.Fanout, func(_ context.Context, c formCall) error {
					if calls.inc(c.N) == 1 {
						failed <- struct{}{}
						return errors.New("first")
					}
					return nil
				}, 2, tinymq.WithQueueName("q"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: backoff})))
				require.NoError(t, m.Start(context.Background()))
				for n := range 10 {
					require.NoError(t, m.Publish("ev", &numbered{N: n}))
				}
				recv(t, failed, 10)
				if how == "stop" {
					stopWithin(t, m)
					assert.Equal(t, hCounts{Delivered: 20, Succeeded: 10, Failed: 10, Retried: 10}, hCountsOf(m.Stats().Queues["q"]))
				} else {
					require.Eventually(t, func() bool { return m.Stats().Queues["q"].Scheduled == 10 }, wait, time.Millisecond)
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					err := m.Shutdown(ctx)
					cancel()
					require.ErrorIs(t, err, tinymq.ErrUndelivered)
					stopWithin(t, m)
					assert.Equal(t, hCounts{Delivered: 10, Failed: 10, Retried: 10, Undelivered: 10}, hCountsOf(m.Stats().Queues["q"]))
				}
				assertLedger(t, "q", m.Stats().Queues["q"])
			})
		}
	}
}

// On a durable queue Data is an Encoded: a typed consumer of Encoded itself
// has "Data already of that type" and must get the codec's bytes, not an
// Encoded decoded from them; a consumer of any gets something that holds
// the payload.
func TestTypedFormsOnADurableQueueGetEncodedData(t *testing.T) {
	m := tinymq.New(tinymq.WithDataDir(t.TempDir()))
	enc := make(chan tinymq.Encoded, 1)
	anyc := make(chan any, 1)
	require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(_ context.Context, e tinymq.Encoded) error {
		enc <- e
		return nil
	}, 1, tinymq.WithQueueName("enc"), tinymq.WithDurable()))
	require.NoError(t, tinymq.RegisterDeliveryHandler(m, "ev", tinymq.Fanout, func(_ context.Context, d tinymq.Delivery[any]) error {
		anyc <- d.Data
		return nil
	}, 1, tinymq.WithQueueName("any"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	require.NoError(t, m.Publish("ev", &numbered{N: 5}))
	e := recv(t, enc, 1)[0]
	assert.JSONEq(t, `{"N":5}`, string(e.Body))
	var p numbered
	if assert.NoError(t, e.Decode(&p)) {
		assert.Equal(t, 5, p.N)
	}
	a := recv(t, anyc, 1)[0]
	t.Logf("Delivery[any] on a durable queue got %T %v", a, a)
	n, ok := numberOf(a)
	if !ok {
		if mp, isMap := a.(map[string]any); isMap {
			n, ok = int(mp["N"].(float64)), true
		}
	}
	assert.True(t, ok && n == 5, "the payload is reachable")
}

func TestHandlerIsTyped(t *testing.T) {
	got := make(chan UserCreated, 1)
	m := tinymq.New()
	dead := deadLetters(t, m)
	require.NoError(t, m.RegisterQueue("users", tinymq.Fanout, tinymq.Handler(func(_ context.Context, u UserCreated) error {
		got <- u
		return nil
	}), 1, tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond}), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("users", UserCreated{ID: 7, Email: "a@b.c"}))
	require.NoError(t, m.Publish("users", "not a user"))
	m.Stop()
	require.Len(t, got, 1)
	require.Len(t, dead, 1)
	assert.Equal(t, UserCreated{ID: 7, Email: "a@b.c"}, <-got)
	d := <-dead
	assert.Equal(t, "not a user", d.Data)
	assert.Equal(t, 1, d.Deaths[0].Attempts, "a payload of the wrong type is not retried")
	assert.Contains(t, d.Deaths[0].LastError, "got string, want tinymq_test.UserCreated")

	var nilFn func(context.Context, int) error
	assert.ErrorIs(t, tinymq.New().RegisterQueue("x", tinymq.Fanout, tinymq.Handler(nilFn), 1), tinymq.ErrNilConsumer)

	err := tinymq.Handler(func(context.Context, int) error { return nil })(context.Background(), &tinymq.Msg{Data: "x"})
	assert.ErrorIs(t, err, tinymq.ErrPayloadType)
	assert.ErrorIs(t, err, tinymq.ErrPermanent)
}
