package durabletest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// The run-time topology of durable queues under kill -9: a delete, a purge,
// a declare and an expiry are log records, so that a process killed at any
// moment restarts with the queues as they were left (the power-loss side is
// TestDurableTopologySurvivesPowerLoss, in the root package, where the
// log's fault hooks are).

// topoScenarioEnv names the scenario of a TestKilledTopologyChild (childEnv
// is "topology", dirEnv its data directory, topoSyncEnv its WithSync).
const (
	topoScenarioEnv = "TOPOLOGY_SCENARIO"
	topoSyncEnv     = "TOPOLOGY_SYNC"
)

// TestKilledTopologyChild is what TestKilledTopologyKeepsItsRecords runs and
// kills: it runs the scenario on the data directory, printing "P n" once
// Publish(n) returned and the markers of topoKillCases once their operation
// returned, then publishes to a queue of its own until it is killed.
//
//   - delete: queues "del" (retries an hour apart) and "keep" share N
//     messages; "del" has two in its consumer ("F n") and one waiting for a
//     retry when it is deleted ("PRE-DELETE", "DELETED"); then it is declared
//     again and gets more ("R n").
//   - purge: "p" has N messages and 3 delayed an hour, one in its consumer
//     ("F n") and one waiting for a retry when it is paused and purged
//     ("PRE-PURGE", "PURGED"); then more are published ("Q n").
//   - declared: "d" is declared with no consumer, and published to.
//   - expiry: "x" (WithQueueExpiry) gets N messages while a consumer holds
//     it paused; the consumer is cancelled ("CANCELLED") and the queue
//     expires ("EXPIRED", logged once its record is written).
func TestKilledTopologyChild(t *testing.T) {
	if os.Getenv(childEnv) != "topology" {
		t.Skip("child process only")
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	const n = 30
	every, _ := time.ParseDuration(os.Getenv(topoSyncEnv))
	logs := tinymq.WithLogger(slog.New(topoMsgHandler(func(msg string) {
		if strings.HasPrefix(msg, "tinymq: queue expired") {
			say("EXPIRED")
		}
	})))
	m := tinymq.New(tinymq.WithDataDir(os.Getenv(dirEnv)), tinymq.WithSync(every), logs)
	ctx := context.Background()
	retry := tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})
	held := func(ctx context.Context, msg *tinymq.Msg) error {
		v := decodeInt(t, msg.Data)
		if v == 0 && msg.Attempt == 1 {
			return errors.New("retried in an hour")
		}
		say("F %d", v)
		<-ctx.Done()
		return ctx.Err()
	}
	require.NoError(t, m.DeclareQueue("bg", "bgx", tinymq.Fanout, tinymq.WithDurable()))
	_, err := m.Consume("bg", func(context.Context, *tinymq.Msg) error { return nil }, 2)
	require.NoError(t, err)
	require.NoError(t, m.Start(ctx))
	publish := func(ex, kind string, from, to int, opts ...tinymq.PublishOption) {
		for i := from; i < to; i++ {
			require.NoError(t, m.Publish(ex, i, opts...))
			say("%s %d", kind, i)
		}
	}
	switch scenario := os.Getenv(topoScenarioEnv); scenario {
	case "delete":
		require.NoError(t, m.DeclareQueue("del", "ev", tinymq.Fanout, tinymq.WithDurable(), retry))
		require.NoError(t, m.DeclareQueue("keep", "ev", tinymq.Fanout, tinymq.WithDurable()))
		publish("ev", "P", 0, n)
		_, err := m.Consume("del", held, 2)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			st := m.Stats().Queues["del"]
			return st.InFlight == 2 && st.Scheduled == 1
		}, bound, time.Millisecond)
		say("PRE-DELETE")
		removed, err := m.DeleteQueue("del")
		require.NoError(t, err)
		say("DELETED %d", removed)
		require.NoError(t, m.DeclareQueue("del", "ev", tinymq.Fanout, tinymq.WithDurable(), retry))
		publish("ev", "R", 1000, 1000+10)
	case "purge":
		require.NoError(t, m.DeclareQueue("p", "pe", tinymq.Fanout, tinymq.WithDurable(), retry))
		publish("pe", "P", 0, n)
		publish("pe", "P", 500, 503, tinymq.WithDelay(time.Hour))
		_, err := m.Consume("p", held, 1)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			st := m.Stats().Queues["p"]
			return st.InFlight == 1 && st.Scheduled == 4
		}, bound, time.Millisecond)
		require.NoError(t, m.PauseQueue("p"))
		say("PRE-PURGE")
		purged, err := m.PurgeQueue("p")
		require.NoError(t, err)
		say("PURGED %d", purged)
		publish("pe", "Q", 1000, 1000+10)
	case "declared":
		require.NoError(t, m.DeclareQueue("d", "de", tinymq.Fanout, tinymq.WithDurable()))
		say("STARTED")
		publish("de", "P", 0, 1_000_000)
	case "expiry":
		require.NoError(t, m.DeclareQueue("x", "xe", tinymq.Fanout, tinymq.WithDurable(), tinymq.WithQueueExpiry(100*time.Millisecond)))
		sub, err := m.Consume("x", held, 1)
		require.NoError(t, err)
		require.NoError(t, m.PauseQueue("x"))
		publish("xe", "P", 0, n)
		require.NoError(t, sub.Cancel(ctx))
		say("CANCELLED")
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
	for i := 0; ; i++ { // killed
		require.NoError(t, m.Publish("bgx", i))
	}
}

// topoMsgHandler is a slog.Handler that calls itself with each line's message.
type topoMsgHandler func(msg string)

func (h topoMsgHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h topoMsgHandler) Handle(_ context.Context, r slog.Record) error {
	h(r.Message)
	return nil
}
func (h topoMsgHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h topoMsgHandler) WithGroup(string) slog.Handler      { return h }

// topoKillCase is a scenario of TestKilledTopologyChild and when to kill it:
// at a random moment up to within after it printed marker, times times, with
// WithSync(every).
type topoKillCase struct {
	scenario, marker string
	within           time.Duration
	times            int
	every            time.Duration
}

func (c topoKillCase) String() string {
	s := c.scenario + " after " + c.marker
	if c.every > 0 {
		s += fmt.Sprintf(" syncing every %v", c.every)
	}
	return s
}

var topoKillCases = []topoKillCase{
	{"delete", "P", 15 * time.Millisecond, 3, 0},     // any time: publishing, consuming, deleting
	{"delete", "PRE-DELETE", time.Millisecond, 4, 0}, // during the delete, or just before or after it
	{"delete", "DELETED", 30 * time.Millisecond, 1, 0},
	{"delete", "PRE-DELETE", time.Millisecond, 2, 20 * time.Millisecond},
	{"purge", "P", 15 * time.Millisecond, 3, 0},
	{"purge", "PRE-PURGE", time.Millisecond, 4, 0},
	{"purge", "PURGED", 30 * time.Millisecond, 1, 0},
	{"declared", "STARTED", 150 * time.Millisecond, 2, 0},
	{"declared", "STARTED", 50 * time.Millisecond, 1, 20 * time.Millisecond},
	{"expiry", "CANCELLED", 300 * time.Millisecond, 2, 0}, // before, during or after the expiry
	{"expiry", "EXPIRED", 30 * time.Millisecond, 1, 0},
}

// topoKilled is what a killed child printed: "P", "R", "Q" and "F" lines'
// numbers, and the markers.
type topoKilled struct {
	ints    map[string][]int
	markers map[string]bool
}

// runTopologyChild runs TestKilledTopologyChild on dir and kills it with
// SIGKILL at a random moment within c.within after it printed c.marker.
func runTopologyChild(t *testing.T, dir string, c topoKillCase, rng *rand.Rand) topoKilled {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledTopologyChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=topology", dirEnv+"="+dir, topoScenarioEnv+"="+c.scenario, topoSyncEnv+"="+c.every.String())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	var all []string
	var kill <-chan time.Time // armed by the marker
	limit := time.After(time.Minute)
	for lines != nil {
		select {
		case l, ok := <-lines:
			if !ok {
				err := cmd.Wait()
				t.Fatalf("the child ended by itself (%v):\n%s\n%s", err, strings.Join(all, "\n"), stderr.String())
			}
			all = append(all, l)
			if kill == nil && strings.HasPrefix(l, c.marker) {
				kill = time.After(time.Duration(rng.Int64N(int64(c.within))))
			}
		case <-kill:
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			for l := range lines {
				all = append(all, l)
			}
			lines = nil
		case <-limit:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			t.Fatalf("no %q within a minute:\n%s\n%s", c.marker, strings.Join(all, "\n"), stderr.String())
		}
	}
	_ = cmd.Wait() // killed
	r := topoKilled{ints: make(map[string][]int), markers: make(map[string]bool)}
	for _, l := range all {
		f := strings.Fields(l)
		if len(f) == 2 && len(f[0]) == 1 {
			if n, err := strconv.Atoi(f[1]); err == nil {
				r.ints[f[0]] = append(r.ints[f[0]], n)
				continue
			}
		}
		if len(f) > 0 {
			r.markers[f[0]] = true
		}
	}
	return r
}

// topoDrained is what drainTopology found in each queue: what it delivered,
// and how many messages wait for a retry or a delay due later.
type topoDrained struct {
	got       map[string][]int
	scheduled map[string]int
}

// drainTopology opens dir, declares the durable queues on their fanout
// exchanges (queue -> exchange), consumes them until every message that is
// not due later has been delivered, and stops, leaving those in the log.
func drainTopology(t *testing.T, dir string, queues map[string]string) topoDrained {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir))
	recs := make(map[string]*recorder)
	for q, ex := range queues {
		require.NoError(t, m.DeclareQueue(q, ex, tinymq.Fanout, tinymq.WithDurable()))
		recs[q] = newRecorder(-1)
		_, err := m.Consume(q, recs[q].consumer(t), 1)
		require.NoError(t, err)
	}
	require.NoError(t, m.Start(context.Background()))
	out := topoDrained{got: make(map[string][]int), scheduled: make(map[string]int)}
	require.Eventually(t, func() bool {
		st := m.Stats()
		for q := range queues {
			s := st.Queues[q]
			if s.Ready != 0 || s.InFlight != 0 || s.Succeeded+uint64(s.Scheduled) != s.Accepted {
				return false
			}
			out.scheduled[q] = s.Scheduled
		}
		return true
	}, bound, time.Millisecond)
	_ = shutdownShort(t, m, 50*time.Millisecond) // what is due later stays in the log
	for q, r := range recs {
		out.got[q] = r.ns()
	}
	return out
}

// Promise: under kill -9 at any moment, a deleted durable queue stays
// deleted: declared again after the restart it gets none of its old
// messages (those in a consumer at the delete and the one waiting for a
// retry included), but those of its declaration after the delete; a message
// it shared with another durable queue comes back only in that one. A purged
// message never comes back (one in a consumer at the purge does, and what was
// published after it stays). A durable queue declared with no consumer keeps
// every confirmed message, and gets them when declared again and consumed. An
// expired durable queue stays deleted. Killed while such a record was being
// written, the queue is deleted (purged, expired) or not, never half.
func TestKilledTopologyKeepsItsRecords(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	const n = 30
	for _, c := range topoKillCases {
		t.Run(c.String(), func(t *testing.T) {
			for range c.times {
				dir := t.TempDir()
				r := runTopologyChild(t, dir, c, rng)
				t.Logf("killed after %v; confirmed %d, in consumers %v", slices.Sorted(maps.Keys(r.markers)), len(r.ints["P"]), r.ints["F"])
				allOrNothing := func(what string, begun bool, count, all, confirmed int) {
					t.Helper()
					if !begun { // killed before the operation: nothing confirmed is lost
						assert.GreaterOrEqual(t, count, confirmed, "%s: confirmed messages lost", what)
						return
					}
					assert.True(t, count == 0 || count == all, "%s: %d of %d came back: a record half taken", what, count, all)
				}
				old := func(got []int, isOld func(int) bool) (k int) {
					for _, v := range got {
						if isOld(v) && !slices.Contains(r.ints["F"], v) {
							k++
						}
					}
					return k
				}
				switch c.scenario {
				case "delete":
					d := drainTopology(t, dir, map[string]string{"del": "ev", "keep": "ev"})
					assert.Subset(t, d.got["keep"], r.ints["P"], "every confirmed message is in the queue not deleted")
					assert.Subset(t, d.got["keep"], r.ints["R"])
					left := old(d.got["del"], func(v int) bool { return v < n }) + d.scheduled["del"] // waiting at the delete
					held := 0                                                                         // in its consumer then
					for _, f := range r.ints["F"] {
						if slices.Contains(d.got["del"], f) {
							held++
						}
					}
					if r.markers["DELETED"] {
						assert.Zero(t, left, "the deleted queue's waiting messages came back: %v (%d scheduled)", d.got["del"], d.scheduled["del"])
						assert.Zero(t, held, "a message in the consumer at the delete came back: %v", d.got["del"])
						assert.Subset(t, d.got["del"], r.ints["R"], "the messages of its declaration after the delete are there")
					} else {
						allOrNothing("the deleted queue's messages", r.markers["PRE-DELETE"], left+held, n, len(r.ints["P"]))
					}
				case "purge":
					d := drainTopology(t, dir, map[string]string{"p": "pe"})
					assert.Subset(t, d.got["p"], r.ints["F"], "the message in the consumer at the purge comes back")
					assert.Subset(t, d.got["p"], r.ints["Q"], "what was published after the purge is there")
					waiting := old(d.got["p"], func(v int) bool { return v < n || v >= 500 && v < 503 }) + d.scheduled["p"]
					if r.markers["PURGED"] {
						assert.Zero(t, waiting, "purged messages came back: %v (%d scheduled)", d.got["p"], d.scheduled["p"])
					} else {
						allOrNothing("the purged messages", r.markers["PRE-PURGE"], waiting, n+3-len(r.ints["F"]), len(r.ints["P"])-len(r.ints["F"]))
					}
				case "declared":
					m := tinymq.New(tinymq.WithDataDir(dir))
					require.NoError(t, m.Start(context.Background()))
					st := m.Stats().Queues["d"]
					stopWithin(t, m)
					if len(r.ints["P"]) > 0 {
						assert.True(t, st.Unregistered, "listed before it is declared again")
						assert.GreaterOrEqual(t, st.Depth, len(r.ints["P"]))
					}
					d := drainTopology(t, dir, map[string]string{"d": "de"})
					assert.Subset(t, d.got["d"], r.ints["P"], "every confirmed message survives")
					assert.True(t, slices.IsSorted(d.got["d"]), "in publish order")
				case "expiry":
					m := tinymq.New(tinymq.WithDataDir(dir))
					require.NoError(t, m.Start(context.Background()))
					_, listed := m.Stats().Queues["x"]
					stopWithin(t, m)
					d := drainTopology(t, dir, map[string]string{"x": "xe"})
					if r.markers["EXPIRED"] {
						assert.False(t, listed, "an expired queue is not listed")
						assert.Empty(t, d.got["x"], "an expired queue's messages came back")
					} else {
						allOrNothing("the expired queue's messages", r.markers["CANCELLED"], len(d.got["x"]), n, len(r.ints["P"]))
					}
				}
			}
		})
	}
}
