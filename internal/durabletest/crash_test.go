package durabletest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

const (
	childEnv = "LAZYREVIEW_CHILD"
	dirEnv   = "LAZYREVIEW_DIR"
	baseEnv  = "LAZYREVIEW_BASE"
	concEnv  = "LAZYREVIEW_CONC"
)

// TestKilledChild is what the kill tests run and kill.
func TestKilledChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("child process only")
	}
	dir := os.Getenv(dirEnv)
	base, _ := strconv.Atoi(os.Getenv(baseEnv))
	conc, _ := strconv.Atoi(os.Getenv(concEnv))
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	switch mode {
	case "backlog":
		var delivered atomic.Int64
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, n int) error {
			delivered.Add(1)
			say("D %d", n)
			return nil
		}), conc, tinymq.WithQueueName("q"), tinymq.WithDurable()))
		// A burst before Start, so that the next run has a backlog to restore.
		for i := 0; i < 300; i++ {
			require.NoError(t, m.Publish("ev", base+i))
			say("P %d", base+i)
		}
		require.NoError(t, m.Start(context.Background()))
		if os.Getenv("LAZYREVIEW_DRAIN") != "" {
			m.Stop()
			say("END")
			return
		}
		for i := 300; ; i++ {
			require.NoError(t, m.Publish("ev", base+i))
			say("P %d", base+i)
			if i%10 == 9 && conc == 1 {
				want := delivered.Load()
				for m.Stats().Queues["q"].Succeeded < uint64(want) {
					time.Sleep(50 * time.Microsecond)
				}
				require.NoError(t, m.Publish("ev", -1)) // its sync covers the acknowledgements before it
				say("S %d", want)
			}
		}
	case "dlmove":
		m := tinymq.New(tinymq.WithDataDir(dir))
		require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("dst"), tinymq.WithDurable()))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return tinymq.Permanent(errors.New("to the dead"))
		}, conc, tinymq.WithQueueName("src"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx", "")))
		require.NoError(t, m.Start(context.Background()))
		say("STARTED")
		select {} // killed
	}
}

func runChild(t *testing.T, env []string, life time.Duration, drain bool) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	var buf strings.Builder
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if drain {
		life = time.Minute
	}
	select {
	case err := <-exited:
		if !drain {
			t.Fatalf("the child exited by itself (%v):\n%s", err, buf.String())
		}
	case <-time.After(life):
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-exited
		if drain {
			t.Fatalf("the draining child hung:\n%s", buf.String())
		}
	}
	return buf.String()
}

type run struct {
	delivered []int
	safe      int
}

// Promise: kill -9 while a restored backlog drains (and new publishes race it)
// loses no confirmed message and delivers none that was acknowledged and
// synced again; at concurrency 1 each run delivers restored first, then new,
// in publish order.
func TestKillWhileDrainingRestored(t *testing.T) {
	for _, conc := range []int{1, 8} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			dir := t.TempDir()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
			confirmed := map[int]bool{}
			var runs []run
			parse := func(out string) run {
				var r run
				sc := bufio.NewScanner(strings.NewReader(out))
				for sc.Scan() {
					f := strings.Fields(sc.Text())
					if len(f) < 2 {
						continue
					}
					n, _ := strconv.Atoi(f[1])
					switch f[0] {
					case "P":
						confirmed[n] = true
					case "D":
						r.delivered = append(r.delivered, n)
					case "S":
						r.safe = max(r.safe, n)
					}
				}
				r.safe = min(r.safe, len(r.delivered))
				return r
			}
			env := func(base int) []string {
				return []string{childEnv + "=backlog", dirEnv + "=" + dir, baseEnv + "=" + strconv.Itoa(base), concEnv + "=" + strconv.Itoa(conc)}
			}
			const cycles = 25
			for n := 0; n < cycles; n++ {
				out := runChild(t, env((n+1)*1_000_000), time.Duration(10+rng.IntN(120))*time.Millisecond, false)
				runs = append(runs, parse(out))
			}
			out := runChild(t, append(env(1_000_000_000), "LAZYREVIEW_DRAIN=1"), 0, true)
			require.Contains(t, out, "END")
			runs = append(runs, parse(out))
			seen := map[int]int{}
			for _, r := range runs {
				for _, d := range r.delivered {
					seen[d]++
				}
			}
			lost := 0
			for c := range confirmed {
				if seen[c] == 0 {
					lost++
					if lost < 10 {
						t.Errorf("confirmed message %d never delivered", c)
					}
				}
			}
			assert.Zero(t, lost, "confirmed messages lost (of %d)", len(confirmed))
			for i, r := range runs {
				for _, d := range r.delivered[:r.safe] {
					if d < 0 {
						continue
					}
					for j, later := range runs[i+1:] {
						for _, again := range later.delivered {
							if again == d {
								t.Errorf("message %d, acknowledged and synced in run %d, delivered again in run %d", d, i, i+1+j)
							}
						}
					}
				}
				if conc == 1 {
					prev := -1
					for k, d := range r.delivered {
						if d < 0 {
							continue
						}
						if d <= prev {
							t.Errorf("run %d: delivery %d is %d after %d: not in publish order", i, k, d, prev)
							break
						}
						prev = d
					}
				}
			}
			t.Logf("%d runs, %d confirmed", len(runs), len(confirmed))
		})
	}
}

// Promise: dead-lettering a restored message into another durable queue is
// one log record: after kill -9 it is in exactly one of the two queues. Both
// ways to die: rejected by the consumer, and expired at the head.
func TestKillWhileDeadLetteringRestored(t *testing.T) {
	for _, c := range []struct {
		name string
		ttl  bool
		conc int
	}{{"rejected c1", false, 1}, {"rejected c8", false, 8}, {"expired c1", true, 1}, {"expired c8", true, 8}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			const n = 3000
			// setup: n messages left in src's log
			m := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("dst"), tinymq.WithDurable()))
			require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, blocker, 1, tinymq.WithQueueName("src"), tinymq.WithDurable(), tinymq.WithDeadLetter("dlx", "")))
			require.NoError(t, m.Start(context.Background()))
			start := time.Now()
			var opts []tinymq.PublishOption
			if c.ttl {
				opts = append(opts, tinymq.WithExpiration(time.Hour))
			}
			var wg sync.WaitGroup
			for p := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := p; i < n; i += 10 {
						o := opts
						if c.ttl {
							o = []tinymq.PublishOption{tinymq.WithExpiration(time.Since(start) + 300*time.Millisecond)}
						}
						assert.NoError(t, m.Publish("ev", i, o...))
					}
				}()
			}
			wg.Wait()
			require.ErrorIs(t, shutdownShort(t, m, 30*time.Millisecond), tinymq.ErrUndelivered)
			if c.ttl {
				<-time.After(time.Until(start.Add(400 * time.Millisecond)))
			}
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
			for range 6 {
				runChild(t, []string{childEnv + "=dlmove", dirEnv + "=" + dir, concEnv + "=" + strconv.Itoa(c.conc)},
					time.Duration(5+rng.IntN(40))*time.Millisecond, false)
			}
			// inspect: dst delivers what it holds; src stays unregistered
			dst := newRecorder(-1)
			m2 := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m2.RegisterQueue("dlx", tinymq.Fanout, dst.consumer(t), 1, tinymq.WithQueueName("dst"), tinymq.WithDurable()))
			require.NoError(t, m2.Start(context.Background()))
			stopWithin(t, m2)
			st := m2.Stats().Queues["src"]
			assert.True(t, st.Unregistered)
			got := dst.ns()
			seen := map[int]int{}
			for _, x := range got {
				seen[x]++
			}
			for x, k := range seen {
				if k > 1 {
					t.Errorf("message %d is %d times in dst", x, k)
				}
			}
			t.Logf("src holds %d, dst delivered %d", st.Depth, len(got))
			assert.Equal(t, n, st.Depth+len(seen), "src depth + distinct dst: each message in exactly one queue")
			// and src really holds the rest: register it, drain
			srcR := newRecorder(-1)
			m3 := tinymq.New(tinymq.WithDataDir(dir))
			require.NoError(t, m3.RegisterQueue("ev", tinymq.Fanout, srcR.consumer(t), 1, tinymq.WithQueueName("src"), tinymq.WithDurable()))
			require.NoError(t, m3.Start(context.Background()))
			stopWithin(t, m3)
			for _, x := range srcR.ns() {
				if seen[x] > 0 && !c.ttl {
					t.Errorf("message %d in both src and dst", x)
				}
				seen[x]++
			}
			if !c.ttl {
				assert.Len(t, seen, n)
			} else {
				assert.Equal(t, uint64(st.Depth), m3.Stats().Queues["src"].Expired+m3.Stats().Queues["src"].Succeeded)
			}
		})
	}
}
