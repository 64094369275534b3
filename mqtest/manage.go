package mqtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinymq/tinymq"
)

// The cases of the topology at run time: queues declared without a consumer
// and consumed by subscriptions, cancelled, deleted, purged, expired and
// paused; bindings and exchanges removed.

func nop(context.Context, *tinymq.Msg) error { return nil }

// queueStats polls Stats until ok accepts the queue's stats, or fails the
// test after the suite's timeout, naming what it waited for.
func queueStats(t *testing.T, m *tinymq.MQ, queue, what string, ok func(tinymq.QueueStats, bool) bool) tinymq.Stats {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := m.Stats()
		qs, found := st.Queues[queue]
		if ok(qs, found) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; Stats of queue %q: %+v (present: %v)", what, timeout, queue, qs, found)
		}
		<-time.After(5 * time.Millisecond) // polling the broker's counts: nothing to wait on
	}
}

// queueInfo returns the queue's entry in Topology.
func queueInfo(t *testing.T, m *tinymq.MQ, queue string) tinymq.QueueInfo {
	t.Helper()
	for _, qi := range m.Topology().Queues {
		if qi.Name == queue {
			return qi
		}
	}
	t.Fatalf("Topology has no queue %q", queue)
	return tinymq.QueueInfo{}
}

func (s *suite) declareThenConsume(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("parked"), n("parked")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	start(t, m)
	for i := range 3 {
		publish(t, m, ex, event{Kind: fmt.Sprint("e", i)})
	}
	equal(t, m.Stats().Queues[q].Depth, 3, "Depth of a queue without a consumer")
	equal(t, queueInfo(t, m, q).Consumers, 0, "Topology: Consumers before Consume")
	k := newSink()
	_, err := m.Consume(q, k.consume, 1)
	must(t, err, "Consume")
	equalSlices(t, kinds(t, k.take(t, 3, "subscription")), []string{"e0", "e1", "e2"}, "the messages that waited, in order")
	equal(t, queueInfo(t, m, q).Consumers, 1, "Topology: Consumers after Consume")
}

func (s *suite) redeclare(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, other, q := n("fanout"), n("direct"), n("q")
	ttl := tinymq.WithMessageTTL(time.Minute)
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout, ttl), "DeclareQueue")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout, ttl), "DeclareQueue again, with the same settings")
	must(t, m.DeclareQueue(q, other, tinymq.Direct, ttl, tinymq.WithBindingKey("k")), "DeclareQueue with the same settings, bound to another exchange")
	wantErr(t, m.DeclareQueue(q, ex, tinymq.Fanout, tinymq.WithMessageTTL(2*time.Minute)), tinymq.ErrDuplicateQueue, "DeclareQueue with another TTL")
	wantErr(t, m.DeclareQueue(q, ex, tinymq.Fanout), tinymq.ErrDuplicateQueue, "DeclareQueue without the TTL")
	equal(t, queueInfo(t, m, q).MessageTTL, time.Minute, "the TTL after a refused declare")
	start(t, m)
	publish(t, m, ex, event{Kind: "fanout"})
	publish(t, m, other, event{Kind: "direct"}, tinymq.WithRoutingKey("k"))
	wantErr(t, m.Publish(other, event{Kind: "x"}, tinymq.WithRoutingKey("x")), tinymq.ErrNoRoute, "another key")
	publish(t, m, ex, event{Kind: "fence"})
	k := newSink()
	_, err := m.Consume(q, k.consume, 1)
	must(t, err, "Consume")
	equalSlices(t, k.takeUntilFence(t, "queue"), []string{"fanout", "direct"},
		"each binding once: the same one declared twice routes one copy")
}

func (s *suite) compete(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("work"), n("work")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	// Each message waits until both subscriptions hold one: with one worker
	// each, that proves that both take the queue's messages.
	var inside atomic.Int32
	both := make(chan struct{})
	var once sync.Once
	got := newSink()
	consumer := func(ctx context.Context, msg *tinymq.Msg) error {
		if inside.Add(1) == 2 {
			once.Do(func() { close(both) })
		}
		select {
		case <-both:
		case <-time.After(timeout):
			return errors.New("the other subscription never took a message")
		}
		return got.consume(ctx, msg)
	}
	for i := range 2 {
		_, err := m.Consume(q, consumer, 1)
		must(t, err, fmt.Sprint("Consume ", i))
	}
	start(t, m)
	const count = 10
	want := make([]string, count)
	for i := range count {
		want[i] = fmt.Sprint(i)
		publish(t, m, ex, event{Kind: want[i]})
	}
	select {
	case <-both:
	case <-time.After(timeout):
		t.Fatalf("%d of 2 subscriptions held a message at once", inside.Load())
	}
	gotKinds := kinds(t, got.take(t, count, "subscriptions"))
	slices.Sort(gotKinds)
	slices.Sort(want)
	equalSlices(t, gotKinds, want, "every message, once, across the subscriptions")
	equal(t, queueInfo(t, m, q).Consumers, 2, "Topology: Consumers")
}

func (s *suite) cancel(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("work"), n("work")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	start(t, m)
	b := newBlocker(t)
	a, err := m.Consume(q, b.consume, 1)
	must(t, err, "Consume")
	publish(t, m, ex, event{Kind: "block"})
	b.waitStarted(t)
	publish(t, m, ex, event{Kind: "x1"})
	publish(t, m, ex, event{Kind: "x2"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	wantErr(t, a.Cancel(ctx), context.DeadlineExceeded, "Cancel while a delivery is in flight, past its deadline")
	equal(t, queueInfo(t, m, q).Consumers, 0, "Topology: Consumers after Cancel")
	b.unblock()
	must(t, a.Cancel(context.Background()), "Cancel again: waits for the delivery in flight")
	equalSlices(t, kinds(t, b.sink.take(t, 1, "the cancelled subscription")), []string{"block"}, "the delivery in flight finished")
	queueStats(t, m, q, "the delivery in flight succeeded", func(qs tinymq.QueueStats, _ bool) bool { return qs.Succeeded == 1 })

	k := newSink()
	_, err = m.Consume(q, k.consume, 1)
	must(t, err, "Consume another")
	publish(t, m, ex, event{Kind: "fence"})
	equalSlices(t, k.takeUntilFence(t, "the other subscription"), []string{"x1", "x2"}, "the other subscription gets the rest")
	equal(t, len(b.sink.ch), 0, "messages the cancelled subscription got after its Cancel")
}

func (s *suite) cancelFromConsumer(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("self"), n("self")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	var self atomic.Pointer[tinymq.Subscription]
	errs := make(chan error, 1)
	got := newSink()
	sub, err := m.Consume(q, func(ctx context.Context, msg *tinymq.Msg) error {
		errs <- self.Load().Cancel(context.Background()) // must not wait for this very delivery
		return got.consume(ctx, msg)
	}, 1)
	must(t, err, "Consume")
	self.Store(sub)
	start(t, m)
	publish(t, m, ex, event{Kind: "cancel"})
	select {
	case err := <-errs:
		must(t, err, "Cancel from the subscription's own consumer")
	case <-time.After(timeout):
		t.Fatal("Cancel from the subscription's own consumer did not return")
	}
	k := newSink()
	_, err = m.Consume(q, k.consume, 1)
	must(t, err, "Consume another")
	publish(t, m, ex, event{Kind: "after"})
	publish(t, m, ex, event{Kind: "fence"})
	equalSlices(t, k.takeUntilFence(t, "the other subscription"), []string{"after"}, "the other subscription")
	must(t, sub.Cancel(context.Background()), "Cancel again, from the test")
	equalSlices(t, kinds(t, got.take(t, 1, "the cancelled subscription")), []string{"cancel"}, "the cancelled subscription")
	equal(t, len(got.ch), 0, "messages the cancelled subscription got after its Cancel")
}

func (s *suite) deleteQueue(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q, busyEx, busy := n("ex"), n("q"), n("busy"), n("busy")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	must(t, m.RegisterQueue(busyEx, tinymq.Fanout, nop, 1, tinymq.WithQueueName(busy)), "RegisterQueue busy")
	start(t, m)
	for i := range 3 {
		publish(t, m, ex, event{Kind: fmt.Sprint(i)})
	}
	_, err := m.DeleteQueue(q, tinymq.IfEmpty())
	wantErr(t, err, tinymq.ErrNotEmpty, "DeleteQueue IfEmpty of a queue in which messages wait")
	_, err = m.DeleteQueue(busy, tinymq.IfUnused())
	wantErr(t, err, tinymq.ErrInUse, "DeleteQueue IfUnused of a queue with a consumer")
	equal(t, m.Stats().Queues[q].Depth, 3, "Depth after the refused deletes")

	removed, err := m.DeleteQueue(q)
	must(t, err, "DeleteQueue")
	equal(t, removed, 3, "DeleteQueue: the messages removed")
	st := m.Stats()
	if _, ok := st.Queues[q]; ok {
		t.Fatalf("Stats still has the deleted queue %q", q)
	}
	equal(t, st.DeletedQueues, uint64(1), "Stats().DeletedQueues")
	equal(t, st.Deleted.Removed, uint64(3), "Stats().Deleted.Removed")
	wantErr(t, m.Publish(ex, event{Kind: "late"}), tinymq.ErrNoRoute, "a publish to the deleted queue's exchange")
	_, err = m.DeleteQueue(q)
	wantErr(t, err, tinymq.ErrUnknownQueue, "DeleteQueue of a deleted queue")
	_, err = m.Consume(q, nop, 1)
	wantErr(t, err, tinymq.ErrUnknownQueue, "Consume of a deleted queue")

	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue again")
	equal(t, m.Stats().Queues[q].Depth, 0, "Depth of the queue declared again")
	removed, err = m.DeleteQueue(q, tinymq.IfEmpty(), tinymq.IfUnused())
	must(t, err, "DeleteQueue IfEmpty IfUnused of an empty queue without consumers")
	equal(t, removed, 0, "DeleteQueue of an empty queue: the messages removed")
	removed, err = m.DeleteQueue(busy)
	must(t, err, "DeleteQueue of a queue with a consumer")
	equal(t, removed, 0, "DeleteQueue of a queue with a consumer: the messages removed")
	wantErr(t, m.Publish(busyEx, event{Kind: "late"}), tinymq.ErrNoRoute, "a publish to the deleted busy queue's exchange")
}

func (s *suite) purge(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("ex"), n("q")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	start(t, m)
	for i := range 3 {
		publish(t, m, ex, event{Kind: fmt.Sprint(i)})
	}
	purged, err := m.PurgeQueue(q)
	must(t, err, "PurgeQueue")
	equal(t, purged, 3, "PurgeQueue: the messages removed")
	qs := m.Stats().Queues[q]
	equal(t, qs.Purged, uint64(3), "Stats: Purged")
	equal(t, qs.Depth, 0, "Stats: Depth after the purge")
	purged, err = m.PurgeQueue(q)
	must(t, err, "PurgeQueue of an empty queue")
	equal(t, purged, 0, "PurgeQueue of an empty queue: the messages removed")
	publish(t, m, ex, event{Kind: "after"})
	publish(t, m, ex, event{Kind: "fence"})
	k := newSink()
	_, err = m.Consume(q, k.consume, 1)
	must(t, err, "Consume")
	equalSlices(t, k.takeUntilFence(t, "queue"), []string{"after"}, "a purged message never arrives")
}

func (s *suite) unbind(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	direct, fanout, q, fq := n("direct"), n("fanout"), n("q"), n("fq")
	must(t, m.DeclareQueue(q, direct, tinymq.Direct, tinymq.WithBindingKey("a"), tinymq.WithBindingKey("b")), "DeclareQueue")
	must(t, m.DeclareQueue(fq, fanout, tinymq.Fanout), "DeclareQueue fanout")
	start(t, m)
	must(t, m.Unbind(q, direct, tinymq.WithBindingKey("a")), "Unbind key a")
	wantErr(t, m.Publish(direct, event{Kind: "a"}, tinymq.WithRoutingKey("a")), tinymq.ErrNoRoute, "a publish with the unbound key")
	must(t, m.Unbind(q, direct, tinymq.WithBindingKey("a")), "Unbind key a again: a binding that does not exist")
	must(t, m.Unbind(q, direct, tinymq.WithBindingKey("never")), "Unbind a key never bound")
	wantErr(t, m.Unbind(q, direct, tinymq.WithBindingArgs(map[string]any{"x-match": "all"})), tinymq.ErrInvalidBinding,
		"Unbind with binding arguments from a direct exchange")
	publish(t, m, direct, event{Kind: "b"}, tinymq.WithRoutingKey("b"))
	must(t, m.Unbind(fq, fanout), "Unbind from a fanout exchange")
	wantErr(t, m.Publish(fanout, event{Kind: "f"}), tinymq.ErrNoRoute, "a publish to the fanout exchange after the unbind")
	publish(t, m, direct, event{Kind: "fence"}, tinymq.WithRoutingKey("b"))
	k := newSink()
	_, err := m.Consume(q, k.consume, 1)
	must(t, err, "Consume")
	equalSlices(t, k.takeUntilFence(t, "queue"), []string{"b"}, "the queue keeps its other binding")
}

func (s *suite) deleteExchange(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	empty, used, q := n("empty"), n("used"), n("q")
	must(t, m.DeclareExchange(empty, tinymq.Direct), "DeclareExchange")
	must(t, m.DeclareQueue(q, used, tinymq.Fanout), "DeclareQueue")
	start(t, m)
	wantErr(t, m.DeleteExchange(used, tinymq.IfUnused()), tinymq.ErrInUse, "DeleteExchange IfUnused of an exchange with a binding")
	wantErr(t, m.DeleteExchange(used, tinymq.IfEmpty()), tinymq.ErrInvalidOption, "DeleteExchange IfEmpty")
	publish(t, m, used, event{Kind: "before"})
	must(t, m.DeleteExchange(empty, tinymq.IfUnused()), "DeleteExchange IfUnused of an exchange without bindings")
	wantErr(t, m.Publish(empty, event{Kind: "x"}), tinymq.ErrUnknownExchange, "a publish to the deleted exchange")
	must(t, m.DeleteExchange(used), "DeleteExchange with a binding")
	wantErr(t, m.Publish(used, event{Kind: "x"}), tinymq.ErrUnknownExchange, "a publish to the deleted exchange")
	wantErr(t, m.DeleteExchange(used), tinymq.ErrUnknownExchange, "DeleteExchange of a deleted exchange")
	st := m.Stats()
	if _, ok := st.Exchanges[used]; ok {
		t.Fatalf("Stats still has the deleted exchange %q", used)
	}
	equal(t, st.Queues[q].Depth, 1, "the queue stays, with its messages")

	must(t, m.DeclareExchange(used, tinymq.Fanout), "DeclareExchange again")
	wantErr(t, m.Publish(used, event{Kind: "x"}), tinymq.ErrNoRoute, "the exchange declared again has no bindings")
	must(t, m.Bind(q, used, tinymq.Fanout), "Bind")
	publish(t, m, used, event{Kind: "fence"})
	k := newSink()
	_, err := m.Consume(q, k.consume, 1)
	must(t, err, "Consume")
	equalSlices(t, k.takeUntilFence(t, "queue"), []string{"before"}, "the queue")
}

func (s *suite) queueExpiry(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	const expiry = 300 * time.Millisecond
	ex, q, keptEx, kept := n("ex"), n("q"), n("kept"), n("kept")
	k := newSink()
	must(t, m.RegisterQueue(keptEx, tinymq.Fanout, k.consume, 1, tinymq.WithQueueName(kept), tinymq.WithQueueExpiry(expiry)),
		"RegisterQueue with an expiry")
	start(t, m)
	publish(t, m, keptEx, event{Kind: "ping"})
	k.take(t, 1, "the queue with a consumer")
	begin := time.Now()
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout, tinymq.WithQueueExpiry(expiry)), "DeclareQueue with an expiry")
	equal(t, queueInfo(t, m, q).Expiry, expiry, "Topology: Expiry")
	publish(t, m, ex, event{Kind: "waits"}) // a publish is no use of the queue
	st := queueStats(t, m, q, "the unused queue expired", func(_ tinymq.QueueStats, found bool) bool { return !found })
	if elapsed := time.Since(begin); elapsed < expiry {
		t.Fatalf("the queue expired %v after its declare, before its expiry of %v", elapsed, expiry)
	}
	equal(t, st.ExpiredQueues, uint64(1), "Stats().ExpiredQueues")
	if _, ok := st.Queues[kept]; !ok {
		t.Fatalf("the queue with a consumer, declared before the one that expired, expired too")
	}
	wantErr(t, m.Publish(ex, event{Kind: "late"}), tinymq.ErrNoRoute, "a publish to the expired queue's exchange")
}

func (s *suite) pause(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("ex"), n("q")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	k := newSink()
	_, err := m.Consume(q, k.consume, 1)
	must(t, err, "Consume")
	start(t, m)
	publish(t, m, ex, event{Kind: "a"})
	k.take(t, 1, "before the pause")
	must(t, m.PauseQueue(q), "PauseQueue")
	must(t, m.PauseQueue(q), "PauseQueue of a paused queue")
	publish(t, m, ex, event{Kind: "b"})
	publish(t, m, ex, event{Kind: "c"})
	queueStats(t, m, q, "two messages ready in the paused queue", func(qs tinymq.QueueStats, _ bool) bool { return qs.Ready == 2 })
	equal(t, len(k.ch), 0, "messages a paused queue delivered")
	equal(t, m.Stats().Queues[q].Paused, true, "Stats: Paused")
	equal(t, queueInfo(t, m, q).Paused, true, "Topology: Paused")
	must(t, m.ResumeQueue(q), "ResumeQueue")
	must(t, m.ResumeQueue(q), "ResumeQueue of a queue that is not paused")
	equalSlices(t, kinds(t, k.take(t, 2, "after the resume")), []string{"b", "c"}, "the messages held, in order")
	equal(t, m.Stats().Queues[q].Paused, false, "Stats: Paused after the resume")
}

func (s *suite) unknownNames(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q, nope := n("ex"), n("q"), n("nope")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	start(t, m)
	_, err := m.Consume(nope, nop, 1)
	wantErr(t, err, tinymq.ErrUnknownQueue, "Consume")
	_, err = m.DeleteQueue(nope)
	wantErr(t, err, tinymq.ErrUnknownQueue, "DeleteQueue")
	_, err = m.PurgeQueue(nope)
	wantErr(t, err, tinymq.ErrUnknownQueue, "PurgeQueue")
	wantErr(t, m.PauseQueue(nope), tinymq.ErrUnknownQueue, "PauseQueue")
	wantErr(t, m.ResumeQueue(nope), tinymq.ErrUnknownQueue, "ResumeQueue")
	wantErr(t, m.Unbind(nope, ex), tinymq.ErrUnknownQueue, "Unbind of an unknown queue")
	wantErr(t, m.Unbind(q, nope), tinymq.ErrUnknownExchange, "Unbind from an unknown exchange")
	wantErr(t, m.DeleteExchange(nope), tinymq.ErrUnknownExchange, "DeleteExchange")
}

func (s *suite) topologyAfterStop(t *testing.T) {
	n := names(t)
	m := s.mq(t)
	ex, q := n("ex"), n("q")
	must(t, m.DeclareQueue(q, ex, tinymq.Fanout), "DeclareQueue")
	sub, err := m.Consume(q, nop, 1)
	must(t, err, "Consume")
	start(t, m)
	m.Stop()
	wantErr(t, m.DeclareQueue(n("late"), ex, tinymq.Fanout), tinymq.ErrStopped, "DeclareQueue")
	_, err = m.Consume(q, nop, 1)
	wantErr(t, err, tinymq.ErrStopped, "Consume")
	_, err = m.DeleteQueue(q)
	wantErr(t, err, tinymq.ErrStopped, "DeleteQueue")
	_, err = m.PurgeQueue(q)
	wantErr(t, err, tinymq.ErrStopped, "PurgeQueue")
	wantErr(t, m.PauseQueue(q), tinymq.ErrStopped, "PauseQueue")
	wantErr(t, m.ResumeQueue(q), tinymq.ErrStopped, "ResumeQueue")
	wantErr(t, m.Unbind(q, ex), tinymq.ErrStopped, "Unbind")
	wantErr(t, m.DeleteExchange(ex), tinymq.ErrStopped, "DeleteExchange")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	must(t, sub.Cancel(ctx), "Cancel after Stop")
}
