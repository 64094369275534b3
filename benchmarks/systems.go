// Package benchmarks runs identical workloads against TinyMQ, plain Go
// channels (the floor) and in-process peers: watermill's GoChannel,
// asaskevich/EventBus (async) and core NATS with an embedded server on
// 127.0.0.1. It is a module of its own so that the core stays free of
// dependencies.
package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	eventbus "github.com/asaskevich/EventBus"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tinymq/tinymq"
)

// Handler receives one delivery: which subscriber got it, and the payload.
type Handler func(sub int, payload []byte)

// Pipeline is a running system with subscribers attached.
type Pipeline interface {
	// Publish sends payload to the subject every subscriber listens on.
	Publish(payload []byte) error
	// Close releases the system; call it once every delivery has arrived.
	Close()
}

// KeyedPipeline also publishes with a routing key (topic workloads).
type KeyedPipeline interface {
	Pipeline
	PublishKey(key string, payload []byte) error
}

// System is one message-passing implementation under test.
type System struct {
	Name string
	// Note says how the system behaves under load, for the table.
	Note string
	// Fanout starts subs subscribers that each receive every message. buffer
	// is a capacity hint for systems with bounded buffers (the plain channel).
	Fanout func(subs, buffer int, h Handler) (Pipeline, error)
	// Topic, if the system routes by pattern, binds one subscriber per pattern
	// "device.<i>.*" for i < bindings; h gets the binding's index.
	Topic func(bindings int, h Handler) (KeyedPipeline, error)
}

// Systems lists every system, the floor first.
func Systems() []System {
	return []System{
		{Name: "chan", Note: "floor: buffered channels of []byte; Publish blocks when a buffer is full", Fanout: chanFanout, Topic: chanTopic},
		{Name: "tinymq", Note: "unbounded queues: never blocks, never drops", Fanout: tinymqFanout(registerMsg), Topic: tinymqTopic(registerMsg)},
		{Name: "tinymq-handler", Note: "RegisterHandler: deliveries allocate no Msg", Fanout: tinymqFanout(registerHandler), Topic: tinymqTopic(registerHandler)},
		{Name: "tinymq-ptr", Note: "RegisterHandler of a pointer payload, published as that pointer: nothing is boxed or allocated per message", Fanout: tinymqPtrFanout, Topic: tinymqPtrTopic},
		{Name: "watermill", Note: "GoChannel, OutputChannelBuffer 1024: two goroutines per message until acked", Fanout: watermillFanout},
		{Name: "eventbus", Note: "SubscribeAsync, not transactional: one goroutine per message and subscriber, handlers run concurrently and out of order (transactional mode makes Publish wait for the previous handler call)", Fanout: eventbusFanout},
		{Name: "nats", Note: "core NATS on 127.0.0.1, pending limits lifted (by default a slow subscriber drops past 64k messages)", Fanout: natsFanout, Topic: natsTopic},
	}
}

// --- plain channels -------------------------------------------------------

type chanPipeline struct {
	chans []chan []byte
	wg    sync.WaitGroup
}

func chanFanout(subs, buffer int, h Handler) (Pipeline, error) {
	p := &chanPipeline{}
	p.start(subs, max(buffer, 1024), h)
	return p, nil
}

// start adds n subscribers, each draining its own channel into h.
func (p *chanPipeline) start(n, buffer int, h Handler) {
	for i := range n {
		ch := make(chan []byte, buffer)
		p.chans = append(p.chans, ch)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for b := range ch {
				h(i, b)
			}
		}()
	}
}

func (p *chanPipeline) Publish(b []byte) error {
	for _, ch := range p.chans {
		ch <- b
	}
	return nil
}

func (p *chanPipeline) Close() {
	for _, ch := range p.chans {
		close(ch)
	}
	p.wg.Wait()
}

// chanTopic is the hand-written floor for keyed routing: exact keys in a map,
// one channel each (it cannot do wildcards).
type chanTopicPipeline struct {
	chanPipeline
	byKey map[string]chan []byte
}

func chanTopic(bindings int, h Handler) (KeyedPipeline, error) {
	p := &chanTopicPipeline{byKey: make(map[string]chan []byte, bindings)}
	p.start(bindings, 1024, h)
	for i, ch := range p.chans {
		p.byKey["device."+strconv.Itoa(i)+".temperature"] = ch
	}
	return p, nil
}

func (p *chanTopicPipeline) PublishKey(key string, b []byte) error {
	ch, ok := p.byKey[key]
	if !ok {
		return fmt.Errorf("no route for %q", key)
	}
	ch <- b
	return nil
}

// --- TinyMQ ---------------------------------------------------------------

type tinymqPipeline struct{ m *tinymq.MQ }

// tinymqRegister registers subscriber i's queue on the exchange "bench" with
// one worker; the "tinymq" and "tinymq-handler" systems differ only in it.
type tinymqRegister func(m *tinymq.MQ, kind tinymq.ExchangeType, i int, h Handler, opts ...tinymq.QueueOption) error

// registerMsg consumes with a ConsumerFunc, which gets a new *Msg per delivery.
func registerMsg(m *tinymq.MQ, kind tinymq.ExchangeType, i int, h Handler, opts ...tinymq.QueueOption) error {
	return m.RegisterQueue("bench", kind, func(_ context.Context, msg *tinymq.Msg) error {
		h(i, msg.Data.([]byte))
		return nil
	}, 1, opts...)
}

// registerHandler consumes with RegisterHandler[[]byte], which allocates no
// Msg per delivery.
func registerHandler(m *tinymq.MQ, kind tinymq.ExchangeType, i int, h Handler, opts ...tinymq.QueueOption) error {
	return tinymq.RegisterHandler(m, "bench", kind, func(_ context.Context, b []byte) error {
		h(i, b)
		return nil
	}, 1, opts...)
}

func tinymqFanout(register tinymqRegister) func(subs, buffer int, h Handler) (Pipeline, error) {
	return func(subs, _ int, h Handler) (Pipeline, error) {
		m := tinymq.New()
		for i := range subs {
			if err := register(m, tinymq.Fanout, i, h); err != nil {
				return nil, err
			}
		}
		return tinymqPipeline{m}, m.Start(context.Background())
	}
}

func tinymqTopic(register tinymqRegister) func(bindings int, h Handler) (KeyedPipeline, error) {
	return func(bindings int, h Handler) (KeyedPipeline, error) {
		m := tinymq.New()
		for i := range bindings {
			if err := register(m, tinymq.Topic, i, h, tinymq.WithBindingKey("device."+strconv.Itoa(i)+".*")); err != nil {
				return nil, err
			}
		}
		return tinymqPipeline{m}, m.Start(context.Background())
	}
}

func (p tinymqPipeline) Publish(b []byte) error { return p.m.Publish("bench", b) }

func (p tinymqPipeline) PublishKey(key string, b []byte) error {
	return p.m.Publish("bench", b, tinymq.WithRoutingKey(key))
}

func (p tinymqPipeline) Close() { p.m.Stop() }

// The allocation-free form: RegisterHandler[*[]byte] and a Publish of the
// pointer, which Publish does not box. The workloads reuse one payload, or
// make one per message: a pipeline reuses the pointer of the last payload
// for the same bytes, and allocates one for new ones (as an application
// allocates the event it publishes).
type tinymqPtrPipeline struct {
	tinymqPipeline
	last atomic.Pointer[[]byte]
}

// registerPtr consumes with RegisterHandler[*[]byte].
func registerPtr(m *tinymq.MQ, kind tinymq.ExchangeType, i int, h Handler, opts ...tinymq.QueueOption) error {
	return tinymq.RegisterHandler(m, "bench", kind, func(_ context.Context, b *[]byte) error {
		h(i, *b)
		return nil
	}, 1, opts...)
}

func tinymqPtrFanout(subs, buffer int, h Handler) (Pipeline, error) {
	p, err := tinymqFanout(registerPtr)(subs, buffer, h)
	if err != nil {
		return nil, err
	}
	return &tinymqPtrPipeline{tinymqPipeline: p.(tinymqPipeline)}, nil
}

func tinymqPtrTopic(bindings int, h Handler) (KeyedPipeline, error) {
	p, err := tinymqTopic(registerPtr)(bindings, h)
	if err != nil {
		return nil, err
	}
	return &tinymqPtrPipeline{tinymqPipeline: p.(tinymqPipeline)}, nil
}

// ptr returns a pointer to b's bytes: the last one when it points to them.
func (p *tinymqPtrPipeline) ptr(b []byte) *[]byte {
	if last := p.last.Load(); last != nil && len(*last) == len(b) && (len(b) == 0 || &(*last)[0] == &b[0]) {
		return last
	}
	d := b
	p.last.Store(&d)
	return &d
}

func (p *tinymqPtrPipeline) Publish(b []byte) error { return p.m.Publish("bench", p.ptr(b)) }

func (p *tinymqPtrPipeline) PublishKey(key string, b []byte) error {
	return p.m.Publish("bench", p.ptr(b), tinymq.WithRoutingKey(key))
}

// --- watermill GoChannel ----------------------------------------------------

type watermillPipeline struct {
	ps     *gochannel.GoChannel
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func watermillFanout(subs, _ int, h Handler) (Pipeline, error) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
	ctx, cancel := context.WithCancel(context.Background())
	p := &watermillPipeline{ps: ps, cancel: cancel}
	for i := range subs {
		msgs, err := ps.Subscribe(ctx, "bench")
		if err != nil {
			cancel()
			return nil, err
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for msg := range msgs {
				h(i, msg.Payload)
				msg.Ack()
			}
		}()
	}
	return p, nil
}

func (p *watermillPipeline) Publish(b []byte) error {
	return p.ps.Publish("bench", message.NewMessage(watermill.NewUUID(), b))
}

func (p *watermillPipeline) Close() {
	p.cancel()
	_ = p.ps.Close()
	p.wg.Wait()
}

// --- EventBus ---------------------------------------------------------------

type eventbusPipeline struct{ bus eventbus.Bus }

func eventbusFanout(subs, _ int, h Handler) (Pipeline, error) {
	bus := eventbus.New()
	for i := range subs {
		// Not transactional, as usually used: transactional mode makes Publish
		// itself wait until the previous call of the handler has returned.
		if err := bus.SubscribeAsync("bench", func(b []byte) { h(i, b) }, false); err != nil {
			return nil, err
		}
	}
	return eventbusPipeline{bus}, nil
}

func (p eventbusPipeline) Publish(b []byte) error {
	p.bus.Publish("bench", b)
	return nil
}

func (p eventbusPipeline) Close() { p.bus.WaitAsync() }

// --- NATS -----------------------------------------------------------------

type natsPipeline struct {
	srv      *natsserver.Server
	pub, sub *nats.Conn
}

func startNATS() (*natsPipeline, error) {
	srv, err := natsserver.NewServer(&natsserver.Options{
		Host:           "127.0.0.1",
		Port:           natsserver.RANDOM_PORT,
		NoLog:          true,
		NoSigs:         true,
		MaxPending:     1 << 30, // the subscriber may lag a million messages behind
		WriteDeadline:  time.Minute,
		MaxControlLine: 4096,
	})
	if err != nil {
		return nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("nats-server did not start")
	}
	p := &natsPipeline{srv: srv}
	if p.pub, err = nats.Connect(srv.ClientURL()); err == nil {
		p.sub, err = nats.Connect(srv.ClientURL())
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func natsFanout(subs, _ int, h Handler) (Pipeline, error) {
	p, err := startNATS()
	if err != nil {
		return nil, err
	}
	for i := range subs {
		if err := p.subscribe("bench", i, h); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, p.sub.Flush()
}

func natsTopic(bindings int, h Handler) (KeyedPipeline, error) {
	p, err := startNATS()
	if err != nil {
		return nil, err
	}
	for i := range bindings {
		if err := p.subscribe("device."+strconv.Itoa(i)+".*", i, h); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, p.sub.Flush()
}

func (p *natsPipeline) subscribe(subject string, i int, h Handler) error {
	s, err := p.sub.Subscribe(subject, func(m *nats.Msg) { h(i, m.Data) })
	if err != nil {
		return err
	}
	return s.SetPendingLimits(-1, -1)
}

func (p *natsPipeline) Publish(b []byte) error { return p.pub.Publish("bench", b) }

func (p *natsPipeline) PublishKey(key string, b []byte) error { return p.pub.Publish(key, b) }

func (p *natsPipeline) Close() {
	if p.pub != nil {
		_ = p.pub.Flush()
		p.pub.Close()
	}
	if p.sub != nil {
		p.sub.Close()
	}
	p.srv.Shutdown()
	p.srv.WaitForShutdown()
}
