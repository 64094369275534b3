package tinymq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tinymq/tinymq"
)

// BenchmarkPaths measures publish -> deliver through each kind of routing and
// queue that the plain fanout rows of BenchmarkSweep do not cover: a direct
// and a topic routing key, headers, a length limit, a queue TTL, a filter,
// a retry (every message fails once, then succeeds on a retry with no
// backoff), and the job-queue options at settings that never hold a message
// back, so that each row is their cost: ordered groups (16 groups in turn),
// a rate limit far above the rate, a delivery timeout, and deduplication (a
// new ID for each publish). One queue, one worker, 64-byte payloads; ns/op is per message.
//
//	go test -run '^$' -bench Paths -benchtime 100000x -count 9 . | tee paths.txt
func BenchmarkPaths(b *testing.B) {
	type path struct {
		name string
		kind tinymq.ExchangeType
		opts []tinymq.QueueOption
		pub  []tinymq.PublishOption
		fail bool // the first attempt of each message fails
		// groups: publish to that many message groups in turn; dedup: a
		// deduplicated exchange, a new ID for each publish.
		groups int
		dedup  bool
	}
	paths := []path{
		{name: "direct", kind: tinymq.Direct, opts: []tinymq.QueueOption{tinymq.WithBindingKey("k")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("k")}},
		{name: "topic", kind: tinymq.Topic, opts: []tinymq.QueueOption{tinymq.WithBindingKey("user.*")},
			pub: []tinymq.PublishOption{tinymq.WithRoutingKey("user.created")}},
		{name: "headers", kind: tinymq.Headers, opts: []tinymq.QueueOption{tinymq.WithBindingArgs(map[string]any{"type": "user"})},
			pub: []tinymq.PublishOption{tinymq.WithHeaders(map[string]any{"type": "user"})}},
		{name: "maxlen", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithMaxLen(1<<30, tinymq.RejectPublish)}},
		{name: "ttl", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithMessageTTL(time.Hour)}},
		{name: "filter", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithFilter(func(*tinymq.Msg) bool { return true })}},
		{name: "retry", kind: tinymq.Fanout, fail: true,
			opts: []tinymq.QueueOption{tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Nanosecond})}},
		{name: "groups", kind: tinymq.Fanout, groups: 16, opts: []tinymq.QueueOption{tinymq.WithGroupOrdering()}},
		{name: "ratelimit", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithRateLimit(1e9, 1<<20)}},
		{name: "timeout", kind: tinymq.Fanout, opts: []tinymq.QueueOption{tinymq.WithDeliveryTimeout(time.Hour)}},
		{name: "dedup", kind: tinymq.Fanout, dedup: true},
	}
	errFirst := errors.New("first attempt")
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			m := tinymq.New()
			if p.dedup {
				if err := m.DeclareExchange("bench", p.kind, tinymq.WithDeduplication(time.Hour)); err != nil {
					b.Fatal(err)
				}
			}
			d := newDone(int64(b.N))
			err := m.RegisterQueue("bench", p.kind, func(_ context.Context, msg *tinymq.Msg) error {
				if p.fail && msg.Attempt == 1 {
					return errFirst
				}
				d.one()
				return nil
			}, 1, p.opts...)
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 64)
			var each [][]tinymq.PublishOption // per publish, when it varies
			switch {
			case p.groups > 0:
				for g := range p.groups {
					each = append(each, append(slices.Clip(p.pub), tinymq.WithMessageGroup(fmt.Sprint("g", g))))
				}
			case p.dedup:
				for i := range b.N {
					each = append(each, append(slices.Clip(p.pub), tinymq.WithDeduplicationID(fmt.Sprint("id-", i))))
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				pub := p.pub
				if len(each) > 0 {
					pub = each[i%len(each)]
				}
				if err := m.Publish("bench", data, pub...); err != nil {
					b.Fatal(err)
				}
			}
			<-d.all
			b.StopTimer()
			m.Stop()
		})
	}
}
