package amqp_test

import (
	"context"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
)

// brokerExchange returns the exchange's type and arguments as the broker
// has them (rabbitmqctl list_exchanges).
func brokerExchange(t *testing.T, name string) string {
	t.Helper()
	out, err := broker(t).Ctl(context.Background(), "list_exchanges", "-q", "--no-table-headers", "name", "type", "arguments")
	require.NoError(t, err, out)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name+"\t") {
			return strings.TrimPrefix(l, name+"\t")
		}
	}
	return ""
}

// TestExternalExchangesAreCheckedNeverDeclared: an exchange that another
// service declared (WithExternalExchanges), of another type and with
// arguments of its own, is used as it is: DeclareExchange and RegisterQueue
// only check that the broker has it, Publish needs no declaration, and
// DeleteExchange is refused. One the broker does not have is
// ErrUnknownExchange. The broker's own amq.* exchanges are external without
// the option.
func TestExternalExchangesAreCheckedNeverDeclared(t *testing.T) {
	n := uniq(t)
	ch := rawChannel(t)
	require.NoError(t, ch.ExchangeDeclare(n("billing"), "topic", true, false, false, false, amqp091.Table{"x-owner": "billing"}))
	t.Cleanup(func() { _ = rawChannel(t).ExchangeDelete(n("billing"), false, false) })
	before := brokerExchange(t, n("billing"))
	require.Contains(t, before, "topic")

	m := newMQ(t, amqp.WithExternalExchanges(n("billing"), n("missing")))
	consume, got := collect()
	other := newMQ(t, amqp.WithExternalExchanges(n("billing")))
	require.NoError(t, other.DeclareExchange(n("billing"), tinymq.Fanout), "another type than the broker's: not declared, so no mismatch")
	require.NoError(t, m.RegisterQueue(n("billing"), tinymq.Topic, consume, 1, tinymq.WithQueueName(n("q")), tinymq.WithBindingKey("invoice.*")))
	require.NoError(t, m.RegisterQueue("amq.topic", tinymq.Topic, consume, 1, tinymq.WithQueueName(n("q2")), tinymq.WithBindingKey(n("k"))),
		"amq.* exchanges cannot be declared, only checked")
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(n("billing"), "invoice", tinymq.WithRoutingKey("invoice.paid")))
	assert.Equal(t, "invoice", receive(t, got, "through the external exchange"))
	publisher := newMQ(t, amqp.WithExternalExchanges(n("billing")))
	require.NoError(t, publisher.Publish(n("billing"), "undeclared", tinymq.WithRoutingKey("invoice.sent")), "no declaration needed")
	assert.Equal(t, "undeclared", receive(t, got, "published without a declaration"))
	require.NoError(t, m.Publish("amq.topic", "broker's", tinymq.WithRoutingKey(n("k"))))
	assert.Equal(t, "broker's", receive(t, got, "through amq.topic"))

	assert.ErrorIs(t, m.DeleteExchange(n("billing")), tinymq.ErrUnsupported)
	assert.ErrorIs(t, m.DeclareExchange(n("missing"), tinymq.Fanout), tinymq.ErrUnknownExchange)
	assert.ErrorIs(t, m.Publish(n("missing"), "x"), tinymq.ErrUnknownExchange)
	assert.ErrorIs(t, newMQ(t, amqp.WithExternalExchanges(n("billing"))).DeclareExchange(n("billing"), tinymq.Topic,
		tinymq.WithAlternateExchange(n("ae"))), tinymq.ErrUnsupported, "its arguments are its owner's")
	assert.Equal(t, before, brokerExchange(t, n("billing")), "the owner's exchange is unchanged")
}

// TestDefaultExchangeRoutesByQueueName: amqp.DefaultExchange is RabbitMQ's
// default exchange (""), which routes a message to the queue its routing key
// names, as amqp091-go publishers use it; a queue registered on it gets no
// binding, and a key that names no queue is ErrNoRoute.
func TestDefaultExchangeRoutesByQueueName(t *testing.T) {
	n := uniq(t)
	m := newMQ(t)
	require.NoError(t, m.DeclareQueue(n("idle"), amqp.DefaultExchange, tinymq.Direct, tinymq.WithBindingKey(n("idle"))))
	require.NoError(t, m.Publish(amqp.DefaultExchange, "waits", tinymq.WithRoutingKey(n("idle"))))
	assert.Equal(t, 1, brokerQueue(t, n("idle")).Messages)
	assert.ErrorIs(t, m.Publish(amqp.DefaultExchange, "lost", tinymq.WithRoutingKey(n("nobody"))), tinymq.ErrNoRoute)

	got := make(chan *tinymq.Msg, 1)
	require.NoError(t, m.RegisterQueue(amqp.DefaultExchange, tinymq.Direct, func(_ context.Context, msg *tinymq.Msg) error {
		got <- msg
		return nil
	}, 1, tinymq.WithQueueName(n("jobs")), tinymq.WithBindingKey(n("jobs"))))
	assert.ErrorIs(t, m.RegisterQueue(amqp.DefaultExchange, tinymq.Direct, nop, 1, tinymq.WithQueueName(n("other")),
		tinymq.WithBindingKey("not-its-name")), tinymq.ErrUnsupported)
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(amqp.DefaultExchange, "job", tinymq.WithRoutingKey(n("jobs"))))
	msg := <-got
	assert.Equal(t, amqp.DefaultExchange, msg.Exchange)
	assert.Equal(t, n("jobs"), msg.RoutingKey)
	assert.Equal(t, uint64(2), m.Stats().Exchanges[amqp.DefaultExchange].Published)
}
