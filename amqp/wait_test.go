package amqp_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// The engine's helper queues on the broker: retry wait queues and delay
// queues (see wait.go).

// brokerQueueNames lists the broker's queues whose names start with prefix,
// with rabbitmqctl, which uses none of them (a passive declaration would
// start a queue's x-expires again).
func brokerQueueNames(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := broker(t).Ctl(context.Background(), "list_queues", "-q", "--no-table-headers", "name")
	require.NoError(t, err, out)
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, prefix) {
			names = append(names, l)
		}
	}
	return names
}

// TestJitteredRetriesComeBackAtTheirOwnTimes: 20 messages failing within
// about 280 ms, with a 1 s backoff and Jitter 0.8, each come back after its
// own jittered wait, in [200 ms, 1 s], not in their failure order: a wait
// queue holds messages of one wait only, so the broker, which expires
// messages at the head of a queue only, expires each at its time. The wait
// queues stay few (one per jitter level).
func TestJitteredRetriesComeBackAtTheirOwnTimes(t *testing.T) {
	n := uniq(t)
	const msgs = 20
	var mu sync.Mutex
	failed := make(map[int]time.Time)
	back := make(map[int]time.Time)
	all := make(chan struct{})
	m := newMQ(t)
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, tinymq.Handler(func(_ context.Context, i int) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, ok := failed[i]; !ok {
			failed[i] = now
			return errors.New("fails once")
		}
		back[i] = now
		if len(back) == msgs {
			close(all)
		}
		return nil
	}), 4, tinymq.WithQueueName(n("q")), tinymq.WithRetry(tinymq.RetryPolicy{
		MaxAttempts: 2, InitialBackoff: time.Second, MaxBackoff: time.Second, Jitter: 0.8,
	})))
	require.NoError(t, m.Start(context.Background()))
	tick := time.NewTicker(14 * time.Millisecond) // 20 failures within about 280 ms
	defer tick.Stop()
	for i := range msgs {
		<-tick.C
		require.NoError(t, m.Publish(n("ex"), i))
	}
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		t.Fatal("the retries did not all come back within 20s")
	}
	mu.Lock()
	defer mu.Unlock()
	order := make([]int, 0, msgs) // by failure time
	for i := range msgs {
		order = append(order, i)
	}
	slices.SortFunc(order, func(a, b int) int { return failed[a].Compare(failed[b]) })
	inversions := 0
	var shortest, longest time.Duration
	for x, i := range order {
		w := back[i].Sub(failed[i])
		if x == 0 || w < shortest {
			shortest = w
		}
		longest = max(longest, w)
		assert.GreaterOrEqual(t, w, 190*time.Millisecond, "message %d came back before its shortest wait", i)
		assert.LessOrEqual(t, w, 2500*time.Millisecond, "message %d waited far longer than its backoff", i)
		for _, j := range order[x+1:] {
			if back[j].Before(back[i]) {
				inversions++
			}
		}
	}
	t.Logf("waits from %v to %v; %d of %d pairs came back in another order than they failed",
		shortest.Round(time.Millisecond), longest.Round(time.Millisecond), inversions, msgs*(msgs-1)/2)
	// Uniform waits over 800 ms against failures over 280 ms put about 70
	// of the 190 pairs out of order; head-of-queue expiry puts none.
	assert.GreaterOrEqual(t, inversions, 20, "the retries came back in their failure order: jitter did not spread them")
	assert.Less(t, shortest, 500*time.Millisecond, "no short jittered wait")
	waits := brokerQueueNames(t, "tinymq.retry."+n("q")+".")
	assert.NotEmpty(t, waits)
	assert.LessOrEqual(t, len(waits), 8, "wait queues: %v", waits)
}

// TestUnusedHelperQueuesLeaveTheBroker: the engine's retry wait queues and
// delay queues have an x-expires (their TTL plus a lease, shortened here), so
// that the broker deletes those no longer used. An earlier layout's wait
// queue of the same wait (no x-expires) does not make the queue's
// declaration fail.
func TestUnusedHelperQueuesLeaveTheBroker(t *testing.T) {
	n := uniq(t)
	// As the earlier layout declared it, which a new declaration with
	// x-expires would refuse.
	old := "tinymq.retry." + n("q") + ".100"
	_, err := rawChannel(t).QueueDeclare(old, true, false, false, false,
		amqp091.Table{"x-message-ttl": int64(100), "x-dead-letter-exchange": "tinymq.requeue"})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = rawChannel(t).QueueDelete(old, false, false, false) })

	m := newMQ(t, amqp.WithHelperLease(3*time.Second))
	got := make(chan int, 4)
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if msg.Attempt == 1 {
			return errors.New("fails once")
		}
		got <- msg.Attempt
		return nil
	}, 1, tinymq.WithQueueName(n("q")), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: 100 * time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(n("ex"), "retried"))
	require.NoError(t, m.Publish(n("ex"), "delayed", tinymq.WithDelay(100*time.Millisecond)))
	for range 2 {
		select {
		case a := <-got:
			assert.Equal(t, 2, a, "the delayed message fails once too")
		case <-time.After(15 * time.Second):
			t.Fatal("a message did not come back")
		}
	}
	wait, delay := "tinymq.retry."+n("q")+".100ms", "tinymq.delay."+n("ex")+".100ms"
	assert.True(t, brokerHasQueue(t, wait), "the retry wait queue is there while in use")
	assert.True(t, brokerHasQueue(t, delay), "the delay queue is there while in use")
	waitFor(t, "the unused helper queues leave the broker", func() bool {
		return !brokerHasQueue(t, wait) && !brokerHasQueue(t, delay)
	})
	assert.True(t, brokerHasQueue(t, old), "the earlier layout's queue is left alone")
	assert.True(t, brokerHasQueue(t, n("q")))
}

// TestHelperQueueLeaseIsRenewedWhileInUse: publishing is no use of a queue
// for the broker, so the engine declares a helper queue again before it
// publishes to it once half its lease has passed: delayed messages keep
// coming through a delay queue used for longer than its x-expires.
func TestHelperQueueLeaseIsRenewedWhileInUse(t *testing.T) {
	n := uniq(t)
	m := newMQ(t, amqp.WithHelperLease(time.Second)) // x-expires: 1.5 s + 1 s
	consume, got := collect()
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, consume, 1, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m.Start(context.Background()))
	const msgs = 16
	tick := time.NewTicker(250 * time.Millisecond) // 4 s of publishing, longer than the x-expires
	defer tick.Stop()
	for i := range msgs {
		<-tick.C
		require.NoError(t, m.Publish(n("ex"), "delayed", tinymq.WithDelay(1500*time.Millisecond)), "publish %d", i)
	}
	for i := range msgs {
		receive(t, got, "delayed message "+string(rune('a'+i)))
	}
}
