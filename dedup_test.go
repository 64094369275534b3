package tinymq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// dedupMQ is an MQ with a fanout exchange "ev" deduplicating over window and
// one in-memory queue "q" whose consumer sends what it gets to the channel.
func dedupMQ(t *testing.T, window time.Duration) (*tinymq.MQ, <-chan *tinymq.Msg) {
	t.Helper()
	m := tinymq.New()
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(window)))
	got := make(chan *tinymq.Msg, 100)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q")))
	return m, got
}

// A publish whose ID the exchange accepted within the window returns nil,
// routes nothing and counts as a duplicate; once the window has passed, the
// ID is routed again.
func TestDeduplicationRoutesAnIDOnceWithinTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, got := dedupMQ(t, time.Minute)
		require.NoError(t, m.Start(context.Background()))
		defer m.Stop()
		require.NoError(t, m.Publish("ev", "first", tinymq.WithDeduplicationID("order-1")))
		time.Sleep(time.Minute - time.Nanosecond)
		require.NoError(t, m.Publish("ev", "retry", tinymq.WithDeduplicationID("order-1")), "a duplicate must see success")
		require.NoError(t, m.Publish("ev", "other", tinymq.WithDeduplicationID("order-2")))
		synctest.Wait()
		st := m.Stats()
		assert.Equal(t, uint64(1), st.Exchanges["ev"].Duplicates)
		assert.Equal(t, uint64(2), st.Exchanges["ev"].Published)
		assert.Equal(t, uint64(2), st.Queues["q"].Accepted)

		time.Sleep(time.Nanosecond) // the window of order-1 has passed
		require.NoError(t, m.Publish("ev", "again", tinymq.WithDeduplicationID("order-1")))
		require.NoError(t, m.Publish("ev", "plain")) // no ID: never deduplicated
		require.NoError(t, m.Publish("ev", "plain"))
		synctest.Wait()
		var data []any
		for len(got) > 0 {
			data = append(data, (<-got).Data)
		}
		assert.Equal(t, []any{"first", "other", "again", "plain", "plain"}, data)
		assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
	})
}

// Concurrent publishes of one ID route it once, and every one of them
// returns nil.
func TestDeduplicationConcurrentPublishesRouteOnce(t *testing.T) {
	const pubs = 16
	for round := range 20 {
		m, got := dedupMQ(t, time.Hour)
		id := fmt.Sprint("id-", round)
		var wg sync.WaitGroup
		errs := make([]error, pubs)
		start := make(chan struct{})
		for i := range pubs {
			wg.Go(func() {
				<-start
				errs[i] = m.Publish("ev", i, tinymq.WithDeduplicationID(id))
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "publish %d", i)
		}
		st := m.Stats()
		assert.Equal(t, uint64(1), st.Queues["q"].Accepted, "round %d: routed once", round)
		assert.Equal(t, uint64(pubs-1), st.Exchanges["ev"].Duplicates)
		assert.Len(t, got, 0, "not started: nothing delivered")
		m.Stop()
	}
}

// A publish of an ID that another publish is routing waits for it; when that
// one fails, the waiting one is routed in its turn (here the first waits
// for room in a full queue until its context ends).
func TestDeduplicationRetriesWhenTheFirstPublishFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New()
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		release := make(chan struct{})
		var got []any
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			<-release
			got = append(got, msg.Data)
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithMaxLen(1, tinymq.Block)))
		require.NoError(t, m.Publish("ev", "filler"))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		first := make(chan error, 1)
		go func() { first <- m.PublishContext(ctx, "ev", "first", tinymq.WithDeduplicationID("a")) }()
		synctest.Wait() // the first waits for room
		second := make(chan error, 1)
		go func() { second <- m.Publish("ev", "second", tinymq.WithDeduplicationID("a")) }()
		synctest.Wait()
		select {
		case err := <-second:
			t.Fatalf("the second publish returned %v while the first was under way", err)
		default:
		}
		time.Sleep(time.Second) // the first's context ends
		require.ErrorIs(t, <-first, tinymq.ErrQueueFull)
		synctest.Wait() // the second now waits for room itself
		require.NoError(t, m.Start(context.Background()))
		close(release)
		require.NoError(t, <-second)
		require.NoError(t, m.Publish("ev", "third", tinymq.WithDeduplicationID("a")))
		m.Stop()
		assert.Equal(t, []any{"filler", "second"}, got)
		assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
	})
}

// A publish that failed leaves no ID behind: the retry is routed.
func TestDeduplicationForgetsAFailedPublish(t *testing.T) {
	m := tinymq.New()
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.ErrorIs(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("a")), tinymq.ErrNoRoute)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("a")))
	st := m.Stats()
	assert.Equal(t, uint64(1), st.Queues["q"].Accepted)
	assert.Zero(t, st.Exchanges["ev"].Duplicates)
	m.Stop()
}

// The options are checked: a window must be positive, an ID 1 to 255 bytes,
// and an ID needs an exchange that deduplicates.
func TestDeduplicationOptionsAreValidated(t *testing.T) {
	m := tinymq.New()
	defer m.Stop()
	for _, w := range []time.Duration{0, -time.Nanosecond, -time.Second, math.MinInt64} {
		assert.ErrorIs(t, m.DeclareExchange("bad", tinymq.Fanout, tinymq.WithDeduplication(w)), tinymq.ErrInvalidOption, "window %v", w)
	}
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Minute)))
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Minute)), "the same again")
	assert.ErrorIs(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)), tinymq.ErrExchangeMismatch)
	assert.ErrorIs(t, m.DeclareExchange("ev", tinymq.Fanout), tinymq.ErrExchangeMismatch)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1))
	require.NoError(t, m.RegisterQueue("plain", tinymq.Fanout, failing, 1))
	for _, id := range []string{"", strings.Repeat("x", 256)} {
		assert.ErrorIs(t, m.Publish("ev", 1, tinymq.WithDeduplicationID(id)), tinymq.ErrInvalidOption, "ID of %d bytes", len(id))
	}
	require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID(strings.Repeat("x", 255))))
	assert.ErrorIs(t, m.Publish("plain", 1, tinymq.WithDeduplicationID("a")), tinymq.ErrInvalidOption, "no WithDeduplication")
	assert.ErrorIs(t, m.Publish("none", 1, tinymq.WithDeduplicationID("a")), tinymq.ErrUnknownExchange)
	assert.Zero(t, m.Stats().Queues["plain#2"].Accepted)
}

// An exchange remembers at most 65536 IDs: past that the oldest is
// forgotten before its window ends, and a retry of it is routed again.
func TestDeduplicationMemoryIsBounded(t *testing.T) {
	const bound = 1 << 16
	m := tinymq.New()
	defer m.Stop()
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("q")))
	for i := range bound + 1 {
		require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID(strconv.Itoa(i))))
	}
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("1")), "still remembered")
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("0")), "forgotten past the bound")
	st := m.Stats()
	assert.Equal(t, uint64(1), st.Exchanges["ev"].Duplicates)
	assert.Equal(t, uint64(bound+2), st.Queues["q"].Accepted)
}

// A duplicate returns nil even while the MQ stops: the message was
// accepted, and a producer told otherwise would publish it elsewhere.
func TestDeduplicationDuplicateAfterStopSucceeds(t *testing.T) {
	m, _ := dedupMQ(t, time.Hour)
	require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("a")))
	m.Stop()
	require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("a")))
	assert.ErrorIs(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("b")), tinymq.ErrStopped)
}

// durableDedup declares "ev" deduplicating over window, with a durable
// queue "dq" and an in-memory queue "mq" of its own exchange "mem", also
// deduplicating, on an MQ with dir; their consumers record what they get.
func durableDedup(t *testing.T, dir string, window time.Duration, got *recorder) *tinymq.MQ {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(window)))
	require.NoError(t, m.DeclareExchange("mem", tinymq.Fanout, tinymq.WithDeduplication(window)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, got.consume, 1, tinymq.WithQueueName("dq"), tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("mem", tinymq.Fanout, got.consume, 1, tinymq.WithQueueName("mq")))
	return m
}

// recorder counts the messages each queue got, by their data.
type recorder struct {
	mu  sync.Mutex
	got map[string]map[string]int
}

func (r *recorder) consume(_ context.Context, msg *tinymq.Msg) error {
	var s string
	if e, ok := msg.Data.(tinymq.Encoded); ok {
		if err := e.Decode(&s); err != nil {
			return err
		}
	} else {
		s = fmt.Sprint(msg.Data)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = make(map[string]map[string]int)
	}
	if r.got[msg.Queue] == nil {
		r.got[msg.Queue] = make(map[string]int)
	}
	r.got[msg.Queue][s]++
	return nil
}

func (r *recorder) count(queue, data string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[queue][data]
}

// The window survives a restart for a message that reached a durable
// queue: its ID was written with it. The ID of a message of in-memory queues
// is not kept: that message is gone after the restart, and a retry
// publishes it again.
func TestDeduplicationWindowSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	var before recorder
	m := durableDedup(t, dir, time.Hour, &before)
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
	require.NoError(t, m.Publish("mem", "m1", tinymq.WithDeduplicationID("b")))
	stopWithin(t, m) // never started: both wait

	var after recorder
	m = durableDedup(t, dir, time.Hour, &after)
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")), "the producer's retry")
	require.NoError(t, m.Publish("mem", "m1", tinymq.WithDeduplicationID("b")))
	st := m.Stats()
	assert.Equal(t, uint64(1), st.Exchanges["ev"].Duplicates, "the durable message's ID survived")
	assert.Zero(t, st.Exchanges["mem"].Duplicates, "the in-memory message's did not")
	require.NoError(t, m.Start(context.Background()))
	waitDrained(t, m, "dq")
	waitDrained(t, m, "mq")
	stopWithin(t, m)
	assert.Equal(t, 1, after.count("dq", "d1"), "restored once, not routed again")
	assert.Equal(t, 1, after.count("mq", "m1"), "the lost in-memory message published again")

	// Acknowledged since, the message is gone from the log; its ID stays
	// for the window.
	m = durableDedup(t, dir, time.Hour, &after)
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "acknowledged, and still within the window")
	stopWithin(t, m)
}

// An ID recorded in the log goes once its window has passed: the next
// recovery routes its retry again and deletes the record.
func TestDeduplicationRecordsExpireInTheLog(t *testing.T) {
	dir := t.TempDir()
	var got recorder
	m := durableDedup(t, dir, time.Nanosecond, &got)
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
	stopWithin(t, m)
	assert.Equal(t, 1, topoLogKeys(t, dir)["i/"])

	m = durableDedup(t, dir, time.Nanosecond, &got)
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")), "the window has passed")
	assert.Zero(t, m.Stats().Exchanges["ev"].Duplicates)
	require.NoError(t, m.Start(context.Background()))
	waitDrained(t, m, "dq")
	stopWithin(t, m)
	assert.Equal(t, 2, got.count("dq", "d1"))
	keys := topoLogKeys(t, dir)
	assert.LessOrEqual(t, keys["i/"], 1, "the expired record was deleted; at most the new one is left: %v", keys)

	m = durableDedup(t, dir, time.Nanosecond, &got)
	stopWithin(t, m)
	assert.Zero(t, topoLogKeys(t, dir)["i/"])
}

// dedupChildEnv names the data directory of a child of
// TestDeduplicationSurvivesAKill.
const dedupChildEnv = "TINYMQ_DEDUP_CHILD_DIR"

// TestDeduplicationKilledChild is the program TestDeduplicationSurvivesAKill
// kills: it publishes 0, 1, 2, ... with IDs of the same text to a durable
// queue, printing "P n" once Publish(n) returned nil.
func TestDeduplicationKilledChild(t *testing.T) {
	dir := os.Getenv(dedupChildEnv)
	if dir == "" {
		t.Skip("runs in a child process of TestDeduplicationSurvivesAKill")
	}
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, failing, 1, tinymq.WithQueueName("dq"), tinymq.WithDurable()))
	for i := 0; ; i++ {
		require.NoError(t, m.Publish("ev", strconv.Itoa(i), tinymq.WithDeduplicationID(strconv.Itoa(i))))
		fmt.Fprintf(os.Stdout, "P %d\n", i)
	}
}

// A producer killed with SIGKILL, whatever its publish was doing, retries
// after the restart every publish it cannot know the fate of (all those it
// saw confirmed, and the one under way): each message is delivered once.
func TestDeduplicationSurvivesAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	for cycle := range 3 {
		dir := t.TempDir()
		last := runDedupChild(t, dir, 5+rand.IntN(100))
		var got recorder
		m := tinymq.New(tinymq.WithDataDir(dir), quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, got.consume, 1, tinymq.WithQueueName("dq"), tinymq.WithDurable()))
		for i := 0; i <= last+1; i++ { // last+1 may or may not have been committed
			require.NoError(t, m.Publish("ev", strconv.Itoa(i), tinymq.WithDeduplicationID(strconv.Itoa(i))))
		}
		require.NoError(t, m.Start(context.Background()))
		waitDrained(t, m, "dq")
		dups := m.Stats().Exchanges["ev"].Duplicates
		stopWithin(t, m)
		assert.GreaterOrEqual(t, dups, uint64(last+1), "cycle %d: every confirmed publish is a duplicate", cycle)
		for i := 0; i <= last+1; i++ {
			require.Equal(t, 1, got.count("dq", strconv.Itoa(i)), "cycle %d: message %d of 0..%d", cycle, i, last+1)
		}
	}
}

// runDedupChild runs TestDeduplicationKilledChild on dir, kills it once it
// confirmed after publishes, and returns the last one it confirmed.
func runDedupChild(t *testing.T, dir string, after int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeduplicationKilledChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), dedupChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var killed atomic.Bool
	timer := time.AfterFunc(time.Minute, func() { // a child that prints nothing
		killed.Store(true)
		_ = cmd.Process.Signal(syscall.SIGKILL)
	})
	defer timer.Stop()
	last := -1
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || f[0] != "P" {
			continue
		}
		n, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		require.Equal(t, last+1, n, "confirmed out of order")
		last = n
		if n == after {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL)) // what it prints meanwhile is read on
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the child ended with %v:\n%s", err, stderr.String())
	require.False(t, killed.Load(), "the child confirmed nothing in a minute:\n%s", stderr.String())
	require.GreaterOrEqual(t, last, after)
	return last
}

// IDs recorded in the log are deleted once the MQ forgets them (their
// window passed, or the bound), in batches, without a restart.
func TestDeduplicationForgottenRecordsLeaveTheLog(t *testing.T) {
	dir := t.TempDir()
	var got recorder
	m := durableDedup(t, dir, time.Nanosecond, &got)
	const n = 300
	for i := range n {
		require.NoError(t, m.Publish("ev", "d", tinymq.WithDeduplicationID(strconv.Itoa(i))))
	}
	stopWithin(t, m)
	keys := topoLogKeys(t, dir)
	assert.Less(t, keys["i/"], n, "a batch of forgotten IDs was deleted: %v", keys)
	assert.Equal(t, n, keys["m/"])
}

// A filter that publishes the same deduplication ID from inside the publish
// it filters must not wait for that publish (it never ends): the inner
// publish returns an error at once and the outer one is routed.
func TestDeduplicationPublishOfTheSameIDFromAFilterDoesNotDeadlock(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	inner := make(chan error, 1)
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"),
		tinymq.WithFilter(func(msg *tinymq.Msg) bool {
			if msg.Data == "outer" {
				inner <- m.Publish("ev", "inner", tinymq.WithDeduplicationID("id"))
			}
			return true
		})))
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { stopWithin(t, m) })
	done := make(chan error, 1)
	go func() { done <- m.Publish("ev", "outer", tinymq.WithDeduplicationID("id")) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("a publish whose filter publishes its own deduplication ID froze")
	}
	err := <-inner
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "the inner publish is refused, not routed")
	assert.Equal(t, "outer", (<-got).Data)
	require.NoError(t, m.Publish("ev", "retry", tinymq.WithDeduplicationID("id")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
	assert.Equal(t, uint64(1), m.Stats().Queues["q"].Accepted)
}

// republishingCodec is JSON, except that encoding "outer" first publishes
// "inner" with the same deduplication ID, from inside that ID's publish.
type republishingCodec struct {
	tinymq.JSONCodec
	m     *tinymq.MQ
	inner chan error
}

func (c republishingCodec) Marshal(v any) ([]byte, error) {
	if v == "outer" {
		c.inner <- c.m.Publish("ev", "inner", tinymq.WithDeduplicationID("id"))
	}
	return c.JSONCodec.Marshal(v)
}

// A codec is user code too: its publish of the ID being published is
// refused, not waited for.
func TestDeduplicationPublishOfTheSameIDFromACodecDoesNotDeadlock(t *testing.T) {
	codec := republishingCodec{inner: make(chan error, 4)}
	m := tinymq.New(quiet(), tinymq.WithDataDir(t.TempDir()), tinymq.WithCodec(&codec))
	codec.m = m
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"), tinymq.WithDurable()))
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { stopWithin(t, m) })
	done := make(chan error, 1)
	go func() { done <- m.Publish("ev", "outer", tinymq.WithDeduplicationID("id")) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("a publish whose codec publishes its own deduplication ID froze")
	}
	assert.ErrorIs(t, <-codec.inner, tinymq.ErrInvalidOption, "the inner publish is refused, not routed")
	assert.Equal(t, uint64(1), m.Stats().Queues["q"].Accepted)
}

// A filter that panics fails the publish and leaves no ID behind: a retry of
// the ID is routed.
func TestDeduplicationFilterPanicForgetsTheID(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	var panicked atomic.Bool
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"),
		tinymq.WithFilter(func(*tinymq.Msg) bool {
			if panicked.CompareAndSwap(false, true) {
				panic("filter")
			}
			return true
		})))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	var pe *tinymq.PanicError
	require.ErrorAs(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("x")), &pe)
	require.NoError(t, m.Publish("ev", 2, tinymq.WithDeduplicationID("x")))
	assert.Equal(t, 2, (<-got).Data)
	assert.Zero(t, m.Stats().Exchanges["ev"].Duplicates)
}

// A filter that calls runtime.Goexit ends the publisher's goroutine in the
// middle of a deduplicated publish: its ID is not left claimed, so a later
// publish of the ID neither waits forever nor is taken for a duplicate.
func TestDeduplicationFilterGoexitForgetsTheID(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	var exited atomic.Bool
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q"),
		tinymq.WithFilter(func(*tinymq.Msg) bool {
			if exited.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
			return true
		})))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_ = m.Publish("ev", 1, tinymq.WithDeduplicationID("x"))
	}()
	<-gone
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, m.PublishContext(ctx, "ev", 2, tinymq.WithDeduplicationID("x")))
	assert.Equal(t, 2, (<-got).Data)
	assert.Zero(t, m.Stats().Exchanges["ev"].Duplicates)
}

// A publish waiting for the first publish of its ID (stuck on a full Block
// queue) returns its ctx's error when that ends, and routes nothing; once the
// first is accepted, a retry is a duplicate.
func TestDeduplicationWaiterGivesUpWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.Block)))
		require.NoError(t, m.Publish("ev", "fill"))
		first := make(chan error, 1)
		go func() { first <- m.Publish("ev", "a", tinymq.WithDeduplicationID("id")) }()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := m.PublishContext(ctx, "ev", "b", tinymq.WithDeduplicationID("id"))
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, m.Start(context.Background()))
		var n atomic.Int64
		_, err = m.Consume("q", func(context.Context, *tinymq.Msg) error { n.Add(1); return nil }, 1)
		require.NoError(t, err)
		require.NoError(t, <-first)
		require.NoError(t, m.Publish("ev", "c", tinymq.WithDeduplicationID("id")))
		m.Stop()
		assert.Equal(t, int64(2), n.Load(), "fill and a")
		assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
		assertLedger(t, "q", m.Stats().Queues["q"])
	})
}

// Deleting the exchange forgets its IDs: a re-declared exchange of the same
// name routes an ID the deleted one had accepted, in memory.
func TestDeduplicationDeleteExchangeAndRedeclareStartsAfresh(t *testing.T) {
	m := tinymq.New(quiet())
	got := make(chan *tinymq.Msg, 10)
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, sink(got), 1, tinymq.WithQueueName("q")))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("x")))
	require.NoError(t, m.DeleteExchange("ev"))
	assert.ErrorIs(t, m.Publish("ev", 2, tinymq.WithDeduplicationID("x")), tinymq.ErrUnknownExchange)
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.Bind("q", "ev", tinymq.Fanout))
	require.NoError(t, m.Publish("ev", 3, tinymq.WithDeduplicationID("x")))
	assert.Equal(t, []any{1, 3}, []any{(<-got).Data, (<-got).Data})
	// Re-declared without deduplication, the ID is refused as an option.
	require.NoError(t, m.DeleteExchange("ev"))
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout))
	assert.ErrorIs(t, m.Publish("ev", 4, tinymq.WithDeduplicationID("x")), tinymq.ErrInvalidOption)
}

// With a data directory, what DeleteExchange forgot stays forgotten across a
// restart, as it is in the same run: the deleted exchange's i/ records do
// not come back into a new exchange of the same name.
func TestDeduplicationDeletedExchangesIDsStayForgottenAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	var got recorder
	m := durableDedup(t, dir, time.Hour, &got)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "first", tinymq.WithDeduplicationID("x")))
	require.NoError(t, m.DeleteExchange("ev"))
	m.Stop()

	m2 := durableDedup(t, dir, time.Hour, &got)
	require.NoError(t, m2.Start(context.Background()))
	require.NoError(t, m2.Publish("ev", "again", tinymq.WithDeduplicationID("x")))
	m2.Stop()
	assert.Zero(t, m2.Stats().Exchanges["ev"].Duplicates, "the deleted exchange's ID came back")
}

// Publishers of a few IDs racing Stop: every publish returns nil or
// ErrStopped, each ID is routed at most once, and every accepted message
// ends once.
func TestDeduplicationRacingStopRoutesEachIDAtMostOnce(t *testing.T) {
	for round := range 10 {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		var mu sync.Mutex
		seen := map[any]int{}
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			mu.Lock()
			seen[msg.Data]++
			mu.Unlock()
			return nil
		}, 4, tinymq.WithQueueName("q")))
		require.NoError(t, m.Start(context.Background()))
		var wg sync.WaitGroup
		var nils, stopped atomic.Int64
		for p := range 8 {
			wg.Go(func() {
				for i := range 200 {
					id := fmt.Sprint(i % 50)
					err := m.Publish("ev", id, tinymq.WithDeduplicationID(id))
					switch {
					case err == nil:
						nils.Add(1)
					case errors.Is(err, tinymq.ErrStopped):
						stopped.Add(1)
					default:
						t.Errorf("round %d publisher %d: %v", round, p, err)
						return
					}
				}
			})
		}
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		m.Stop()
		wg.Wait()
		st := m.Stats()
		for id, n := range seen {
			assert.Equal(t, 1, n, "round %d: ID %v routed %d times", round, id, n)
		}
		qs := st.Queues["q"]
		assert.Equal(t, uint64(len(seen)), qs.Accepted)
		assert.Equal(t, uint64(nils.Load()), qs.Accepted+st.Exchanges["ev"].Duplicates, "round %d: every nil is an accepted message or a duplicate", round)
		assertLedger(t, "q", qs)
	}
}

// A late consumer call (past its delivery timeout) that publishes its own
// message's deduplication ID again sees a duplicate, not a freeze.
func TestDeduplicationRepublishFromATimedOutConsumerIsADuplicate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		res := make(chan error, 1)
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(ctx context.Context, msg *tinymq.Msg) error {
			<-ctx.Done()
			time.Sleep(time.Millisecond)
			res <- m.Publish("ev", "again", tinymq.WithDeduplicationID("id"))
			return nil
		}, 1, tinymq.WithQueueName("q"), tinymq.WithDeliveryTimeout(time.Second)))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("ev", "first", tinymq.WithDeduplicationID("id")))
		synctest.Wait()
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		require.Len(t, res, 1, "the late call's publish returned")
		assert.NoError(t, <-res)
		m.Stop()
		st := m.Stats()
		assert.Equal(t, uint64(1), st.Exchanges["ev"].Duplicates)
		assert.Equal(t, uint64(1), st.Queues["q"].Accepted)
		assertLedger(t, "q", st.Queues["q"])
	})
}

// The window is bounded in memory, and an ID that the bound forgot is routed
// again, while a recent one is still a duplicate.
func TestDeduplicationBoundForgetsTheOldestFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 65,537 messages")
	}
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Fanout))
	const bound = 1 << 16
	for i := range bound + 1 {
		require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID(fmt.Sprint(i))))
	}
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID(fmt.Sprint(bound))))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the newest is remembered")
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("0")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the oldest was forgotten past the bound")
	_, err := m.PurgeQueue("q")
	require.NoError(t, err)
	m.Stop()
}

// A publish that failed leaves no ID behind, whatever made it fail: the next
// publish of the ID is routed, and the one after that is a duplicate.
func TestDeduplicationForgetsTheIDOfEveryFailedPublish(t *testing.T) {
	type payload struct{ A int }
	declare := func(t *testing.T, m *tinymq.MQ, kind tinymq.ExchangeType, opts ...tinymq.QueueOption) {
		t.Helper()
		require.NoError(t, m.DeclareExchange("ev", kind, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.DeclareQueue("q", "ev", kind, opts...))
	}
	publish := func(m *tinymq.MQ, data any, opts ...tinymq.PublishOption) func(string) error {
		return func(id string) error { return m.Publish("ev", data, append(opts, tinymq.WithDeduplicationID(id))...) }
	}
	cases := []struct {
		name string
		want error
		// setup declares "ev" and its queue "q", and returns a publish of
		// an ID that fails, and one that then succeeds.
		setup func(t *testing.T, m *tinymq.MQ) (bad, good func(id string) error)
	}{
		{"no route", tinymq.ErrNoRoute, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Direct, tinymq.WithBindingKey("k"))
			return publish(m, 1, tinymq.WithRoutingKey("other")), publish(m, 1, tinymq.WithRoutingKey("k"))
		}},
		{"filtered out", tinymq.ErrNoRoute, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout, tinymq.WithFilter(func(msg *tinymq.Msg) bool { return msg.Data == "ok" }))
			return publish(m, "no"), publish(m, "ok")
		}},
		{"filter panics", tinymq.ErrPanicked, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout, tinymq.WithFilter(func(msg *tinymq.Msg) bool {
				if msg.Data == "panic" {
					panic("filter")
				}
				return true
			}))
			return publish(m, "panic"), publish(m, "ok")
		}},
		{"queue full", tinymq.ErrQueueFull, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.RejectPublish))
			require.NoError(t, m.DeclareQueue("other", "ev", tinymq.Fanout))
			require.NoError(t, m.Publish("ev", "fill"))
			return publish(m, 1), func(id string) error {
				if _, err := m.PurgeQueue("q"); err != nil {
					return err
				}
				return publish(m, 1)(id)
			}
		}},
		{"waiting for room until its context ends", context.DeadlineExceeded, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout, tinymq.WithMaxLen(1, tinymq.Block))
			require.NoError(t, m.Publish("ev", "fill"))
			return func(id string) error {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					defer cancel()
					return m.PublishContext(ctx, "ev", 1, tinymq.WithDeduplicationID(id))
				}, func(id string) error {
					if _, err := m.PurgeQueue("q"); err != nil {
						return err
					}
					return publish(m, 1)(id)
				}
		}},
		{"payload type", tinymq.ErrPayloadType, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
			require.NoError(t, tinymq.RegisterHandler(m, "ev", tinymq.Fanout, func(context.Context, payload) error { return nil }, 1,
				tinymq.WithQueueName("q")))
			return publish(m, "not a payload"), publish(m, payload{1})
		}},
		{"too large", tinymq.ErrTooLarge, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout)
			return publish(m, make([]byte, 2048)), publish(m, make([]byte, 10))
		}},
		{"bad headers", tinymq.ErrInvalidHeaders, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout)
			return publish(m, 1, tinymq.WithHeaders(map[string]any{"c": make(chan int)})), publish(m, 1)
		}},
		{"key too long", tinymq.ErrKeyTooLong, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout)
			return publish(m, 1, tinymq.WithRoutingKey(strings.Repeat("k", 256))), publish(m, 1)
		}},
		{"bad group", tinymq.ErrInvalidOption, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout)
			return publish(m, 1, tinymq.WithMessageGroup("")), publish(m, 1)
		}},
		{"the codec fails for a durable queue", tinymq.ErrPayloadType, func(t *testing.T, m *tinymq.MQ) (func(string) error, func(string) error) {
			declare(t, m, tinymq.Fanout, tinymq.WithDurable())
			return publish(m, make(chan int)), publish(m, 1)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := tinymq.New(quiet(), tinymq.WithDataDir(t.TempDir()), tinymq.WithMaxMessageSize(1024))
			defer stopWithin(t, m)
			bad, good := c.setup(t, m)
			require.ErrorIs(t, bad("id"), c.want, "the failing publish")
			before := m.Stats().Queues["q"].Accepted
			require.NoError(t, good("id"))
			st := m.Stats()
			assert.Equal(t, before+1, st.Queues["q"].Accepted, "the publish after the failed one is routed")
			assert.Zero(t, st.Exchanges["ev"].Duplicates)
			require.NoError(t, good("id"))
			assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "and the next one is a duplicate")
		})
	}
}

// A delayed message's ID is taken when the message is accepted, not when it
// is due, and so is that of a message routed by the alternate exchange; the
// window counts from the accept, even while the message is still delayed.
func TestDeduplicationCoversDelayedMessagesAndAlternateRoutes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := tinymq.New(quiet())
		require.NoError(t, m.DeclareExchange("alt", tinymq.Fanout))
		require.NoError(t, m.DeclareQueue("altq", "alt", tinymq.Fanout))
		require.NoError(t, m.DeclareExchange("ev", tinymq.Direct, tinymq.WithDeduplication(time.Minute), tinymq.WithAlternateExchange("alt")))
		require.NoError(t, m.DeclareQueue("q", "ev", tinymq.Direct, tinymq.WithBindingKey("k")))
		delayed := func() error {
			return m.Publish("ev", 1, tinymq.WithRoutingKey("k"), tinymq.WithDelay(time.Hour), tinymq.WithDeduplicationID("d"))
		}
		require.NoError(t, delayed())
		require.NoError(t, delayed())
		for range 2 {
			require.NoError(t, m.Publish("ev", 1, tinymq.WithRoutingKey("nobody"), tinymq.WithDeduplicationID("a")))
		}
		st := m.Stats()
		assert.Equal(t, uint64(2), st.Exchanges["ev"].Published)
		assert.Equal(t, uint64(2), st.Exchanges["ev"].Duplicates)
		assert.Equal(t, 1, st.Queues["q"].Depth)
		assert.Equal(t, 1, st.Queues["altq"].Depth)
		time.Sleep(2 * time.Minute) // the window has passed; the first is still delayed
		require.NoError(t, delayed())
		assert.Equal(t, 2, m.Stats().Queues["q"].Depth, "routed again once the window passed")
		m.Stop()
	})
}

// The ID of a durable message survives its acknowledgement and the deletion
// of the log segment that held the message: after a restart within the
// window, a retry is still a duplicate.
func TestDeduplicationIDOutlivesTheSegmentOfItsMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a log segment of 64 MiB")
	}
	dir := t.TempDir()
	open := func() *tinymq.MQ {
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Millisecond), quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2,
			tinymq.WithQueueName("dq"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		return m
	}
	segments := func() []string {
		dd, err := tinymq.OpenDataDir(dir)
		require.NoError(t, err)
		defer dd.Close()
		var names []string
		for _, s := range dd.Segments() {
			names = append(names, s.Name)
		}
		return names
	}
	m := open()
	require.NoError(t, m.Publish("ev", "first", tinymq.WithDeduplicationID("d")))
	first := segments()[0]
	big := strings.Repeat("x", 256<<10)
	for i := 0; segments()[0] == first; i++ {
		require.Less(t, i, 40, "the first segment was never deleted")
		for range 20 {
			require.NoError(t, m.Publish("ev", big))
		}
		waitDrained(t, m, "dq")
	}
	stopWithin(t, m)
	m = open()
	require.NoError(t, m.Publish("ev", "again", tinymq.WithDeduplicationID("d")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the ID was forgotten with its message's segment")
	stopWithin(t, m)
}

// A window of the largest Duration saturates rather than overflows: the ID
// holds after a hundred years, and across a restart.
func TestDeduplicationWindowOfMaxDurationNeverEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := dedupMQ(t, math.MaxInt64)
		require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("a")))
		time.Sleep(100 * 365 * 24 * time.Hour)
		require.NoError(t, m.Publish("ev", 1, tinymq.WithDeduplicationID("a")))
		assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates)
		m.Stop()
	})
	dir := t.TempDir()
	var got recorder
	for run := range 2 {
		m := durableDedup(t, dir, math.MaxInt64, &got)
		require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
		assert.Equal(t, uint64(run), m.Stats().Exchanges["ev"].Duplicates, "run %d", run)
		stopWithin(t, m)
	}
}

// The window counts from the first accept across a restart too: it does
// not start again when the next MQ reads the ID from the log. (Real time: a
// durable MQ may not run in a synctest bubble, whose channels the log's
// request pool would carry out of it.)
func TestDeduplicationWindowCountsFromTheFirstAcceptAcrossARestart(t *testing.T) {
	const window = 300 * time.Millisecond
	dir := t.TempDir()
	var got recorder
	m := durableDedup(t, dir, window, &got)
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
	accepted := time.Now()
	stopWithin(t, m)
	<-time.After(time.Until(accepted.Add(window))) // the window passes while no MQ runs
	m = durableDedup(t, dir, window, &got)         // reads the ID from the log
	require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
	assert.Zero(t, m.Stats().Exchanges["ev"].Duplicates, "the window of the first accept has passed")
	assert.Equal(t, 2, m.Stats().Queues["dq"].Depth, "routed again")
	stopWithin(t, m)
}

// The ID of a message whose durable queue was then purged, or deleted and
// declared again, still holds within its window, before and after a restart.
func TestDeduplicationIDOutlivesAPurgeOrDeleteOfItsDurableQueue(t *testing.T) {
	for _, op := range []string{"purge", "delete"} {
		t.Run(op, func(t *testing.T) {
			dir := t.TempDir()
			var got recorder
			m := durableDedup(t, dir, time.Hour, &got)
			require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
			if op == "purge" {
				_, err := m.PurgeQueue("dq")
				require.NoError(t, err)
			} else {
				_, err := m.DeleteQueue("dq")
				require.NoError(t, err)
				require.NoError(t, m.DeclareQueue("dq", "ev", tinymq.Fanout, tinymq.WithDurable()))
			}
			require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
			assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "before the restart")
			stopWithin(t, m)
			m = durableDedup(t, dir, time.Hour, &got)
			require.NoError(t, m.Publish("ev", "d1", tinymq.WithDeduplicationID("a")))
			assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "after the restart")
			assert.Zero(t, m.Stats().Queues["dq"].Depth)
			stopWithin(t, m)
		})
	}
}

// After a restart the exchange remembers at most 65536 IDs too: of 65537
// durable IDs, the oldest is forgotten and the second oldest kept.
func TestDeduplicationBoundHoldsAfterARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 65,537 durable messages")
	}
	const bound = 1 << 16
	dir := t.TempDir()
	open := func() *tinymq.MQ {
		m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(5*time.Millisecond), quiet())
		require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 2,
			tinymq.WithQueueName("dq"), tinymq.WithDurable()))
		require.NoError(t, m.Start(context.Background()))
		return m
	}
	m := open()
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("0")))
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("1")))
	var wg sync.WaitGroup
	for p := range 16 {
		wg.Go(func() {
			for i := 2 + p; i <= bound; i += 16 {
				if err := m.Publish("ev", nil, tinymq.WithDeduplicationID(strconv.Itoa(i))); err != nil {
					t.Errorf("Publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	stopWithin(t, m)
	m = open()
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("1")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the second oldest is remembered")
	require.NoError(t, m.Publish("ev", nil, tinymq.WithDeduplicationID("0")))
	assert.Equal(t, uint64(1), m.Stats().Exchanges["ev"].Duplicates, "the oldest was forgotten past the bound")
	stopWithin(t, m)
}

// A dead letter replayed to a deduplicating exchange is moved back, not
// swallowed as a duplicate of its first publish: its consumer gets it.
func TestDeduplicationLetsAReplayedDeadLetterThrough(t *testing.T) {
	var fixed atomic.Bool
	got := make(chan *tinymq.Msg, 1)
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if !fixed.Load() {
			return tinymq.Permanent(errors.New("bug"))
		}
		got <- msg
		return nil
	}, 1, tinymq.WithQueueName("q"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.DeclareQueue("dead", "dlx", tinymq.Fanout))
	require.NoError(t, m.Start(context.Background()))
	defer stopWithin(t, m)
	require.NoError(t, m.Publish("ev", "job", tinymq.WithDeduplicationID("job-1")))
	require.Eventually(t, func() bool { return m.Stats().Queues["dead"].Depth == 1 }, wait, time.Millisecond)
	fixed.Store(true)
	n, err := m.ReplayDeadLetters("dead", 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, "job", recv(t, got, 1)[0].Data, "the replayed message was delivered")
	assert.Zero(t, m.Stats().Exchanges["ev"].Duplicates)
}

// One message dead-lettered by two queues into a deduplicating dead-letter
// exchange makes two dead letters: each queue's death is its own.
func TestDeduplicationOfADeadLetterExchangeKeepsEachQueuesDeadLetter(t *testing.T) {
	m := tinymq.New(quiet())
	require.NoError(t, m.DeclareExchange("ev", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	require.NoError(t, m.DeclareExchange("dlx", tinymq.Fanout, tinymq.WithDeduplication(time.Hour)))
	dead := deadLetters(t, m)
	for _, q := range []string{"q1", "q2"} {
		require.NoError(t, m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
			return tinymq.Permanent(errors.New("no"))
		}, 1, tinymq.WithQueueName(q), tinymq.WithDeadLetter("dlx", "")))
	}
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("ev", "job", tinymq.WithDeduplicationID("job-1")))
	queues := map[string]int{}
	for _, d := range recv(t, dead, 2) {
		queues[d.Deaths[0].Queue]++
	}
	assert.Equal(t, map[string]int{"q1": 1, "q2": 1}, queues)
	stopWithin(t, m)
	assert.Zero(t, m.Stats().Exchanges["dlx"].Duplicates)
}
