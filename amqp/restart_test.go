package amqp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// TestBrokerRestartLosesNoConfirmedMessage stops the broker in the middle of
// a run that publishes and consumes, starts it again, and checks that every
// message whose Publish returned nil was delivered (at least once), that
// publishers wait through the outage, and that a publish with a short
// timeout fails clearly during it.
func TestBrokerRestartLosesNoConfirmedMessage(t *testing.T) {
	b := broker(t)
	n := uniq(t)
	const before, after = 300, 300

	var mu sync.Mutex
	got := make(map[int]int)
	delivered := make(chan struct{}, 1) // a nudge after each delivery
	m := newMQ(t, amqp.WithPublishTimeout(2*time.Minute))
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, tinymq.Handler(func(_ context.Context, i int) error {
		mu.Lock()
		got[i]++
		mu.Unlock()
		select {
		case delivered <- struct{}{}:
		default:
		}
		return nil
	}), 4, tinymq.WithQueueName(n("q"))))
	require.NoError(t, m.Start(context.Background()))

	impatient := newMQ(t, amqp.WithPublishTimeout(300*time.Millisecond))
	require.NoError(t, impatient.DeclareExchange(n("ex"), tinymq.Fanout))

	// The publisher: one goroutine, joined through pubDone.
	confirmed := make(chan int, before+after+10000)
	progress := make(chan struct{}, 1) // a nudge after each confirm
	var pubErr error
	stop, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := m.Publish(n("ex"), i); err != nil {
				pubErr = err
				return
			}
			confirmed <- i
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}()
	waitConfirmed := func(k int, what string) {
		t.Helper()
		deadline := time.After(2 * time.Minute)
		for len(confirmed) < k {
			select {
			case <-progress:
			case <-pubDone:
				t.Fatalf("%s: the publisher stopped: %v", what, pubErr)
			case <-deadline:
				t.Fatalf("%s: %d confirmed, want %d", what, len(confirmed), k)
			}
		}
	}
	waitConfirmed(before, "before the restart")

	b.StopServer()
	outage := len(confirmed)
	err := impatient.Publish(n("ex"), -1)
	assert.ErrorIs(t, err, amqp.ErrUnconfirmed, "a publish during the outage")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	t.Logf("during the outage: %v", err)
	statsDone := make(chan struct{})
	go func() { // joined below
		defer close(statsDone)
		_ = m.Stats()
	}()
	select {
	case <-statsDone:
	case <-time.After(5 * time.Second):
		t.Error("Stats blocked during the outage")
	}
	<-statsDone
	b.StartServer(t)

	waitConfirmed(outage+after, "after the restart")
	close(stop)
	<-pubDone
	require.NoError(t, pubErr)
	close(confirmed)
	var want []int
	for i := range confirmed {
		want = append(want, i)
	}

	deadline := time.After(time.Minute)
	for {
		mu.Lock()
		missing, dups := 0, 0
		for _, i := range want {
			switch c := got[i]; {
			case c == 0:
				missing++
			case c > 1:
				dups += c - 1
			}
		}
		mu.Unlock()
		if missing == 0 {
			t.Logf("%d confirmed messages, all delivered; %d delivered twice (at least once)", len(want), dups)
			break
		}
		select {
		case <-delivered:
		case <-deadline:
			t.Fatalf("%d of %d confirmed messages never delivered", missing, len(want))
		}
	}
	m.Stop()
}
