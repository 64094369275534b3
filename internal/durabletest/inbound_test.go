package durabletest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// outcome collects what each Publish returned.
type outcome struct {
	mu      sync.Mutex
	ok      map[int]bool
	stopped map[int]bool
	logErr  map[int]bool // ErrLog: the closing log cut the write short; it may still be on disk (README)
	other   map[int]error
}

func newOutcome() *outcome {
	return &outcome{ok: map[int]bool{}, stopped: map[int]bool{}, logErr: map[int]bool{}, other: map[int]error{}}
}

func (o *outcome) add(n int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case err == nil:
		o.ok[n] = true
	case isStopped(err):
		o.stopped[n] = true
	case errors.Is(err, tinymq.ErrLog): // the deadline closed the log during its write: it may be on disk
		o.logErr[n] = true
	default:
		o.other[n] = err
	}
}

func setOf(xs []int) map[int]int {
	s := map[int]int{}
	for _, x := range xs {
		s[x]++
	}
	return s
}

// publishers runs k publishers of unique ints on ex until each sees an error
// that is not nil, or until stop is closed; started is closed after `after`
// successful publishes in all.
func publishers(t *testing.T, m *tinymq.MQ, ex string, k int, o *outcome, after int, started chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var okN atomic.Int64
	var once sync.Once
	for p := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				n := p*1_000_000 + i
				err := m.Publish(ex, n)
				o.add(n, err)
				if err != nil {
					return
				}
				if okN.Add(1) == int64(after) {
					once.Do(func() { close(started) })
				}
			}
		}()
	}
	return &wg
}

func waitWG(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("%s did not return within %v", what, bound)
	}
}

// Promise: Stop or Shutdown racing many durable publishers (to a fanout of a
// durable and an in-memory queue): every nil Publish is delivered to both (or,
// after a deadline, counted undelivered and, for the durable queue, delivered
// after a restart); every ErrStopped Publish is never delivered, also after a
// restart; the ledger is exact and equals the nil publishes.
func TestStopRacingDurablePublishers(t *testing.T) {
	for _, c := range []struct {
		name     string
		deadline time.Duration // 0: Stop
	}{{"Stop", 0}, {"Shutdown 0", time.Nanosecond}, {"Shutdown 1ms", time.Millisecond}, {"Shutdown 3ms", 3 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			for iter := range 6 {
				dir := t.TempDir()
				d, mem := newRecorder(-1), newRecorder(-1)
				m := tinymq.New(tinymq.WithDataDir(dir))
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, d.consumer(t), 4, tinymq.WithQueueName("d"), tinymq.WithDurable()))
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, mem.consumer(t), 4, tinymq.WithQueueName("m")))
				d2 := newRecorder(-1)
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, d2.consumer(t), 2, tinymq.WithQueueName("d2"), tinymq.WithDurable()))
				require.NoError(t, m.Start(context.Background()))
				o := newOutcome()
				started := make(chan struct{})
				wg := publishers(t, m, "ev", 48, o, 300, started)
				select {
				case <-started:
				case <-time.After(bound):
					t.Fatal("publishers made no progress")
				}
				var serr error
				if c.deadline == 0 {
					stopWithin(t, m)
				} else {
					serr = shutdownShort(t, m, c.deadline)
				}
				waitWG(t, wg, "publishers")
				require.Empty(t, o.other, "errors other than ErrStopped and ErrLog")
				st := m.Stats()
				checkLedger(t, m, "d", "m", "d2")
				for _, q := range []string{"d", "m", "d2"} {
					assert.Equal(t, uint64(len(o.ok)), st.Queues[q].Accepted, "iter %d: %s Accepted vs nil publishes", iter, q)
				}
				ds, ms := setOf(d.ns()), setOf(mem.ns())
				for n := range o.stopped {
					assert.Zero(t, ds[n], "ErrStopped publish %d delivered to d", n)
					assert.Zero(t, ms[n], "ErrStopped publish %d delivered to m", n)
				}
				for n, k := range ds {
					assert.True(t, o.ok[n], "d got %d which was not accepted", n)
					assert.Equal(t, 1, k, "d got %d %d times", n, k)
				}
				for n, k := range ms {
					assert.True(t, o.ok[n], "m got %d which was not accepted", n)
					assert.Equal(t, 1, k)
				}
				for n := range setOf(d2.ns()) {
					assert.True(t, o.ok[n], "d2 got %d which was not accepted", n)
				}
				if c.deadline == 0 {
					require.NoError(t, serr)
					assert.Len(t, ms, len(o.ok))
					assert.Len(t, ds, len(o.ok))
				}
				// restart
				r2 := newRecorder(-1)
				m2 := tinymq.New(tinymq.WithDataDir(dir))
				require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r2.consumer(t), 4, tinymq.WithQueueName("d"), tinymq.WithDurable()))
				require.NoError(t, m2.Start(context.Background()))
				stopWithin(t, m2)
				again := setOf(r2.ns())
				for n := range again {
					if o.stopped[n] {
						t.Errorf("iter %d: publish %d returned ErrStopped but was delivered after the restart", iter, n)
					}
					if !o.ok[n] && !o.stopped[n] && !o.logErr[n] {
						t.Errorf("iter %d: %d delivered after the restart, never published", iter, n)
					}
				}
				if c.deadline == 0 {
					assert.Empty(t, again, "iter %d: a clean Stop acknowledged everything; nothing should come back", iter)
				}
				for n := range o.ok {
					if ds[n] == 0 && again[n] == 0 {
						t.Errorf("iter %d: accepted %d never reached d, not even after the restart", iter, n)
					}
				}
				t.Logf("iter %d: ok %d stopped %d; d %d, m %d, after restart %d; %v", iter, len(o.ok), len(o.stopped), len(ds), len(ms), len(again), serr)
				if t.Failed() {
					return
				}
			}
		})
	}
}

// Promise: RegisterQueue and Bind racing durable publishes: a queue registered
// (or bound) while running gets every message published after the call
// returned, each once; nothing refused is delivered; nothing hangs.
func TestRegisterAndBindRacingDurablePublishes(t *testing.T) {
	dir := t.TempDir()
	m := tinymq.New(tinymq.WithDataDir(dir))
	base := newRecorder(-1)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, base.consumer(t), 4, tinymq.WithQueueName("base"), tinymq.WithDurable()))
	side := newRecorder(-1)
	require.NoError(t, m.RegisterQueue("sidex", tinymq.Fanout, side.consumer(t), 2, tinymq.WithQueueName("side"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))

	var ticket atomic.Int64
	var mu sync.Mutex
	tickets := map[int]int64{} // message -> ticket taken before its Publish
	o := newOutcome()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := p*1_000_000 + i
				tk := ticket.Add(1)
				mu.Lock()
				tickets[n] = tk
				mu.Unlock()
				err := m.Publish("ev", n)
				o.add(n, err)
				if err != nil {
					return
				}
			}
		}()
	}
	const k = 12
	regAt := map[string]int64{}
	recs := map[string]*recorder{}
	for i := range k {
		name := fmt.Sprint("r", i)
		r := newRecorder(-1)
		recs[name] = r
		opts := []tinymq.QueueOption{tinymq.WithQueueName(name)}
		if i%3 != 2 {
			opts = append(opts, tinymq.WithDurable())
		}
		target := ticket.Load() + 300
		for ticket.Load() < target { // bounded poll: let the publishers get ahead
			select {
			case <-time.After(100 * time.Microsecond):
			case <-time.After(bound):
				t.Fatal("publishers stalled")
			}
		}
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, r.consumer(t), 1+i%3, opts...))
		regAt[name] = ticket.Load()
		if i == k/2 {
			require.NoError(t, m.Bind("side", "ev", tinymq.Fanout))
			regAt["side"] = ticket.Load()
			recs["side"] = side
		}
	}
	close(stop)
	waitWG(t, &wg, "publishers")
	stopWithin(t, m)
	require.Empty(t, o.other)
	require.Empty(t, o.stopped)
	names := []string{"base"}
	for n := range recs {
		names = append(names, n)
	}
	checkLedger(t, m, names...)
	for name, r := range recs {
		s := setOf(r.ns())
		missing := 0
		for n := range o.ok {
			if tickets[n] > regAt[name] && s[n] == 0 {
				missing++
			}
		}
		assert.Zero(t, missing, "%s missed messages published after it was registered/bound", name)
		for n, c := range s {
			assert.Equal(t, 1, c, "%s got %d %d times", name, n, c)
			assert.True(t, o.ok[n])
		}
	}
	assert.Len(t, setOf(base.ns()), len(o.ok))
	t.Logf("%d publishes", len(o.ok))
}

// Promise: a publish to a durable and an in-memory queue at once is all or
// nothing: a full RejectPublish queue (either one) refuses it for both, also
// on disk (never delivered after a restart).
func TestDurablePlusMemoryAllOrNothing(t *testing.T) {
	for _, fullIsDurable := range []bool{false, true} {
		t.Run(fmt.Sprint("limited queue durable=", fullIsDurable), func(t *testing.T) {
			dir := t.TempDir()
			gate := make(chan struct{})
			lim, free := newRecorder(-1), newRecorder(-1)
			slow := func(r *recorder) tinymq.ConsumerFunc {
				c := r.consumer(t)
				return func(ctx context.Context, msg *tinymq.Msg) error {
					select {
					case <-gate:
					case <-ctx.Done():
					}
					return c(ctx, msg)
				}
			}
			m := tinymq.New(tinymq.WithDataDir(dir))
			limOpts := []tinymq.QueueOption{tinymq.WithQueueName("lim"), tinymq.WithMaxLen(20, tinymq.RejectPublish)}
			freeOpts := []tinymq.QueueOption{tinymq.WithQueueName("free")}
			if fullIsDurable {
				limOpts = append(limOpts, tinymq.WithDurable())
			} else {
				freeOpts = append(freeOpts, tinymq.WithDurable())
			}
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, slow(lim), 2, limOpts...))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, free.consumer(t), 4, freeOpts...))
			require.NoError(t, m.Start(context.Background()))
			var mu sync.Mutex
			ok, full := map[int]bool{}, map[int]bool{}
			var wg sync.WaitGroup
			for p := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 40 {
						n := p*1000 + i
						err := m.Publish("ev", n)
						mu.Lock()
						switch {
						case err == nil:
							ok[n] = true
						case errors.Is(err, tinymq.ErrQueueFull):
							full[n] = true
						default:
							t.Errorf("publish %d: %v", n, err)
						}
						mu.Unlock()
					}
				}()
			}
			waitWG(t, &wg, "publishers")
			close(gate)
			stopWithin(t, m)
			checkLedger(t, m, "lim", "free")
			ls, fs := setOf(lim.ns()), setOf(free.ns())
			assert.Len(t, ls, len(ok))
			assert.Len(t, fs, len(ok))
			for n := range full {
				assert.Zero(t, ls[n]+fs[n], "refused %d was delivered", n)
			}
			assert.NotEmpty(t, full)
			st := m.Stats().Queues
			assert.Equal(t, uint64(len(ok)), st["lim"].Accepted)
			assert.Equal(t, uint64(len(ok)), st["free"].Accepted)
			// restart: nothing comes back
			name := "free"
			if fullIsDurable {
				name = "lim"
			}
			r2 := newRecorder(-1)
			m2 := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r2.consumer(t), 1, tinymq.WithQueueName(name), tinymq.WithDurable()))
			require.NoError(t, m2.Start(context.Background()))
			stopWithin(t, m2)
			assert.Empty(t, r2.ns(), "delivered after the restart")
		})
	}
}

// Promise: Block-overflow queues with durable publishes while stopping:
// blocked publishers return ErrStopped; every nil publish is delivered once to
// every queue; no ErrStopped one is ever delivered, also after a restart.
func TestBlockOverflowDurableWhileStopping(t *testing.T) {
	for _, c := range []struct {
		name     string
		deadline time.Duration
		memBlock bool
	}{{"Stop durable block", 0, false}, {"Stop both block", 0, true}, {"Shutdown 2ms both block", 2 * time.Millisecond, true}} {
		t.Run(c.name, func(t *testing.T) {
			for iter := range 4 {
				dir := t.TempDir()
				d, mem := newRecorder(-1), newRecorder(-1)
				slow := func(r *recorder) tinymq.ConsumerFunc {
					cf := r.consumer(t)
					return func(ctx context.Context, msg *tinymq.Msg) error {
						select { // load shaping only
						case <-time.After(200 * time.Microsecond):
						case <-ctx.Done():
						}
						return cf(ctx, msg)
					}
				}
				m := tinymq.New(tinymq.WithDataDir(dir))
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, slow(d), 2, tinymq.WithQueueName("d"), tinymq.WithDurable(), tinymq.WithMaxLen(5, tinymq.Block)))
				memOpts := []tinymq.QueueOption{tinymq.WithQueueName("m")}
				if c.memBlock {
					memOpts = append(memOpts, tinymq.WithMaxLen(3, tinymq.Block))
				}
				require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, slow(mem), 1, memOpts...))
				require.NoError(t, m.Start(context.Background()))
				o := newOutcome()
				started := make(chan struct{})
				wg := publishers(t, m, "ev", 32, o, 100, started)
				select {
				case <-started:
				case <-time.After(bound):
					t.Fatal("no progress")
				}
				var serr error
				if c.deadline == 0 {
					stopWithin(t, m)
				} else {
					serr = shutdownShort(t, m, c.deadline)
				}
				waitWG(t, wg, "blocked publishers")
				require.Empty(t, o.other)
				checkLedger(t, m, "d", "m")
				st := m.Stats().Queues
				assert.Equal(t, uint64(len(o.ok)), st["d"].Accepted)
				assert.Equal(t, uint64(len(o.ok)), st["m"].Accepted)
				ds, ms := setOf(d.ns()), setOf(mem.ns())
				for n := range o.stopped {
					assert.Zero(t, ds[n]+ms[n], "ErrStopped %d delivered", n)
				}
				if c.deadline == 0 {
					assert.Len(t, ds, len(o.ok))
					assert.Len(t, ms, len(o.ok))
				}
				r2 := newRecorder(-1)
				m2 := tinymq.New(tinymq.WithDataDir(dir))
				require.NoError(t, m2.RegisterQueue("ev", tinymq.Fanout, r2.consumer(t), 2, tinymq.WithQueueName("d"), tinymq.WithDurable(), tinymq.WithMaxLen(5, tinymq.Block)))
				require.NoError(t, m2.Start(context.Background()))
				stopWithin(t, m2)
				for n := range setOf(r2.ns()) {
					if o.stopped[n] {
						t.Errorf("iter %d: ErrStopped publish %d delivered after the restart", iter, n)
					}
				}
				if c.deadline == 0 {
					assert.Empty(t, r2.ns())
				}
				for n := range o.ok {
					if ds[n] == 0 && setOf(r2.ns())[n] == 0 {
						t.Errorf("iter %d: accepted %d lost", iter, n)
					}
				}
				t.Logf("iter %d: ok %d stopped %d %v", iter, len(o.ok), len(o.stopped), serr)
				if t.Failed() {
					return
				}
			}
		})
	}
}
