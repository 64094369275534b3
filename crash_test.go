package tinymq_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/wal"
)

// crashEnv names the data directory of a child process of TestCrash.
const crashEnv = "TINYMQ_CRASH_DIR"

// TestCrashChild is the program TestCrash kills: it publishes numbered
// messages to a durable queue and consumes them, and prints what happened:
// "P n" once Publish(n) returned nil, "D n" when the consumer got n (it then
// acknowledges it), "S k" once the first k deliveries of this run are
// acknowledged and synced (a durable Publish after them returned, and the log
// is in order), and "Y file size" after each fdatasync.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		t.Skip("runs in a child process of TestCrash")
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	defer tinymq.SetWALFaults(&wal.Faults{Synced: func(name string, size int64) { say("Y %s %d", name, size) }})()
	base, _ := strconv.Atoi(os.Getenv("TINYMQ_CRASH_BASE"))
	every, _ := time.ParseDuration(os.Getenv("TINYMQ_CRASH_SYNC")) // 0 unless set: the default policy
	var delivered atomic.Int64
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(every))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, tinymq.Handler(func(_ context.Context, n int) error {
		delivered.Add(1)
		say("D %d", n)
		return nil
	}), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	if os.Getenv("TINYMQ_CRASH_DRAIN") != "" {
		require.Eventually(t, func() bool {
			st := m.Stats().Queues["q"]
			return st.Depth == 0 && st.InFlight == 0
		}, 30*time.Second, time.Millisecond)
		m.Stop()
		say("END")
		return
	}
	for i := 0; ; i++ {
		require.NoError(t, m.Publish("ev", base+i))
		say("P %d", base+i)
		if i%10 == 9 {
			want := delivered.Load()
			for m.Stats().Queues["q"].Succeeded < uint64(want) {
				time.Sleep(50 * time.Microsecond)
			}
			require.NoError(t, m.Publish("ev", -1)) // its sync covers the acknowledgements before it
			say("S %d", want)
		}
	}
}

// TestCrash kills a publishing and consuming process with SIGKILL at random
// moments, again and again, restarting it on the same directory each time,
// and checks that no confirmed message is lost and that no message whose
// acknowledgement was synced is delivered again. With power loss, each kill
// also cuts every segment back to what its last fdatasync made durable, as a
// machine that lost power would.
//
// Under WithSync(d), Publish returns before the sync: a kill of the process
// must still lose nothing (the writes are in the operating system), and a
// power loss may lose only what no fdatasync covered yet; what one covered
// (a "Y" line printed after the "P" or "S" line) must survive. That the
// background sync runs at all is checked too: some messages must have been
// covered by one, since nothing else syncs.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes for about a minute and a half")
	}
	for _, c := range []struct {
		powerLoss bool
		every     time.Duration
		cycles    int
		budget    time.Duration
	}{
		{false, 0, 150, 40 * time.Second},
		{true, 0, 150, 40 * time.Second},
		{false, 20 * time.Millisecond, 60, 15 * time.Second},
		{true, 20 * time.Millisecond, 60, 15 * time.Second},
	} {
		t.Run(fmt.Sprintf("power loss %v/sync every %v", c.powerLoss, c.every), func(t *testing.T) {
			crashCycles(t, crashMode{powerLoss: c.powerLoss, every: c.every}, c.cycles, c.budget)
		})
	}
}

// crashMode is how TestCrash kills: with or without a power loss, and the
// child's WithSync interval (0: the default, a sync before Publish returns).
type crashMode struct {
	powerLoss bool
	every     time.Duration
}

// coveredBySync reports whether a confirmation counts only once an fdatasync
// follows it: under a sync interval, with a power loss.
func (c crashMode) coveredBySync() bool { return c.powerLoss && c.every > 0 }

type crashRun struct {
	delivered []int // in order
	safe      int   // the first safe deliveries are acknowledged and synced
}

func crashCycles(t *testing.T, mode crashMode, cycles int, budget time.Duration) {
	powerLoss := mode.powerLoss
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	confirmed := map[int]bool{}
	var runs []crashRun
	synced := map[string]int64{} // segment -> durable size
	start := time.Now()
	n := 0
	for ; n < cycles && time.Since(start) < budget; n++ {
		if powerLoss {
			segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
			for _, s := range segs { // what earlier runs left is durable
				if st, err := os.Stat(s); err == nil {
					synced[s] = st.Size()
				}
			}
		}
		out := runCrashChild(t, dir, mode, n*1_000_000, time.Duration(5+rng.IntN(150))*time.Millisecond, false)
		runs = append(runs, parseCrashRun(out, mode, confirmed, synced))
		if powerLoss {
			cutToSynced(t, dir, synced)
		}
		clear(synced)
	}
	out := runCrashChild(t, dir, mode, 0, 0, true)
	require.Contains(t, out, "END", "the draining run finished")
	runs = append(runs, parseCrashRun(out, mode, confirmed, nil))
	t.Logf("%d kills, %d confirmed messages", n, len(confirmed))
	require.NotEmpty(t, confirmed, "no confirmation counted: under a sync interval, the background sync never ran")

	seen := map[int]bool{}
	for _, r := range runs {
		for _, d := range r.delivered {
			seen[d] = true
		}
	}
	for c := range confirmed {
		if !seen[c] {
			t.Errorf("confirmed message %d was never delivered", c)
		}
	}
	for i, r := range runs {
		for _, d := range r.delivered[:r.safe] {
			if d < 0 {
				continue
			}
			for _, later := range runs[i+1:] {
				for _, again := range later.delivered {
					if again == d {
						t.Errorf("message %d, acknowledged and synced in run %d, was delivered again", d, i)
					}
				}
			}
		}
	}
}

// runCrashChild runs TestCrashChild on dir and kills it after life, or, with
// drain, lets it finish (bounded by a minute). It returns what it printed.
func runCrashChild(t *testing.T, dir string, mode crashMode, base int, life time.Duration, drain bool) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir, "TINYMQ_CRASH_BASE="+strconv.Itoa(base),
		"TINYMQ_CRASH_SYNC="+mode.every.String())
	if drain {
		cmd.Env = append(cmd.Env, "TINYMQ_CRASH_DRAIN=1")
		life = time.Minute
	}
	var buf strings.Builder
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if !drain {
			t.Fatalf("the child exited by itself (%v):\n%s", err, buf.String())
		}
	case <-time.After(life):
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-exited
		if drain {
			t.Fatalf("the draining child did not finish:\n%s", buf.String())
		}
	}
	return buf.String()
}

// parseCrashRun reads a child's output. A "P" (confirmed) or "S" (safe)
// line counts at once, or, when mode.coveredBySync, once a "Y" line (an
// fdatasync) follows it.
func parseCrashRun(out string, mode crashMode, confirmed map[int]bool, synced map[string]int64) crashRun {
	var r crashRun
	var pending []int // confirmations waiting for a sync
	pendingSafe := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "P":
			if mode.coveredBySync() && synced != nil {
				pending = append(pending, n)
			} else {
				confirmed[n] = true
			}
		case "D":
			r.delivered = append(r.delivered, n)
		case "S":
			if mode.coveredBySync() && synced != nil {
				pendingSafe = max(pendingSafe, n)
			} else {
				r.safe = max(r.safe, n)
			}
		case "Y":
			for _, p := range pending {
				confirmed[p] = true
			}
			pending = pending[:0]
			r.safe = max(r.safe, pendingSafe)
			if synced != nil && len(f) == 3 {
				size, _ := strconv.ParseInt(f[2], 10, 64)
				synced[f[1]] = size
			}
		}
	}
	r.safe = min(r.safe, len(r.delivered))
	return r
}

// cutToSynced truncates every segment to what was durable when the child was
// killed; a segment never synced loses everything.
func cutToSynced(t *testing.T, dir string, synced map[string]int64) {
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	require.NoError(t, err)
	for _, s := range segs {
		st, err := os.Stat(s)
		require.NoError(t, err)
		if size := synced[s]; st.Size() > size {
			require.NoError(t, os.Truncate(s, size))
		}
	}
}
