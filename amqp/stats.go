package amqp

import (
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// Stats reports what this client knows: per exchange, what it published
// and what came back unroutable; per queue, what its consumer did, and the
// depth of the queue and of its retry wait queues, read from the broker
// with passive declarations when connected (zero otherwise). It never waits
// for a connection.
func (e *engine) Stats() tinymq.Stats {
	st := tinymq.Stats{
		Exchanges: make(map[string]tinymq.ExchangeStats),
		Queues:    make(map[string]tinymq.QueueStats),
	}
	e.topoMu.RLock()
	for name, ex := range e.exchanges {
		st.Exchanges[name] = tinymq.ExchangeStats{
			Kind:       kindOf(ex.kind),
			Published:  ex.published.Load(),
			Unroutable: ex.unroutable.Load(),
		}
	}
	e.topoMu.RUnlock()
	e.mu.Lock()
	queues := append([]*cqueue(nil), e.queues...)
	conn := e.pubConn
	e.mu.Unlock()

	var depth func(name string) int
	if conn != nil {
		var ch *amqp091.Channel
		defer func() {
			if ch != nil {
				_ = ch.Close()
			}
		}()
		depth = func(name string) int {
			if ch == nil {
				var err error
				if ch, err = conn.Channel(); err != nil {
					return 0
				}
			}
			qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				ch = nil // the broker closed the channel (the queue is gone)
				return 0
			}
			return qi.Messages
		}
	} else {
		depth = func(string) int { return 0 }
	}
	for _, q := range queues {
		qs := tinymq.QueueStats{
			Ready:        depth(q.spec.Name),
			InFlight:     int(q.inFlight.Load()),
			Delivered:    q.c.delivered.Load(),
			Succeeded:    q.c.succeeded.Load(),
			Failed:       q.c.failed.Load(),
			Retried:      q.c.retried.Load(),
			DeadLettered: q.c.deadLettered.Load(),
			Dropped:      q.c.dropped.Load(),
			ConsumerTime: tinymq.DurationStats(q.hist.Snapshot()),
		}
		for _, w := range q.waitQs {
			qs.Scheduled += depth(w)
		}
		qs.Depth = qs.Ready + qs.Scheduled
		st.Queues[q.spec.Name] = qs
	}
	return st
}

func kindOf(s string) tinymq.ExchangeType {
	for _, k := range []tinymq.ExchangeType{tinymq.Fanout, tinymq.Direct, tinymq.Topic, tinymq.Headers} {
		if k.String() == s {
			return k
		}
	}
	return 0
}
