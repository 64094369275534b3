package tinymq

// Delivery is one message as a [RegisterDeliveryHandler] consumer receives
// it: by value, so that handing it over allocates nothing. Its fields mean
// what the same fields of [Msg] mean, with Data already a T. The consumer owns
// its copy; Headers and Deaths are shared with the message's other copies, so
// treat them as read-only.
type Delivery[T any] struct {
	ID          uint64
	Exchange    string
	Queue       string
	RoutingKey  string
	Headers     map[string]any
	Data        T
	Attempt     int
	Deaths      []Death
	Redelivered bool
	// Group is the message's [WithMessageGroup], as [Msg.Group] returns it.
	Group string

	msg *Msg // the Msg of a ConsumerFunc's call, for the middleware's chain (see wrapConsumer)
}

// delivery is m as a direct consumer receives it.
func (m *Msg) delivery() Delivery[any] {
	return Delivery[any]{ID: m.ID, Exchange: m.Exchange, Queue: m.Queue, RoutingKey: m.RoutingKey,
		Headers: m.Headers, Data: m.Data, Attempt: m.Attempt, Deaths: m.Deaths, Redelivered: m.Redelivered, Group: m.Group()}
}

// delivery is a shared entry as a direct consumer receives it.
func (e *entry) delivery(queue string) Delivery[any] {
	p := e.m
	return Delivery[any]{ID: e.id, Exchange: p.Exchange, Queue: queue, RoutingKey: p.RoutingKey, Headers: p.Headers,
		Data: e.data, Attempt: 1, Deaths: p.Deaths}
}
