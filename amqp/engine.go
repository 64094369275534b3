package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/guard"
)

// Engine returns the option that makes a [tinymq.MQ] run on the RabbitMQ
// broker at url (as "amqp://user:password@host:5672/vhost"):
//
//	mq := tinymq.New(amqp.Engine("amqp://guest:guest@localhost:5672/"))
//
// Engine does no I/O. The MQ connects lazily, at its first RegisterQueue,
// DeclareExchange, Bind, Publish or Start, and never blocks in New; its
// declarations and publishes then block for the broker, at most the publish
// timeout ([WithPublishTimeout]). After Stop the MQ refuses everything with
// [tinymq.ErrStopped] and the engine holds no connection. A bad URL or option
// does not panic: every call of the MQ then returns an error wrapping
// [tinymq.ErrInvalidOption]. Use one Engine option for one MQ. See the
// package documentation for what changes on a broker.
func Engine(url string, opts ...Option) tinymq.Option {
	e := &engine{
		url:       url,
		cfg:       defaultConfig(),
		ids:       newIDSource(),
		steps:     baseSteps(),
		exchanges: make(map[string]*exchangeState),
		delays:    make(map[string]bool),
		changed:   make(chan struct{}),
		quit:      make(chan struct{}),
		stop:      make(chan struct{}),
		abort:     make(chan struct{}),
		done:      make(chan struct{}),
		log:       slog.New(slog.DiscardHandler),
		codec:     tinymq.JSONCodec{},
	}
	if _, err := amqp091.ParseURI(url); err != nil {
		e.cfgErr = fmt.Errorf("%w: amqp.Engine: URL: %w", tinymq.ErrInvalidOption, err)
	}
	for _, o := range opts {
		if e.cfgErr != nil {
			break
		}
		if o == nil {
			e.cfgErr = fmt.Errorf("%w: amqp.Engine: nil Option", tinymq.ErrInvalidOption)
			break
		}
		e.cfgErr = o.apply(&e.cfg)
	}
	return tinymq.WithEngine(e)
}

// engine implements [tinymq.Engine] on RabbitMQ.
//
// Goroutines, each with its owner and its join:
//   - the supervisor (supervise): started by ensureRunning on first use,
//     joined by finish after quit is closed (supWG);
//   - one confirm loop per publishing channel (pubSession.loop): started by
//     openPub, joined by the supervisor, which waits for its closed channel;
//   - one manager per queue (cqueue.run): started by startQueue once the
//     engine is started, joined by finish (mgrWG);
//   - each queue's workers (cqueue.work): started by its manager, joined by
//     the manager and by finish (wrkWG);
//   - finish: started by the first Shutdown, joined by every Shutdown, which
//     waits for done;
//   - guards (own.Guard): one per log line and per consumer panic whose
//     value is asked for its text, started and joined by the goroutine that
//     logs or recovered the panic, which waits for it.
//
// Lock order: declMu, then topoMu, then mu, then a cqueue's mu. No lock is
// held while user code runs; only declMu is held across network calls.
type engine struct {
	url    string
	cfg    config
	cfgErr error // an invalid URL or option: every call returns it
	ids    *idSource

	// Set by Init, before any other call; read-only afterwards.
	log   *slog.Logger
	codec tinymq.Codec

	// declMu makes declarations one at a time.
	declMu sync.Mutex

	// topoMu guards the topology: every declaration made, in order, which
	// each new connection makes again; the connection generation it was last
	// made on; the exchanges' kinds and counters; the delay queues declared.
	topoMu    sync.RWMutex
	steps     []step
	gen       uint64
	exchanges map[string]*exchangeState
	delays    map[string]bool

	// mu guards the connection state and the lifecycle. Never held across a
	// network call or user code.
	mu       sync.Mutex
	pub      *pubSession         // nil while disconnected
	pubConn  *amqp091.Connection // nil while disconnected
	connGen  uint64              // pubConn's generation
	sub      *amqp091.Connection // the consuming connection; nil while disconnected
	subLost  chan struct{}       // closed when sub is lost
	changed  chan struct{}       // closed and replaced whenever the above change
	lastErr  error               // why the last connection ended or failed
	running  bool                // the supervisor was started
	started  bool                // Start was called
	closing  bool                // Shutdown began
	queues   []*cqueue
	queueCtx context.Context // the consumers' context, from Start
	cancel   context.CancelFunc

	quit  chan struct{} // closed by finish: the supervisor closes the connections and returns
	stop  chan struct{} // closed when Shutdown begins: managers cancel their consumers
	abort chan struct{} // closed when a Shutdown deadline passed
	done  chan struct{} // closed when everything has stopped

	shutOnce, abortOnce sync.Once
	supWG, mgrWG, wrkWG sync.WaitGroup

	// own holds the goroutines that run user code (consumers, the logger),
	// so that a Stop they call does not wait for themselves.
	own guard.Owned
}

type exchangeState struct {
	kind                  string
	published, unroutable atomic.Uint64
}

var _ tinymq.Engine = (*engine)(nil)

// Init takes the MQ's logger and codec. It does no I/O.
func (e *engine) Init(cfg tinymq.EngineConfig) {
	if cfg.Logger != nil {
		e.log = cfg.Logger
	}
	if cfg.Codec != nil {
		e.codec = cfg.Codec
	}
}

// DeclareExchange declares a durable exchange of the spec's type, with its
// alternate exchange as the alternate-exchange argument.
func (e *engine) DeclareExchange(spec tinymq.ExchangeSpec) error {
	if e.cfgErr != nil {
		return e.cfgErr
	}
	if reserved(spec.Name) || reserved(spec.Alternate) {
		return fmt.Errorf("%w: exchange name %q: names tinymq.wait, tinymq.requeue, tinymq.retry.* and tinymq.delay.* are the engine's", tinymq.ErrUnsupported, spec.Name)
	}
	return e.declare([]step{exchangeStep(spec.Name, spec.Kind, spec.Alternate)})
}

// DeclareQueue declares the queue's exchange (when this MQ has not), a
// durable queue with the spec's arguments, its retry wait queues, and its
// bindings; the consumer starts with Start.
func (e *engine) DeclareQueue(spec tinymq.QueueSpec) error {
	if e.cfgErr != nil {
		return e.cfgErr
	}
	switch {
	case !spec.Named:
		return fmt.Errorf("%w: a queue without tinymq.WithQueueName (%q): on a broker a queue is shared by every process that consumes it, so it needs a name they agree on",
			tinymq.ErrUnsupported, spec.Name)
	case reserved(spec.Name) || reserved(spec.Binding.Exchange) || reserved(spec.DeadLetterExchange):
		return fmt.Errorf("%w: queue %q: names tinymq.wait, tinymq.requeue, tinymq.retry.* and tinymq.delay.* are the engine's", tinymq.ErrUnsupported, spec.Name)
	case spec.Filter != nil:
		return fmt.Errorf("%w: tinymq.WithFilter on queue %q (the broker routes; bind with keys or headers instead)", tinymq.ErrUnsupported, spec.Name)
	case spec.Overflow == tinymq.Block:
		return fmt.Errorf("%w: tinymq.WithMaxLen(n, tinymq.Block) on queue %q (a broker cannot make a publisher wait for room; use RejectPublish and retry)", tinymq.ErrUnsupported, spec.Name)
	}
	prefetch := spec.Concurrency
	if e.cfg.prefetch > 0 {
		if spec.Concurrency > e.cfg.prefetch {
			return fmt.Errorf("%w: queue %q: concurrency %d above amqp.WithPrefetch(%d) leaves workers idle",
				tinymq.ErrInvalidOption, spec.Name, spec.Concurrency, e.cfg.prefetch)
		}
		prefetch = e.cfg.prefetch
	}
	q := newQueue(e, spec, prefetch)

	var steps []step
	e.topoMu.RLock()
	known := e.exchanges[spec.Binding.Exchange] != nil
	e.topoMu.RUnlock()
	if !known {
		steps = append(steps, exchangeStep(spec.Binding.Exchange, spec.Binding.Kind, ""))
	}
	args := amqp091.Table{}
	if spec.DeadLetterExchange != "" {
		args["x-dead-letter-exchange"] = spec.DeadLetterExchange
		if spec.DeadLetterKey != "" {
			args["x-dead-letter-routing-key"] = spec.DeadLetterKey
		}
	}
	if spec.MessageTTL > 0 {
		args["x-message-ttl"] = millis(spec.MessageTTL)
	}
	if spec.MaxLen > 0 {
		args["x-max-length"] = int64(spec.MaxLen)
		args["x-overflow"] = "drop-head"
		if spec.Overflow == tinymq.RejectPublish {
			args["x-overflow"] = "reject-publish"
		}
	}
	steps = append(steps, step{kind: stepQueue, name: spec.Name, args: args})
	for i, w := range q.waitQs {
		steps = append(steps,
			step{kind: stepQueue, name: w, args: amqp091.Table{
				"x-message-ttl":          q.waits[i],
				"x-dead-letter-exchange": requeueExchange,
			}},
			step{kind: stepBind, name: w, exchange: waitExchange, args: amqp091.Table{"x-match": "all", hdrWait: w}})
	}
	if len(q.waitQs) > 0 {
		steps = append(steps, step{kind: stepBind, name: spec.Name, exchange: requeueExchange,
			args: amqp091.Table{"x-match": "all", hdrQueue: spec.Name}})
	}
	binds, err := bindingSteps(spec.Binding)
	if err != nil {
		return err
	}
	if err := e.declare(append(steps, binds...)); err != nil {
		return err
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	e.queues = append(e.queues, q)
	if e.started && !e.closing {
		e.startQueueLocked(q)
	}
	return nil
}

// Bind binds an existing queue to another exchange, declaring the exchange
// when this MQ has not.
func (e *engine) Bind(spec tinymq.BindingSpec) error {
	if e.cfgErr != nil {
		return e.cfgErr
	}
	if reserved(spec.Exchange) {
		return fmt.Errorf("%w: exchange name %q is the engine's", tinymq.ErrUnsupported, spec.Exchange)
	}
	var steps []step
	e.topoMu.RLock()
	known := e.exchanges[spec.Exchange] != nil
	e.topoMu.RUnlock()
	if !known {
		steps = append(steps, exchangeStep(spec.Exchange, spec.Kind, ""))
	}
	binds, err := bindingSteps(spec)
	if err != nil {
		return err
	}
	return e.declare(append(steps, binds...))
}

// Start starts every queue's consumer; it does not block. Consumers' contexts
// derive from ctx.
func (e *engine) Start(ctx context.Context) error {
	if e.cfgErr != nil {
		return e.cfgErr
	}
	e.ensureRunning()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started || e.closing {
		return nil // the MQ's state machine makes this unreachable
	}
	e.started = true
	e.queueCtx, e.cancel = context.WithCancel(ctx)
	for _, q := range e.queues {
		e.startQueueLocked(q)
	}
	return nil
}

// startQueueLocked starts q's manager. The caller holds mu.
func (e *engine) startQueueLocked(q *cqueue) {
	e.mgrWG.Add(1)
	go q.run(e.queueCtx)
}

// Shutdown stops consuming, waits for the messages in consumers, and closes
// the connections; see [tinymq.Engine].
func (e *engine) Shutdown(ctx context.Context) error {
	e.shutOnce.Do(func() {
		e.mu.Lock()
		e.closing = true
		e.mu.Unlock()
		close(e.stop)
		go e.finish() // joined by every Shutdown through done
	})
	if e.own.Mine() {
		return tinymq.ErrCalledFromConsumer
	}
	select {
	case <-e.done:
		return nil
	default:
	}
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
	}
	e.abortOnce.Do(func() {
		close(e.abort)
		e.cancelConsumers()
	})
	n := int64(0)
	e.mu.Lock()
	for _, q := range e.queues {
		n += q.inFlight.Load()
	}
	e.mu.Unlock()
	if n == 0 {
		// No consumer was cut short: what is left is closing the
		// connections, which takes milliseconds, unless something hangs (a
		// log handler that blocks): then keep the deadline, roughly.
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-e.done:
			return nil
		case <-t.C:
			return fmt.Errorf("tinymq/amqp: shutdown deadline passed before the engine closed its connections (no message was in a consumer; the broker keeps the rest): %w", ctx.Err())
		}
	}
	return fmt.Errorf("tinymq/amqp: shutdown deadline passed with %d messages in consumers; they stay unacknowledged and the broker delivers them again: %w",
		n, ctx.Err())
}

// finish stops everything in order: the consumers (which finish what they
// are in), then the connections, then waits for every goroutine.
func (e *engine) finish() {
	e.mgrWG.Wait()
	close(e.quit)
	e.supWG.Wait()
	e.wrkWG.Wait()
	e.cancelConsumers()
	close(e.done)
}

func (e *engine) cancelConsumers() {
	e.mu.Lock()
	cancel := e.cancel
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// redeclareAll declares the whole topology again on conn, after the broker
// cancelled a consumer (its queue was deleted).
func (e *engine) redeclareAll(conn *amqp091.Connection) {
	e.topoMu.RLock()
	steps := append([]step(nil), e.steps...)
	e.topoMu.RUnlock()
	if err := e.redeclare(conn, steps); err != nil {
		e.logWarn("tinymq/amqp: re-declaring the topology failed", "err", err.Error())
	}
}

// logAttrs logs msg at level with attrs. The logger is user code (its
// handler), so it runs through own.Guard, as the core's does: a panic in it is
// recovered and forgotten, a runtime.Goexit ends only the guard's goroutine,
// never a worker or the supervisor, and a logger that calls Stop does not
// wait for itself. The caller holds no lock. A logger that discards costs
// nothing; otherwise a line costs a goroutine (about a microsecond), and
// lines are written only on failures and reconnects.
func (e *engine) logAttrs(level slog.Level, msg string, attrs ...slog.Attr) {
	if e.log.Handler() == slog.DiscardHandler {
		return
	}
	e.own.Guard(func() {
		ctx := context.Background()
		if e.log.Enabled(ctx, level) {
			e.log.LogAttrs(ctx, level, msg, attrs...)
		}
	})
}

// logKV is logAttrs with alternating keys and values, as slog.Logger.Log
// takes them.
func (e *engine) logKV(level slog.Level, msg string, kv ...any) {
	if e.log.Handler() == slog.DiscardHandler {
		return
	}
	e.own.Guard(func() { e.log.Log(context.Background(), level, msg, kv...) })
}

func (e *engine) logInfo(msg string, kv ...any)  { e.logKV(slog.LevelInfo, msg, kv...) }
func (e *engine) logWarn(msg string, kv ...any)  { e.logKV(slog.LevelWarn, msg, kv...) }
func (e *engine) logError(msg string, kv ...any) { e.logKV(slog.LevelError, msg, kv...) }
