package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinymq/tinymq"
)

// Each queue in turn consumes every message first and mutates every field of
// its Msg (and keeps it); the other queues, held back meanwhile, must still
// see the original fields. Kept Msgs are never reused for another delivery.
func TestEachQueueOwnsItsMsg(t *testing.T) {
	type kind struct {
		name string
		kind tinymq.ExchangeType
		bind []tinymq.QueueOption
		pub  []tinymq.PublishOption
		key  string
		hdr  bool
	}
	kinds := []kind{
		{name: "fanout plain", kind: tinymq.Fanout},
		{name: "fanout keyed with headers", kind: tinymq.Fanout, key: "k.x",
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k.x"), tinymq.WithHeaders(map[string]any{"h": "v"})}, hdr: true},
		{name: "direct", kind: tinymq.Direct, key: "k", bind: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k")}},
		{name: "topic with headers", kind: tinymq.Topic, key: "a.b", bind: []tinymq.QueueOption{tinymq.WithBindingKey("a.*")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("a.b"), tinymq.WithHeaders(map[string]any{"h": "v"})}, hdr: true},
		{name: "headers", kind: tinymq.Headers, bind: []tinymq.QueueOption{tinymq.WithBindingArgs(map[string]any{"h": "v"})},
			pub: []tinymq.PublishOption{tinymq.WithHeaders(map[string]any{"h": "v"})}, hdr: true},
		{name: "direct with expiration", kind: tinymq.Direct, key: "k", bind: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k"), tinymq.WithExpiration(time.Hour)}},
	}
	const queues, msgs = 3, 40
	for _, k := range kinds {
		for free := range queues {
			t.Run(fmt.Sprintf("%s/queue%d first", k.name, free), func(t *testing.T) {
				m := tinymq.New()
				gates := make([]chan struct{}, queues)
				done := make([]chan struct{}, queues)
				var mu sync.Mutex
				kept := make([][]*tinymq.Msg, queues)
				var problems []string
				bad := func(format string, args ...any) {
					mu.Lock()
					problems = append(problems, fmt.Sprintf(format, args...))
					mu.Unlock()
				}
				for i := range queues {
					gates[i] = make(chan struct{})
					done[i] = make(chan struct{}, msgs)
					name := fmt.Sprintf("q%d", i)
					opts := append([]tinymq.QueueOption{tinymq.WithQueueName(name)}, k.bind...)
					require.NoError(t, m.RegisterQueue("ev", k.kind, func(ctx context.Context, msg *tinymq.Msg) error {
						select {
						case <-gates[i]:
						case <-ctx.Done():
							return ctx.Err()
						case <-time.After(wait):
							bad("%s: gate never opened", name)
						}
						p, _ := msg.Data.(*numbered)
						switch {
						case p == nil:
							bad("%s: Data %#v", name, msg.Data)
						case msg.ID != uint64(p.N+1):
							bad("%s: ID %d for message %d", name, msg.ID, p.N)
						}
						if msg.Queue != name || msg.Exchange != "ev" || msg.RoutingKey != k.key || msg.Attempt != 1 ||
							msg.Redelivered || len(msg.Deaths) != 0 {
							bad("%s: saw a changed Msg: %+v", name, *msg)
						}
						if k.hdr && (len(msg.Headers) != 1 || msg.Headers["h"] != "v") {
							bad("%s: headers %v", name, msg.Headers)
						}
						if !k.hdr && msg.Headers != nil {
							bad("%s: headers %v", name, msg.Headers)
						}
						// Mutate every field of our own Msg and keep it.
						msg.ID = 0
						msg.Queue = "mut"
						msg.Exchange = "mut"
						msg.RoutingKey = "mut"
						msg.Attempt = 99
						msg.Redelivered = true
						msg.Headers = map[string]any{"h": "mut"}
						msg.Data = "mut"
						msg.Deaths = []tinymq.Death{{Queue: "mut"}}
						mu.Lock()
						kept[i] = append(kept[i], msg)
						mu.Unlock()
						done[i] <- struct{}{}
						return nil
					}, 2, opts...))
				}
				require.NoError(t, m.Start(context.Background()))
				defer stopWithin(t, m)
				close(gates[free])
				for n := range msgs {
					require.NoError(t, m.Publish("ev", &numbered{N: n}, k.pub...))
				}
				recv(t, done[free], msgs)
				for i := range queues {
					if i != free {
						close(gates[i])
					}
				}
				for i := range queues {
					if i != free {
						recv(t, done[i], msgs)
					}
				}
				stopWithin(t, m)
				assert.Empty(t, problems)
				seen := make(map[*tinymq.Msg]bool)
				for i := range queues {
					for _, msg := range kept[i] {
						assert.False(t, seen[msg], "a Msg handed to two deliveries")
						seen[msg] = true
						assert.Equal(t, "mut", msg.RoutingKey, "a kept Msg was changed after its consumer returned")
						assert.Equal(t, "mut", msg.Queue)
						assert.Equal(t, "mut", msg.Data)
						assert.Equal(t, 99, msg.Attempt)
					}
				}
			})
		}
	}
}

// A consumer may keep its Msg: retrying it delivers a copy, and
// dead-lettering it gives the dead letter its own Deaths, so the kept Msg of
// every attempt stays as the consumer left it (plain or keyed, one queue or
// several).
func TestKeptMsgIsUntouchedByRetryAndDeadLetter(t *testing.T) {
	cases := []struct {
		name   string
		kind   tinymq.ExchangeType
		queues int
		bind   []tinymq.QueueOption
		pub    []tinymq.PublishOption
	}{
		{name: "plain, one queue", kind: tinymq.Fanout, queues: 1},
		{name: "plain, three queues", kind: tinymq.Fanout, queues: 3},
		{name: "keyed, one queue", kind: tinymq.Direct, queues: 1, bind: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k")}},
		{name: "keyed with headers, three queues", kind: tinymq.Direct, queues: 3, bind: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k"), tinymq.WithHeaders(map[string]any{"h": "v"})}},
	}
	type snap struct {
		msg                       *tinymq.Msg
		id                        uint64
		queue, key                string
		attempt, deaths, nHeaders int
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := tinymq.New()
			dead := make(chan *tinymq.Msg, 100)
			require.NoError(t, m.RegisterQueue("dlx", tinymq.Fanout, sink(dead), 1, tinymq.WithQueueName("dead")))
			var mu sync.Mutex
			var kept []snap
			for i := range c.queues {
				opts := append([]tinymq.QueueOption{tinymq.WithQueueName(fmt.Sprintf("q%d", i)), tinymq.WithDeadLetter("dlx", ""),
					tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})}, c.bind...)
				require.NoError(t, m.RegisterQueue("ev", c.kind, func(_ context.Context, msg *tinymq.Msg) error {
					mu.Lock()
					kept = append(kept, snap{msg: msg, id: msg.ID, queue: msg.Queue, key: msg.RoutingKey, attempt: msg.Attempt,
						deaths: len(msg.Deaths), nHeaders: len(msg.Headers)})
					mu.Unlock()
					return errors.New("keep failing")
				}, 2, opts...))
			}
			require.NoError(t, m.Start(context.Background()))
			defer stopWithin(t, m)
			const n = 30
			for i := range n {
				require.NoError(t, m.Publish("ev", &numbered{N: i}, c.pub...))
			}
			for _, d := range recv(t, dead, n*c.queues) {
				if assert.Len(t, d.Deaths, 1) {
					assert.Equal(t, 3, d.Deaths[0].Attempts)
				}
			}
			stopWithin(t, m)
			require.Len(t, kept, 3*n*c.queues)
			seen := map[*tinymq.Msg]bool{}
			for _, k := range kept {
				assert.False(t, seen[k.msg], "one Msg handed to two attempts")
				seen[k.msg] = true
				got := snap{msg: k.msg, id: k.msg.ID, queue: k.msg.Queue, key: k.msg.RoutingKey, attempt: k.msg.Attempt,
					deaths: len(k.msg.Deaths), nHeaders: len(k.msg.Headers)}
				assert.Equal(t, k, got, "a kept Msg changed after its consumer returned")
			}
		})
	}
}
