package tinymq_test

// An Engine serves one MQ (WithEngine).

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// recEngine is a fake engine that records its calls; after Shutdown it
// refuses publishes until the next Init (an engine that may serve again).
type recEngine struct {
	inits, shutdowns, publishes atomic.Int32
	closed                      atomic.Bool
}

func (e *recEngine) Init(tinymq.EngineConfig)                  { e.inits.Add(1); e.closed.Store(false) }
func (*recEngine) DeclareExchange(tinymq.ExchangeSpec) error   { return nil }
func (*recEngine) DeclareQueue(tinymq.QueueSpec) error         { return nil }
func (*recEngine) Bind(tinymq.BindingSpec) error               { return nil }
func (*recEngine) Unbind(tinymq.BindingSpec) error             { return nil }
func (*recEngine) DeleteQueue(string, bool, bool) (int, error) { return 0, nil }
func (*recEngine) PurgeQueue(string) (int, error)              { return 0, nil }
func (*recEngine) DeleteExchange(string, bool) error           { return nil }
func (*recEngine) PauseQueue(string) error                     { return nil }
func (*recEngine) ResumeQueue(string) error                    { return nil }
func (*recEngine) Start(context.Context) error                 { return nil }
func (*recEngine) Stats() tinymq.Stats                         { return tinymq.Stats{} }
func (e *recEngine) Shutdown(context.Context) error {
	e.shutdowns.Add(1)
	e.closed.Store(true)
	return nil
}
func (e *recEngine) Publish(context.Context, tinymq.Publishing) error {
	if e.closed.Load() {
		return errors.New("recEngine: shut down")
	}
	e.publishes.Add(1)
	return nil
}
func (*recEngine) Consume(string, tinymq.ConsumerFunc, int) (tinymq.EngineSubscription, error) {
	return nil, tinymq.ErrUnsupported
}

// The first MQ, shut down, lets the engine go and a second MQ takes it; the
// first MQ's Stop after that (a deferred Stop after an explicit Shutdown is
// common) must not reach the engine that now serves the second MQ.
func TestAStoppedMQNeverReachesTheEngineOfTheNextMQ(t *testing.T) {
	e := &recEngine{}
	first := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))
	require.NoError(t, first.Start(context.Background()))
	require.NoError(t, first.Shutdown(context.Background()))

	second := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, second.DeclareQueue("b", "ev", tinymq.Fanout), "free once the first shut down")
	require.NoError(t, second.Start(context.Background()))
	defer second.Stop()
	require.NoError(t, second.Publish("ev", "1"))

	first.Stop() // the first MQ, long shut down
	assert.Equal(t, int32(1), e.shutdowns.Load(), "the first MQ, shut down, must not reach the engine again")
	assert.NoError(t, second.Publish("ev", "2"), "the second MQ is not affected by the first")
}

// zeroEngine has no fields: pointers to distinct zero-size values may be
// equal (they are, in gc), so two "new" engines are one map key.
type zeroEngine struct{}

func (*zeroEngine) Init(tinymq.EngineConfig)                         {}
func (*zeroEngine) DeclareExchange(tinymq.ExchangeSpec) error        { return nil }
func (*zeroEngine) DeclareQueue(tinymq.QueueSpec) error              { return nil }
func (*zeroEngine) Bind(tinymq.BindingSpec) error                    { return nil }
func (*zeroEngine) Unbind(tinymq.BindingSpec) error                  { return nil }
func (*zeroEngine) DeleteQueue(string, bool, bool) (int, error)      { return 0, nil }
func (*zeroEngine) PurgeQueue(string) (int, error)                   { return 0, nil }
func (*zeroEngine) DeleteExchange(string, bool) error                { return nil }
func (*zeroEngine) PauseQueue(string) error                          { return nil }
func (*zeroEngine) ResumeQueue(string) error                         { return nil }
func (*zeroEngine) Start(context.Context) error                      { return nil }
func (*zeroEngine) Stats() tinymq.Stats                              { return tinymq.Stats{} }
func (*zeroEngine) Shutdown(context.Context) error                   { return nil }
func (*zeroEngine) Publish(context.Context, tinymq.Publishing) error { return nil }
func (*zeroEngine) Consume(string, tinymq.ConsumerFunc, int) (tinymq.EngineSubscription, error) {
	return nil, tinymq.ErrUnsupported
}

func TestDistinctZeroSizeEnginesAreNotRefused(t *testing.T) {
	a, b := new(zeroEngine), new(zeroEngine) // "give each MQ an option of its own"
	first := tinymq.New(tinymq.WithEngine(a))
	defer first.Stop()
	require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))
	second := tinymq.New(tinymq.WithEngine(b))
	defer second.Stop()
	assert.NoError(t, second.DeclareQueue("b", "ev", tinymq.Fanout), "a new engine value of its own (a==b: %v)", any(a) == any(b))
}

// valEngine is a comparable value type: two MQs given equal copies.
type valEngine struct{ name string }

func (valEngine) Init(tinymq.EngineConfig)                         {}
func (valEngine) DeclareExchange(tinymq.ExchangeSpec) error        { return nil }
func (valEngine) DeclareQueue(tinymq.QueueSpec) error              { return nil }
func (valEngine) Bind(tinymq.BindingSpec) error                    { return nil }
func (valEngine) Unbind(tinymq.BindingSpec) error                  { return nil }
func (valEngine) DeleteQueue(string, bool, bool) (int, error)      { return 0, nil }
func (valEngine) PurgeQueue(string) (int, error)                   { return 0, nil }
func (valEngine) DeleteExchange(string, bool) error                { return nil }
func (valEngine) PauseQueue(string) error                          { return nil }
func (valEngine) ResumeQueue(string) error                         { return nil }
func (valEngine) Start(context.Context) error                      { return nil }
func (valEngine) Stats() tinymq.Stats                              { return tinymq.Stats{} }
func (valEngine) Shutdown(context.Context) error                   { return nil }
func (valEngine) Publish(context.Context, tinymq.Publishing) error { return nil }
func (valEngine) Consume(string, tinymq.ConsumerFunc, int) (tinymq.EngineSubscription, error) {
	return nil, tinymq.ErrUnsupported
}

// sliceEngine is a non-comparable value type; anyEngine is statically
// comparable but holds a non-comparable value at run time.
type sliceEngine struct {
	valEngine
	tags []string
}
type anyEngine struct {
	valEngine
	v any
}

func TestEngineValueTypes(t *testing.T) {
	t.Run("equal comparable copies", func(t *testing.T) {
		first := tinymq.New(tinymq.WithEngine(valEngine{"x"}))
		defer first.Stop()
		require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))
		second := tinymq.New(tinymq.WithEngine(valEngine{"x"}))
		defer second.Stop()
		t.Logf("second MQ with an equal copy: %v", second.DeclareQueue("b", "ev", tinymq.Fanout))
		third := tinymq.New(tinymq.WithEngine(valEngine{"y"}))
		defer third.Stop()
		assert.NoError(t, third.DeclareQueue("c", "ev", tinymq.Fanout), "a different value")
	})
	for name, e := range map[string]tinymq.Engine{
		"slice": sliceEngine{tags: []string{"a"}},
		"any":   anyEngine{v: []int{1}},
		"map":   anyEngine{v: map[string]int{}},
	} {
		t.Run("non-comparable "+name, func(t *testing.T) {
			for range 2 {
				m := tinymq.New(tinymq.WithEngine(e))
				require.NotPanics(t, func() {
					require.NoError(t, m.DeclareQueue("a", "ev", tinymq.Fanout))
					require.NoError(t, m.Start(context.Background()))
					require.NoError(t, m.Publish("ev", "x"))
					require.NoError(t, m.Shutdown(context.Background()))
					m.Stop()
				})
			}
			// the map still works for a comparable engine afterwards (no lock left held)
			p := &recEngine{}
			a := tinymq.New(tinymq.WithEngine(p))
			require.NoError(t, a.DeclareQueue("a", "ev", tinymq.Fanout))
			b := tinymq.New(tinymq.WithEngine(p))
			require.ErrorIs(t, b.DeclareQueue("b", "ev", tinymq.Fanout), tinymq.ErrInvalidOption)
			a.Stop()
			b.Stop()
		})
	}
}

func TestEngineConcurrentMQsOneWins(t *testing.T) {
	for range 20 {
		e := &recEngine{}
		const n = 8
		mqs := make([]*tinymq.MQ, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			mqs[i] = tinymq.New(tinymq.WithEngine(e))
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = mqs[i].DeclareQueue("q", "ev", tinymq.Fanout)
			}()
		}
		wg.Wait()
		ok, winner := 0, -1
		for i, err := range errs {
			if err == nil {
				ok++
				winner = i
			} else {
				require.ErrorIs(t, err, tinymq.ErrInvalidOption)
			}
		}
		require.Equal(t, 1, ok)
		assert.Equal(t, int32(1), e.inits.Load(), "Init once, by the winner")
		for i, m := range mqs {
			if i != winner {
				m.Stop()
			}
		}
		require.NoError(t, mqs[winner].Publish("ev", "x"), "the losers' Stop does not touch the winner")
		assert.Equal(t, int32(0), e.shutdowns.Load(), "the losers' Stop does not shut the engine down")
		mqs[winner].Stop()
		next := tinymq.New(tinymq.WithEngine(e))
		require.NoError(t, next.DeclareQueue("q", "ev", tinymq.Fanout))
		next.Stop()
	}
}

func TestEngineShutdownWithExpiredContextFreesIt(t *testing.T) {
	e := &recEngine{}
	first := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))
	require.NoError(t, first.Start(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = first.Shutdown(ctx)
	second := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, second.DeclareQueue("b", "ev", tinymq.Fanout))
	second.Stop()
}

// Start(ctx) with a ctx that ends stops the first MQ (context.AfterFunc): the
// engine is freed then too.
func TestEngineFreedWhenStartContextEnds(t *testing.T) {
	e := &recEngine{}
	first := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, first.Start(ctx))
	cancel()
	// The stop that the context's end begins frees the engine once the
	// engine's Shutdown returned, a moment after Publish starts failing: an
	// MQ given the engine meanwhile is refused (and its Stop leaves the
	// engine alone), so try until one is served.
	var second *tinymq.MQ
	require.Eventually(t, func() bool {
		m := tinymq.New(tinymq.WithEngine(e))
		if err := m.DeclareQueue("b", "ev", tinymq.Fanout); err != nil {
			m.Stop()
			return false
		}
		second = m
		return true
	}, 5*time.Second, time.Millisecond, "the engine is never freed")
	defer second.Stop()
	require.Error(t, first.Publish("ev", "x"), "the first MQ stopped")
}

func TestEngineRefusedMQCalls(t *testing.T) {
	e := &recEngine{}
	first := tinymq.New(tinymq.WithEngine(e))
	defer first.Stop()
	require.NoError(t, first.DeclareQueue("a", "ev", tinymq.Fanout))
	require.NoError(t, first.Start(context.Background()))
	second := tinymq.New(tinymq.WithEngine(e))
	assert.ErrorIs(t, second.DeclareExchange("ev2", tinymq.Topic), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, second.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, second.PublishContext(context.Background(), "ev", "x"), tinymq.ErrInvalidOption)
	assert.ErrorIs(t, second.Start(context.Background()), tinymq.ErrInvalidOption)
	assert.NoError(t, second.Shutdown(context.Background()))
	second.Stop()
	assert.Equal(t, int32(0), e.shutdowns.Load(), "the refused MQ's Stop does not reach the engine")
	assert.Equal(t, int32(1), e.inits.Load())
	require.NoError(t, first.Publish("ev", "y"))
	assert.Equal(t, int32(1), e.publishes.Load())
}

// An MQ given an Engine and dropped without Shutdown is collected, as one
// without an engine is, and then no longer holds its engine from another MQ.
func TestAnMQDroppedWithoutShutdownIsCollectedAndFreesItsEngine(t *testing.T) {
	collected := func(opts ...tinymq.Option) bool {
		var gone atomic.Bool
		func() {
			m := tinymq.New(opts...)
			_ = m.DeclareQueue("a", "ev", tinymq.Fanout)
			runtime.AddCleanup(m, func(*atomic.Bool) { gone.Store(true) }, &gone)
		}()
		for range 20 {
			runtime.GC()
			time.Sleep(time.Millisecond)
			if gone.Load() {
				return true
			}
		}
		return false
	}
	require.True(t, collected(), "control: an in-memory MQ never started is collected")
	e := &recEngine{}
	assert.True(t, collected(tinymq.WithEngine(e)), "an abandoned MQ on an engine is collected")
	next := tinymq.New(tinymq.WithEngine(e))
	defer next.Stop()
	assert.NoError(t, next.DeclareQueue("b", "ev", tinymq.Fanout), "an abandoned MQ does not hold its engine for ever")
}

// statsPanicEngine's Stats panics: it is user code.
type statsPanicEngine struct{ recEngine }

func (*statsPanicEngine) Stats() tinymq.Stats { panic("stats exploded") }

// Shutdown keeps the engine's last Stats once it lets the engine go; an
// engine whose Stats panics does not make Shutdown panic, and the MQ's
// Stats after that are empty, not the next MQ's.
func TestShutdownSurvivesAnEngineWhoseStatsPanic(t *testing.T) {
	e := &statsPanicEngine{}
	m := tinymq.New(tinymq.WithEngine(e))
	require.NoError(t, m.Start(context.Background()))
	require.NotPanics(t, func() { require.NoError(t, m.Shutdown(context.Background())) })
	assert.Empty(t, m.Stats().Queues)
}
