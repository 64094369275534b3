package tinymqwatermill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"

	tinymqwatermill "github.com/tinymq/tinymq/watermill"
)

// wait bounds every wait for something that must happen.
const wait = 5 * time.Second

// quiet is how long a test watches for something that must not happen.
const quiet = 50 * time.Millisecond

func newPublisher(t *testing.T, mq *tinymq.MQ, cfg tinymqwatermill.PublisherConfig) *tinymqwatermill.Publisher {
	t.Helper()
	pub, err := tinymqwatermill.NewPublisher(mq, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pub.Close()) })
	return pub
}

func newSubscriber(t *testing.T, mq *tinymq.MQ, cfg tinymqwatermill.SubscriberConfig) *tinymqwatermill.Subscriber {
	t.Helper()
	sub, err := tinymqwatermill.NewSubscriber(mq, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sub.Close()) })
	return sub
}

func subscribe(t *testing.T, sub message.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	ch, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	return ch
}

func msg(payload string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(payload))
}

func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "channel closed")
		return m
	case <-time.After(wait):
		t.Fatal("no message")
		return nil
	}
}

func requireNothing(t *testing.T, ch <-chan *message.Message) {
	t.Helper()
	select {
	case m, ok := <-ch:
		if ok {
			t.Fatalf("unexpected message %s %q", m.UUID, m.Payload)
		}
		t.Fatal("channel closed")
	case <-time.After(quiet):
	}
}

func requireClosed(t *testing.T, ch <-chan *message.Message) {
	t.Helper()
	select {
	case m, ok := <-ch:
		if ok {
			t.Fatalf("want closed, got message %q", m.Payload)
		}
	case <-time.After(wait):
		t.Fatal("channel not closed")
	}
}

// stopWithin stops mq and fails unless Stop returns within wait.
func stopWithin(t *testing.T, mq *tinymq.MQ) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		mq.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("MQ.Stop hangs")
	}
}

func TestConstructorsRefuseBadInput(t *testing.T) {
	_, err := tinymqwatermill.NewPublisher(nil, tinymqwatermill.PublisherConfig{})
	require.ErrorIs(t, err, tinymqwatermill.ErrNilMQ)
	_, err = tinymqwatermill.NewSubscriber(nil, tinymqwatermill.SubscriberConfig{})
	require.ErrorIs(t, err, tinymqwatermill.ErrNilMQ)
	_, err = tinymqwatermill.NewSubscriber(tinymq.New(), tinymqwatermill.SubscriberConfig{Concurrency: -1})
	require.ErrorIs(t, err, tinymq.ErrInvalidOption)
}

func TestBadArguments(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})

	require.Error(t, pub.Publish("t", msg("a"), nil))
	require.ErrorIs(t, pub.Publish("", msg("a")), tinymq.ErrEmptyName)
	//lint:ignore SA1012 a nil context is the point
	_, err := sub.Subscribe(nil, "t")
	require.ErrorIs(t, err, tinymq.ErrInvalidOption)
	_, err = sub.Subscribe(context.Background(), "")
	require.ErrorIs(t, err, tinymq.ErrEmptyName)

	require.NoError(t, mq.DeclareExchange("direct", tinymq.Direct))
	_, err = sub.Subscribe(context.Background(), "direct")
	require.ErrorIs(t, err, tinymq.ErrExchangeMismatch)
	require.ErrorIs(t, sub.SubscribeInitialize("direct"), tinymq.ErrExchangeMismatch)
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	a := subscribe(t, sub, "t")
	b := subscribe(t, sub, "u")

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			assert.NoError(t, sub.Close())
			assert.NoError(t, pub.Close())
		})
	}
	wg.Wait()
	requireClosed(t, a)
	requireClosed(t, b)

	require.ErrorIs(t, pub.Publish("t", msg("x")), tinymqwatermill.ErrClosed)
	_, err := sub.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, tinymqwatermill.ErrClosed)
	require.ErrorIs(t, sub.SubscribeInitialize("t"), tinymqwatermill.ErrClosed)
}

// A reader may close its Subscriber while it holds a message.
func TestCloseFromTheReader(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	for _, group := range []string{"g", ""} {
		sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: group})
		ch := subscribe(t, sub, "t")
		require.NoError(t, pub.Publish("t", msg("1")))
		m := receive(t, ch)
		closed := make(chan struct{})
		go func() {
			assert.NoError(t, sub.Close())
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(wait):
			t.Fatal("Close hangs while the reader holds a message")
		}
		m.Ack() // too late: harmless
		requireClosed(t, ch)
	}
}

func TestSubscribeAfterStop(t *testing.T) {
	mq := startMQ(t)
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	require.NoError(t, sub.SubscribeInitialize("t"))
	mq.Stop()
	_, err := sub.Subscribe(context.Background(), "t")
	require.ErrorIs(t, err, tinymq.ErrStopped)
	_, err = sub.Subscribe(context.Background(), "new")
	require.ErrorIs(t, err, tinymq.ErrStopped)
}

func TestUUIDMetadataPayloadAndContext(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "v")
	ch, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)

	sent := msg("payload")
	sent.Metadata.Set("k", "v")
	require.NoError(t, pub.Publish("t", sent))

	got := receive(t, ch)
	assert.Equal(t, sent.UUID, got.UUID)
	assert.Equal(t, "payload", string(got.Payload))
	assert.Equal(t, message.Metadata{"k": "v"}, got.Metadata)
	assert.Equal(t, "v", got.Context().Value(key{}), "the message context carries Subscribe's values")
	require.NoError(t, got.Context().Err())
	got.Ack()
	select {
	case <-got.Context().Done():
	case <-time.After(wait):
		t.Fatal("message context not cancelled after Ack")
	}
}

func TestBroadcastWithoutGroup(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	strict := newPublisher(t, mq, tinymqwatermill.PublisherConfig{FailUnroutable: true})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{})

	require.ErrorIs(t, strict.Publish("news", msg("0")), tinymq.ErrUnknownExchange)
	require.NoError(t, pub.Publish("news", msg("0")), "nobody listens: dropped")
	require.NoError(t, sub.SubscribeInitialize("news"))
	require.ErrorIs(t, strict.Publish("news", msg("0")), tinymq.ErrNoRoute)

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	a, err := sub.Subscribe(ctxA, "news")
	require.NoError(t, err)
	b := subscribe(t, sub, "news")

	require.NoError(t, strict.Publish("news", msg("1")))
	for _, ch := range []<-chan *message.Message{a, b} {
		m := receive(t, ch)
		assert.Equal(t, "1", string(m.Payload))
		m.Ack()
	}

	cancelA()
	requireClosed(t, a)
	require.NoError(t, strict.Publish("news", msg("2")))
	m := receive(t, b)
	assert.Equal(t, "2", string(m.Payload))
	m.Ack()

	require.NoError(t, sub.Close())
	requireClosed(t, b)
	require.ErrorIs(t, strict.Publish("news", msg("3")), tinymq.ErrNoRoute, "no queue is bound once nobody listens")
	assert.Empty(t, broadcastQueues(mq, "news"), "a broadcast subscription's queue goes with it")
	stats := mq.Stats()
	assert.Equal(t, uint64(2), stats.DeletedQueues)
	assert.Equal(t, uint64(2), stats.Exchanges["news"].Unroutable, "the refusals after the exchange was declared")
}

func TestBroadcastNackRedeliversToThatSubscriptionOnly(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{})
	a := subscribe(t, sub, "news")
	b := subscribe(t, sub, "news")
	require.NoError(t, pub.Publish("news", msg("1"), msg("2")))

	receive(t, a).Nack()
	again := receive(t, a)
	assert.Equal(t, "1", string(again.Payload))
	again.Ack()
	first := receive(t, b)
	assert.Equal(t, "1", string(first.Payload))
	first.Ack()
	for _, ch := range []<-chan *message.Message{a, b} {
		m := receive(t, ch)
		assert.Equal(t, "2", string(m.Payload))
		m.Ack()
	}
}

func TestGroupsEachGetEverythingMembersCompete(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	billing1 := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing"})
	billing2 := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "billing"})
	audit := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "audit"})

	b1 := subscribe(t, billing1, "orders")
	b2 := subscribe(t, billing2, "orders")
	au := subscribe(t, audit, "orders")

	const n = 20
	for i := range n {
		require.NoError(t, pub.Publish("orders", msg(fmt.Sprint(i))))
	}
	for i := range n {
		m := receive(t, au)
		assert.Equal(t, fmt.Sprint(i), string(m.Payload))
		m.Ack()
	}
	// One billing message at a time (Concurrency 1): whichever member takes it.
	var got []string
	for range n {
		select {
		case m := <-b1:
			got = append(got, string(m.Payload))
			m.Ack()
		case m := <-b2:
			got = append(got, string(m.Payload))
			m.Ack()
		case <-time.After(wait):
			t.Fatal("billing got", got)
		}
	}
	for i := range n {
		assert.Equal(t, fmt.Sprint(i), got[i], "order across the group's members")
	}
	requireNothing(t, b1)
	requireNothing(t, b2)
}

func TestGroupKeepsMessagesWhileNobodySubscribes(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{FailUnroutable: true})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	require.NoError(t, sub.SubscribeInitialize("t"))
	require.NoError(t, pub.Publish("t", msg("1"), msg("2")))
	require.NoError(t, sub.Close())

	later := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, later, "t")
	for _, want := range []string{"1", "2"} {
		m := receive(t, ch)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
}

func TestNackRedeliversBeforeTheNext(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")
	require.NoError(t, pub.Publish("t", msg("1"), msg("2"), msg("3")))

	var got []string
	for nacks := 2; len(got) < 5; {
		m := receive(t, ch)
		got = append(got, string(m.Payload))
		if string(m.Payload) == "1" && nacks > 0 {
			nacks--
			m.Nack()
			continue
		}
		m.Ack()
	}
	assert.Equal(t, []string{"1", "1", "1", "2", "3"}, got)
}

func TestUnackedMessageGoesToTheNextSubscription(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	first := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, first, "t")
	require.NoError(t, pub.Publish("t", msg("1"), msg("2")))
	held := receive(t, ch)
	require.NoError(t, first.Close())
	requireClosed(t, ch)
	select {
	case <-held.Context().Done():
	case <-time.After(wait):
		t.Fatal("context of a held message not cancelled by Close")
	}
	held.Ack() // too late: ignored

	second := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch = subscribe(t, second, "t")
	for _, want := range []string{"1", "2"} {
		m := receive(t, ch)
		assert.Equal(t, want, string(m.Payload))
		m.Ack()
	}
}

func TestConcurrencyAllowsMessagesInParallel(t *testing.T) {
	mq := startMQ(t)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	for _, tc := range []struct {
		concurrency, inFlight int
	}{{1, 1}, {2, 2}} {
		t.Run(fmt.Sprint(tc.concurrency), func(t *testing.T) {
			topic := "t" + fmt.Sprint(tc.concurrency)
			sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g", Concurrency: tc.concurrency})
			a := subscribe(t, sub, topic)
			b := subscribe(t, sub, topic)
			require.NoError(t, pub.Publish(topic, msg("1"), msg("2"), msg("3")))
			var held []*message.Message
			for len(held) < tc.inFlight {
				select {
				case m := <-a:
					held = append(held, m)
				case m := <-b:
					held = append(held, m)
				case <-time.After(wait):
					t.Fatalf("%d messages in flight, want %d", len(held), tc.inFlight)
				}
			}
			requireNothing(t, a)
			requireNothing(t, b)
			for _, m := range held {
				m.Ack()
			}
		})
	}
}

func TestSubscribeBeforeStart(t *testing.T) {
	mq := tinymq.New()
	t.Cleanup(mq.Stop)
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{FailUnroutable: true})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")
	require.NoError(t, pub.Publish("t", msg("1")))
	requireNothing(t, ch)
	require.NoError(t, mq.Start(context.Background()))
	receive(t, ch).Ack()
}

func TestTinyMQInterop(t *testing.T) {
	mq := startMQ(t)
	native := make(chan *tinymq.Msg, 1)
	require.NoError(t, mq.RegisterQueue("t", tinymq.Fanout, func(_ context.Context, m *tinymq.Msg) error {
		native <- m
		return nil
	}, 1))
	pub := newPublisher(t, mq, tinymqwatermill.PublisherConfig{})
	sub := newSubscriber(t, mq, tinymqwatermill.SubscriberConfig{ConsumerGroup: "g"})
	ch := subscribe(t, sub, "t")

	sent := msg("from watermill")
	sent.Metadata.Set("k", "v")
	require.NoError(t, pub.Publish("t", sent))
	select {
	case m := <-native:
		assert.Equal(t, []byte("from watermill"), m.Data)
		assert.Equal(t, map[string]any{tinymqwatermill.UUIDHeader: sent.UUID, "k": "v"}, m.Headers)
	case <-time.After(wait):
		t.Fatal("the TinyMQ consumer got nothing")
	}
	receive(t, ch).Ack()

	type event struct{ ID int }
	require.NoError(t, mq.Publish("t", event{ID: 7}, tinymq.WithHeaders(map[string]any{"k": "v", "n": 3})))
	got := receive(t, ch)
	got.Ack()
	assert.JSONEq(t, `{"ID":7}`, string(got.Payload))
	assert.Equal(t, message.Metadata{"k": "v", "n": "3"}, got.Metadata)
	assert.NotEmpty(t, got.UUID)
	<-native

	body, err := json.Marshal([]byte("bytes"))
	require.NoError(t, err)
	require.NoError(t, mq.Publish("t", tinymq.Encoded{Body: body, Codec: tinymq.JSONCodec{}}))
	got = receive(t, ch)
	got.Ack()
	assert.Equal(t, "bytes", string(got.Payload), "an Encoded []byte is decoded")
	<-native
	require.NoError(t, mq.Publish("t", tinymq.Encoded{Body: []byte(`{"ID":8}`), Codec: tinymq.JSONCodec{}}))
	got = receive(t, ch)
	got.Ack()
	assert.Equal(t, `{"ID":8}`, string(got.Payload), "an Encoded struct stays encoded")
	<-native

	require.NoError(t, mq.Publish("t", "text"))
	got = receive(t, ch)
	got.Ack()
	assert.Equal(t, "text", string(got.Payload))
	<-native
}
