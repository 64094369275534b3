package tinymq_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinymq/tinymq"
)

// The end-to-end benchmarks publish b.N messages and stop the clock when every
// queue has consumed every one of them. Each TinyMQ case has a twin, "chan",
// that does the same work over plain buffered channels of []byte (one per
// queue, drained by the same number of goroutines): the floor TinyMQ is
// measured against. A third, "chanmsg", sends a newly allocated *Msg per
// queue instead, to show what the one allocation per queue costs by itself.
// They run next to each other, so -count interleaves them in one run:
//
//	go test -run '^$' -bench PublishDeliver -count 10 | tee new.txt
//	benchstat -col /impl new.txt

// pipeline is what a benchmark publishes into.
type pipeline interface {
	publish(data []byte)
	close() // waits for every consumer to return
}

// done counts consumed messages and closes all when it reaches want.
type done struct {
	n    atomic.Int64
	want int64
	all  chan struct{}

	gate    chan struct{}   // if set, consumers wait until it is closed
	backlog int             // if set, how many messages a channel must buffer
	lat     []time.Duration // if set, each message's publish -> consume latency
}

func newDone(want int64) *done { return &done{want: want, all: make(chan struct{})} }

// payload is the []byte a channel carried, directly or in a Msg.
func payload[T any](v T) []byte {
	switch v := any(v).(type) {
	case []byte:
		return v
	case *[]byte:
		return *v
	case *tinymq.Msg:
		return v.Data.([]byte)
	}
	panic("unknown payload")
}

// got counts one consumed payload, and records its latency if asked to.
func (d *done) got(data []byte) {
	if d.lat != nil {
		sent := time.Duration(binary.LittleEndian.Uint64(data))
		d.lat[d.n.Load()%int64(len(d.lat))] = time.Since(latencyBase) - sent // one consumer: no race
	}
	d.one()
}

func (d *done) one() {
	if d.gate != nil {
		<-d.gate
	}
	if d.n.Add(1) == d.want {
		close(d.all)
	}
}

type mqPipeline struct{ m *tinymq.MQ }

// newHandlerPipeline is newMQPipeline with the allocation-free consumer form,
// RegisterHandler.
func newHandlerPipeline(b *testing.B, queues, concurrency int, d *done) pipeline {
	return mqPipeline{startMQ(b, queues, func(m *tinymq.MQ) error {
		return tinymq.RegisterHandler(m, "bench", tinymq.Fanout, func(_ context.Context, data []byte) error {
			d.got(data)
			return nil
		}, concurrency)
	})}
}

// startMQ makes an MQ, registers queues queues with register, and starts it.
func startMQ(b *testing.B, queues int, register func(m *tinymq.MQ) error) *tinymq.MQ {
	m := tinymq.New()
	for range queues {
		if err := register(m); err != nil {
			b.Fatal(err)
		}
	}
	if err := m.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return m
}

// ptrPipeline is newHandlerPipeline publishing a pointer to the payload,
// which Publish does not box: what TinyMQ's hand-off costs without the one
// allocation Publish's data any makes for a []byte.
type ptrPipeline struct {
	m *tinymq.MQ
	ptrs
}

// ptrs hands out a pointer to each payload, the same one while the payload
// is the same: the benchmarks reuse one payload, or make one per message.
// Parallel publishers share it.
type ptrs struct{ last atomic.Pointer[[]byte] }

func (p *ptrs) of(data []byte) *[]byte {
	if last := p.last.Load(); last != nil && &(*last)[0] == &data[0] {
		return last
	}
	d := data
	p.last.Store(&d)
	return &d
}

func newPtrPipeline(b *testing.B, queues, concurrency int, d *done) pipeline {
	return &ptrPipeline{m: startMQ(b, queues, func(m *tinymq.MQ) error {
		return tinymq.RegisterHandler(m, "bench", tinymq.Fanout, func(_ context.Context, data *[]byte) error {
			d.got(*data)
			return nil
		}, concurrency)
	})}
}

func (p *ptrPipeline) publish(data []byte) {
	if err := p.m.Publish("bench", p.of(data)); err != nil {
		panic(err)
	}
}

func (p *ptrPipeline) close() { p.m.Stop() }

func newMQPipeline(b *testing.B, queues, concurrency int, d *done) pipeline {
	return mqPipeline{startMQ(b, queues, func(m *tinymq.MQ) error {
		return m.RegisterQueue("bench", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			d.got(msg.Data.([]byte))
			return nil
		}, concurrency)
	})}
}

func (p mqPipeline) publish(data []byte) {
	if err := p.m.Publish("bench", data); err != nil {
		panic(err)
	}
}

func (p mqPipeline) close() { p.m.Stop() }

// consumeAll starts concurrency goroutines per queue, each draining that
// queue's channel and counting into d, and returns the channels.
func consumeAll[T any](queues, concurrency int, d *done, wg *sync.WaitGroup) []chan T {
	chans := make([]chan T, queues)
	for i := range chans {
		chans[i] = make(chan T, max(1024, d.backlog))
		for range concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for v := range chans[i] {
					d.got(payload(v))
				}
			}()
		}
	}
	return chans
}

func closeAll[T any](chans []chan T, wg *sync.WaitGroup) {
	for _, ch := range chans {
		close(ch)
	}
	wg.Wait()
}

type chanPipeline struct {
	chans []chan []byte
	wg    sync.WaitGroup
}

func newChanPipeline(_ *testing.B, queues, concurrency int, d *done) pipeline {
	p := &chanPipeline{}
	p.chans = consumeAll[[]byte](queues, concurrency, d, &p.wg)
	return p
}

func (p *chanPipeline) publish(data []byte) {
	for _, ch := range p.chans {
		ch <- data
	}
}

func (p *chanPipeline) close() { closeAll(p.chans, &p.wg) }

// chanPtrPipeline is chanPipeline carrying pointers to the payloads, as
// ptrPipeline publishes them: the channel that the allocation-free form is
// held to (chanPipeline's slots hold the 24-byte slice itself).
type chanPtrPipeline struct {
	chans []chan *[]byte
	wg    sync.WaitGroup
	ptrs
}

func newChanPtrPipeline(_ *testing.B, queues, concurrency int, d *done) pipeline {
	p := &chanPtrPipeline{}
	p.chans = consumeAll[*[]byte](queues, concurrency, d, &p.wg)
	return p
}

func (p *chanPtrPipeline) publish(data []byte) {
	ptr := p.of(data)
	for _, ch := range p.chans {
		ch <- ptr
	}
}

func (p *chanPtrPipeline) close() { closeAll(p.chans, &p.wg) }

// msgChanPipeline is chanPipeline with one allocated message per queue per
// publish, as TinyMQ hands each queue its own Msg: it shows what that
// allocation alone costs a channel.
type msgChanPipeline struct {
	chans []chan *tinymq.Msg
	wg    sync.WaitGroup
}

func newMsgChanPipeline(_ *testing.B, queues, concurrency int, d *done) pipeline {
	p := &msgChanPipeline{}
	p.chans = consumeAll[*tinymq.Msg](queues, concurrency, d, &p.wg)
	return p
}

func (p *msgChanPipeline) publish(data []byte) {
	v := any(data) // boxed once per publish, as Publish's data is
	for _, ch := range p.chans {
		ch <- &tinymq.Msg{Exchange: "bench", Data: v}
	}
}

func (p *msgChanPipeline) close() { closeAll(p.chans, &p.wg) }

var impls = []struct {
	name string
	new  func(b *testing.B, queues, concurrency int, d *done) pipeline
}{
	{"tinymq", newMQPipeline},
	{"handler", newHandlerPipeline},
	{"handlerptr", newPtrPipeline},
	{"chan", newChanPipeline},
	{"chanptr", newChanPtrPipeline},
	{"chanmsg", newMsgChanPipeline},
}

// BenchmarkPublishDeliver measures publish -> consume throughput. ns/op is per
// published message, which each of the queues consumes.
func BenchmarkPublishDeliver(b *testing.B) {
	for _, queues := range []int{1, 4} {
		for _, concurrency := range []int{1, 4} {
			for _, size := range []int{64, 1024} {
				for _, parallel := range []bool{false, true} {
					pubs := "1"
					if parallel {
						pubs = "parallel"
					}
					for _, impl := range impls {
						name := fmt.Sprintf("queues=%d/workers=%d/size=%d/pub=%s/impl=%s", queues, concurrency, size, pubs, impl.name)
						b.Run(name, func(b *testing.B) {
							benchPipeline(b, impl.new, queues, concurrency, size, parallel)
						})
					}
				}
			}
		}
	}
}

// BenchmarkSweep varies one thing at a time from 1 queue, 1 worker, 64-byte
// payloads, with the chan, chanptr and chanmsg floors in every row: fanout
// to 1 to 256 queues, 1, 2 and 4 workers on one queue (more workers must
// never make a trivial consumer slower), and payloads of 64 B, 1 KiB and
// 64 KiB.
//
//	go test -c -o tinymq.test .
//	for i in $(seq 9); do ./tinymq.test -test.run '^$' -test.bench Sweep -test.benchtime 100000x -test.benchmem; done | tee sweep.txt
//	benchstat -col /impl sweep.txt
//
// (A loop rather than -count 9, which runs each row 9 times in a row: on a
// shared machine only rounds that alternate compare.)
func BenchmarkSweep(b *testing.B) {
	type row struct{ queues, workers, size int }
	var rows []row
	for _, q := range []int{1, 4, 16, 64, 256} {
		rows = append(rows, row{q, 1, 64})
	}
	for _, w := range []int{2, 4} {
		rows = append(rows, row{1, w, 64})
	}
	for _, size := range []int{1 << 10, 64 << 10} {
		rows = append(rows, row{1, 1, size})
	}
	for _, r := range rows {
		for _, impl := range impls {
			name := fmt.Sprintf("queues=%d/workers=%d/size=%d/impl=%s", r.queues, r.workers, r.size, impl.name)
			b.Run(name, func(b *testing.B) {
				benchPipeline(b, impl.new, r.queues, r.workers, r.size, false)
			})
		}
	}
}

func benchPipeline(b *testing.B, newPipeline func(*testing.B, int, int, *done) pipeline, queues, concurrency, size int, parallel bool) {
	data := make([]byte, size)
	d := newDone(int64(b.N) * int64(queues))
	p := newPipeline(b, queues, concurrency, d)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p.publish(data)
			}
		})
	} else {
		for range b.N {
			p.publish(data)
		}
	}
	<-d.all
	b.StopTimer()
	p.close()
}

// BenchmarkPublishTopic measures Publish through a topic exchange whose key
// matches one binding among 10 or 10,000: the cost should not grow with
// bindings that cannot match.
func BenchmarkPublishTopic(b *testing.B) {
	for _, bindings := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("bindings=%d", bindings), func(b *testing.B) {
			const queues = 10
			var consumed atomic.Int64
			m := tinymq.New()
			for q := range queues {
				var opts []tinymq.QueueOption
				for k := q; k < bindings; k += queues {
					opts = append(opts, tinymq.WithBindingKey(fmt.Sprintf("device.%d.*", k)))
				}
				opts = append(opts, tinymq.WithBindingKey(fmt.Sprintf("#.alert%d", q)))
				err := m.RegisterQueue("topic", tinymq.Topic, func(context.Context, *tinymq.Msg) error {
					consumed.Add(1)
					return nil
				}, 1, opts...)
				if err != nil {
					b.Fatal(err)
				}
			}
			if err := m.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = fmt.Sprintf("device.%d.temperature", (i*7919)%bindings)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := m.Publish("topic", nil, tinymq.WithRoutingKey(keys[i%len(keys)])); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			m.Stop()
		})
	}
}

// BenchmarkStartStop measures setting up and tearing down an MQ with 4 queues
// of 4 workers, apart from the per-message cost.
func BenchmarkStartStop(b *testing.B) {
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	b.ReportAllocs()
	for range b.N {
		m := tinymq.New()
		for range 4 {
			if err := m.RegisterQueue("ev", tinymq.Fanout, nop, 4); err != nil {
				b.Fatal(err)
			}
		}
		if err := m.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		m.Stop()
	}
}

// BenchmarkStatsPolling runs the 1-queue publish -> deliver workload with and
// without a goroutine calling Stats every millisecond (a thousand times more
// often than a metrics scraper would): the counters are always on, and
// reading them must not slow the hot path.
func BenchmarkStatsPolling(b *testing.B) {
	for _, poll := range []bool{false, true} {
		b.Run(fmt.Sprintf("poll=%v", poll), func(b *testing.B) {
			d := newDone(int64(b.N))
			p := newMQPipeline(b, 1, 1, d).(mqPipeline)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if poll {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-tick.C:
							_ = p.m.Stats()
						case <-stop:
							return
						}
					}
				}()
			}
			data := make([]byte, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				p.publish(data)
			}
			<-d.all
			b.StopTimer()
			close(stop)
			wg.Wait()
			p.close()
		})
	}
}

// BenchmarkStats measures one Stats call on an MQ with 10 exchanges of 2
// queues each.
func BenchmarkStats(b *testing.B) {
	m := tinymq.New()
	nop := func(context.Context, *tinymq.Msg) error { return nil }
	for i := range 20 {
		if err := m.RegisterQueue(fmt.Sprintf("ex%d", i/2), tinymq.Fanout, nop, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for range b.N {
		_ = m.Stats()
	}
	b.StopTimer()
	m.Stop()
}

// BenchmarkQueuedMemory publishes b.N messages, each its own 100-byte
// buffer, to 1 or 4 fanout queues whose consumers are held until every
// message is queued, and reports the heap each published message holds
// while queued (B/msg, payload included) and what is left per message once
// the queues have drained and the garbage is collected (kept-B/msg). ns/op is
// the time to publish one into the backlog. Run it with a million:
//
//	go test -run '^$' -bench QueuedMemory -benchtime 1000000x -count 5 . | tee mem.txt
//	benchstat -col /impl mem.txt
func BenchmarkQueuedMemory(b *testing.B) {
	for _, queues := range []int{1, 4} {
		for _, impl := range impls {
			b.Run(fmt.Sprintf("queues=%d/impl=%s", queues, impl.name), func(b *testing.B) {
				queued, kept := queuedMemory(b, impl.new, queues, b.N)
				b.ReportMetric(queued, "B/msg")
				b.ReportMetric(kept, "kept-B/msg")
			})
		}
	}
}

func queuedMemory(b *testing.B, newPipeline func(*testing.B, int, int, *done) pipeline, queues, n int) (queued, kept float64) {
	b.StopTimer()
	runtime.GC()
	before := heapAlloc()
	d := newDone(int64(n) * int64(queues))
	d.gate = make(chan struct{})
	d.backlog = n
	p := newPipeline(b, queues, 1, d)
	b.StartTimer()
	for range n {
		p.publish(make([]byte, 100))
	}
	b.StopTimer()
	runtime.GC()
	queued = float64(heapAlloc()-before) / float64(n)
	close(d.gate)
	<-d.all
	p.close()
	runtime.GC() // the drained chunks go from the queues' pool to its victim cache,
	runtime.GC() // and from there to the collector
	kept = float64(heapAlloc()-before) / float64(n)
	b.StartTimer()
	return queued, kept
}

func heapAlloc() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// latencyBase is the origin of the send times that latency payloads carry.
var latencyBase = time.Now()

// BenchmarkLatency publishes at a steady 20,000 messages per second to one
// queue with one worker, each message carrying its send time, and reports
// the median and 99th percentile of publish -> consume latency over b.N
// messages. Tail latency on a shared machine swings 1x-3x from run to run:
// judge it over 9 or more runs.
//
//	go test -c -o tinymq.test .
//	for i in $(seq 9); do ./tinymq.test -test.run '^$' -test.bench Latency -test.benchtime 10000x; done | tee lat.txt
//	benchstat -col /impl lat.txt
func BenchmarkLatency(b *testing.B) {
	const rate = 20_000
	for _, impl := range impls {
		b.Run("rate=20k/impl="+impl.name, func(b *testing.B) {
			d := newDone(int64(b.N))
			d.lat = make([]time.Duration, b.N)
			p := newPipeline(b, impl.new, d)
			interval := time.Second / rate
			start := time.Since(latencyBase)
			b.ResetTimer()
			for i := range b.N {
				target := start + time.Duration(i)*interval
				for {
					now := time.Since(latencyBase)
					if now >= target {
						break
					}
					if target-now > 200*time.Microsecond {
						time.Sleep(target - now - 100*time.Microsecond)
					} else {
						runtime.Gosched()
					}
				}
				data := make([]byte, 64)
				binary.LittleEndian.PutUint64(data, uint64(time.Since(latencyBase)))
				p.publish(data)
			}
			<-d.all
			b.StopTimer()
			p.close()
			slices.Sort(d.lat)
			at := func(q float64) float64 {
				return float64(d.lat[min(len(d.lat)-1, int(q*float64(len(d.lat))))]) / float64(time.Microsecond)
			}
			b.ReportMetric(at(0.50), "p50-µs")
			b.ReportMetric(at(0.99), "p99-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func newPipeline(b *testing.B, newP func(*testing.B, int, int, *done) pipeline, d *done) pipeline {
	return newP(b, 1, 1, d)
}
