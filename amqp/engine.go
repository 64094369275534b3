package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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
// Engine does no I/O. The MQ connects lazily, at its first declaration,
// publish, topology change (DeleteQueue, PurgeQueue, Unbind, DeleteExchange)
// or Start, and never blocks in New; its declarations, topology changes and
// publishes then block for the broker, at most the publish timeout
// ([WithPublishTimeout]). After Stop the MQ refuses everything with
// [tinymq.ErrStopped] and the engine holds no connection. A bad URL or option
// does not panic: every call of the MQ then returns an error wrapping
// [tinymq.ErrInvalidOption]. Use one Engine option for one MQ: given to a
// second tinymq.New, it makes every call of both MQs fail with an error
// wrapping [tinymq.ErrInvalidOption] that says so. See the package
// documentation for what changes on a broker.
func Engine(url string, opts ...Option) tinymq.Option {
	return tinymq.WithEngine(newEngine(url, opts...))
}

// newEngine is the engine that Engine hands the MQ.
func newEngine(url string, opts ...Option) *engine {
	e := &engine{
		url:       url,
		cfg:       defaultConfig(),
		ids:       newIDSource(),
		steps:     baseSteps(),
		exchanges: make(map[string]*exchangeState),
		delays:    make(map[string]string),
		byName:    make(map[string]*cqueue),
		changed:   make(chan struct{}),
		pubs:      newFlight(),
		draining:  make(chan struct{}),
		quit:      make(chan struct{}),
		stop:      make(chan struct{}),
		abort:     make(chan struct{}),
		done:      make(chan struct{}),
		logWake:   make(chan struct{}, 1),
		logStop:   make(chan struct{}),
		log:       slog.New(slog.DiscardHandler),
		codec:     tinymq.JSONCodec{},
	}
	e.maxSize.Store(maxBrokerSize)
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
	return e
}

// engine implements [tinymq.Engine] on RabbitMQ.
//
// Goroutines, each with its owner and its join:
//   - the supervisor (supervise): started by ensureRunning on first use,
//     joined by finish after quit is closed (supWG);
//   - one confirm loop per publishing channel (pubSession.loop): started by
//     openPub, joined by the supervisor, which waits for its closed channel;
//   - one manager per subscription (subscription.run: RegisterQueue's
//     consumer, or a Consume): started by startSubLocked once the engine is
//     started, joined by finish (mgrWG); a Cancel, or the delete or expiry
//     of its queue, ends it early;
//   - each subscription's workers (subscription.work): started by its
//     manager, joined by the manager and by finish (wrkWG);
//   - the log loop (logLoop): started by the first logLater, joined by
//     finish (logWG); it logs the lines of calls that the MQ makes holding
//     its own lock (DeleteQueue, DeleteExchange, Unbind, ...), since the
//     logger is user code that may call the MQ back;
//   - finish: started by the first Shutdown, joined by every Shutdown, which
//     waits for done;
//   - callBounded's call: one per channel call of a subscription's manager
//     (open, qos, consume, cancel, close), started and joined by the manager,
//     which closes the consuming connection to end it if the broker holds
//     back its reply;
//   - guards (own.Guard): one per log line and per consumer panic whose
//     value is asked for its text, started and joined by the goroutine that
//     logs or recovered the panic, which waits for it.
//
// Lock order: declMu, then topoMu, then mu, then a cqueue's mu; a
// pubSession's mu and pubs' mu are leaves, taken with no other held (the
// confirm loop holds its session's mu only to settle). No lock is held while
// user code runs; only declMu is held across network calls (the
// supervisor never takes it, since a declaration holding it may be waiting
// for the supervisor's connection; Stats and managers only try it).
type engine struct {
	url    string
	cfg    config
	cursor nodeCursor // the next node to try (the supervisor's)
	// nackReset is when a nack last replaced the publishing channel
	// (UnixNano; see afterNack).
	nackReset atomic.Int64
	forget    func(queue string) // the MQ's EngineConfig.Forget, or nil
	cfgErr    error              // an invalid URL or option: every call returns it
	ids       *idSource
	inits     atomic.Int32 // calls of Init: more than one is a second MQ on this engine

	// maxSize is the largest body the broker takes, as far as the engine
	// knows: RabbitMQ's ceiling, lowered to the broker's max_message_size when
	// it refuses a message (see pubSession.culpritLocked).
	maxSize atomic.Int64
	// pubs counts the Publishes under way (see Shutdown).
	pubs *flight

	// Set by Init, before any other call; read-only afterwards.
	log   *slog.Logger
	codec tinymq.Codec

	// declMu makes declarations and every other change of the topology
	// (deletes, unbinds, expiries) one at a time: nothing else changes steps
	// while it is held.
	declMu sync.Mutex

	// topoMu guards the topology: every declaration made, in order, which
	// each new connection makes again (less what was deleted or unbound
	// since); the connection generation it was last made on; the exchanges'
	// kinds and counters; the delay queues declared, with their exchanges.
	topoMu    sync.RWMutex
	steps     []step
	gen       uint64
	exchanges map[string]*exchangeState
	delays    map[string]string

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
	blocked  string              // the broker's connection.blocked reason, or ""
	running  bool                // the supervisor was started
	started  bool                // Start was called
	closing  bool                // Shutdown began
	queues   []*cqueue           // in declaration order
	byName   map[string]*cqueue
	queueCtx context.Context // the consumers' context, from Start
	cancel   context.CancelFunc

	// Also under mu: the queues deleted or expired, whose deliveries in
	// flight may still count, and the counts of those that settled.
	deleted                      []*cqueue
	deletedSum                   tinymq.QueueStats
	deletedQueues, expiredQueues uint64

	// draining is closed by finish once the consumers have finished: publishes
	// waiting for a connection, or to be sent again, give up.
	draining chan struct{}
	quit     chan struct{} // closed by finish: the supervisor closes the connections and returns
	stop     chan struct{} // closed when Shutdown begins: managers cancel their consumers
	abort    chan struct{} // closed when a Shutdown deadline passed
	done     chan struct{} // closed when everything has stopped

	// Also under mu: the lines logLater handed to the log loop.
	logQ       []logLine
	logStarted bool
	logClosed  bool          // finish has joined the log loop: logLater logs itself
	logWake    chan struct{} // a nudge for the log loop, buffered 1
	logStop    chan struct{} // closed by finish: the log loop drains and returns

	shutOnce, abortOnce        sync.Once
	supWG, mgrWG, wrkWG, logWG sync.WaitGroup

	// own holds the goroutines that run user code (consumers, the logger),
	// so that a Stop they call does not wait for themselves.
	own guard.Owned
	// workers holds the subscriptions' workers, a part of own: a Cancel
	// from one of them waits for the broker to stop delivering (see
	// subscription.Cancel), which a manager calling back through the
	// logger could not.
	workers guard.Owned

	// helpers records the helper queues declared, for their lease (wait.go).
	helpers helpers
}

type exchangeState struct {
	kind                  string
	published, unroutable atomic.Uint64
}

var _ tinymq.Engine = (*engine)(nil)

// errReused is what every call returns once a second MQ was made with the
// same Engine option.
var errReused = fmt.Errorf("%w: amqp.Engine: the option was given to a second tinymq.New; an engine serves one MQ (call amqp.Engine once per MQ)", tinymq.ErrInvalidOption)

// usable returns why the engine refuses every call: an invalid URL or option,
// an option used by two MQs, or a Shutdown begun. Two MQs on one engine would
// share its connections, topology and consumers, and either's Stop would stop
// both; the engine cannot tell their calls apart, so it refuses both's.
func (e *engine) usable() error {
	if e.cfgErr != nil {
		return e.cfgErr
	}
	if e.inits.Load() > 1 {
		return errReused
	}
	select {
	case <-e.stop:
		return errEngineStopped
	default:
		return nil
	}
}

// Init takes the MQ's logger and codec. It does no I/O. A second Init is a
// second MQ made with the same Engine option: it takes nothing, and from then
// on every call fails (see usable).
func (e *engine) Init(cfg tinymq.EngineConfig) {
	if e.inits.Add(1) > 1 {
		return
	}
	if cfg.Logger != nil {
		e.log = cfg.Logger
	}
	if cfg.Codec != nil {
		e.codec = cfg.Codec
	}
	e.forget = cfg.Forget
}

// DeclareExchange declares a durable exchange of the spec's type, with its
// alternate exchange as the alternate-exchange argument.
func (e *engine) DeclareExchange(spec tinymq.ExchangeSpec) error {
	if err := e.usable(); err != nil {
		return err
	}
	if reserved(spec.Name) || reserved(spec.Alternate) {
		return fmt.Errorf("%w: exchange name %q: names tinymq.wait, tinymq.requeue, tinymq.retry.* and tinymq.delay.* are the engine's", tinymq.ErrUnsupported, spec.Name)
	}
	if err := checkName("exchange name", spec.Name); err != nil {
		return err
	}
	if err := checkName("alternate exchange name", spec.Alternate); err != nil {
		return err
	}
	if e.external(spec.Name) && spec.Alternate != "" {
		return fmt.Errorf("%w: tinymq.WithAlternateExchange on external exchange %q (its arguments are its owner's)", tinymq.ErrUnsupported, spec.Name)
	}
	return e.declare([]step{e.exchangeStep(spec.Name, spec.Kind, spec.Alternate)})
}

// DeclareQueue declares the queue's exchange (when this MQ has not), a
// durable queue with the spec's arguments (WithQueueExpiry as x-expires), and
// its binding (its retry wait queues come at their first use); with spec.Consumer it attaches a
// subscription, which consumes from Start on, or at once when the engine is
// started. A queue declared already gets the binding, and counts as used
// (x-expires starts again), as a queue.declare does.
func (e *engine) DeclareQueue(spec tinymq.QueueSpec) error {
	if err := e.usable(); err != nil {
		return err
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
	case spec.Binding.Exchange == DefaultExchange && (len(spec.Binding.Args) > 0 ||
		slices.ContainsFunc(spec.Binding.Keys, func(k string) bool { return k != spec.Name })):
		return fmt.Errorf("%w: queue %q: the default exchange routes to a queue by its name only (no other key, no arguments)", tinymq.ErrUnsupported, spec.Name)
	}
	prefetch := 0
	if spec.Consumer != nil {
		var err error
		if prefetch, err = e.prefetchFor(spec.Name, spec.Concurrency); err != nil {
			return err
		}
	}
	proto := newQueue(e, spec) // its wait queues, if it is new
	if err := checkQueueNames(spec, proto.waitQs); err != nil {
		return err
	}

	// declMu is held until the queue is recorded, so that no delete or
	// expiry comes between its declaration and its record.
	e.declMu.Lock()
	defer e.declMu.Unlock()
	var steps []step
	e.topoMu.RLock()
	known := e.exchanges[spec.Binding.Exchange] != nil
	e.topoMu.RUnlock()
	if !known {
		steps = append(steps, e.exchangeStep(spec.Binding.Exchange, spec.Binding.Kind, ""))
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
	if spec.Expiry > 0 {
		args["x-expires"] = millis(spec.Expiry)
	}
	steps = append(steps, step{kind: stepQueue, name: spec.Name, args: e.userQueueArgs(spec, args)})
	// Its retry wait queues are declared at their first use (see wait.go).
	if len(proto.waitQs) > 0 {
		steps = append(steps, step{kind: stepBind, name: spec.Name, exchange: requeueExchange,
			args: amqp091.Table{"x-match": "all", hdrQueue: spec.Name}})
	}
	binds, err := bindingSteps(spec.Binding)
	if err != nil {
		return err
	}
	if spec.Binding.Exchange == DefaultExchange {
		binds = nil // the broker routes to the queue by its name
	}
	if err := e.declareLocked(append(steps, binds...)); err != nil {
		return err
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.byName[spec.Name]
	if q == nil {
		q = proto
		e.queues = append(e.queues, q)
		e.byName[spec.Name] = q
	}
	if spec.Consumer != nil {
		e.addSubLocked(newSubscription(q, spec.Consumer, spec.Concurrency, prefetch))
	}
	return nil
}

// checkQueueNames refuses a queue whose name, exchange, dead-letter exchange
// or retry wait queues (tinymq.retry.<queue>.<ms>) have names longer than
// AMQP allows.
func checkQueueNames(spec tinymq.QueueSpec, waitQs []string) error {
	if err := checkName("queue name", spec.Name); err != nil {
		return err
	}
	if err := checkName("exchange name", spec.Binding.Exchange); err != nil {
		return err
	}
	if err := checkName("dead-letter exchange name", spec.DeadLetterExchange); err != nil {
		return err
	}
	for _, w := range waitQs {
		if err := checkName(fmt.Sprintf("the retry wait queue of queue %.40q...", spec.Name), w); err != nil {
			return fmt.Errorf("%w (shorten the queue name)", err)
		}
	}
	return nil
}

// prefetchFor returns the prefetch of a subscription of concurrency workers
// to queue: WithQueuePrefetch for the queue, else WithPrefetch, else its
// concurrency; neither option may be below the concurrency.
func (e *engine) prefetchFor(queue string, concurrency int) (int, error) {
	if n, ok := e.cfg.queuePrefetch[queue]; ok {
		if concurrency > n {
			return 0, fmt.Errorf("%w: queue %q: concurrency %d above amqp.WithQueuePrefetch(%q, %d) leaves workers idle",
				tinymq.ErrInvalidOption, queue, concurrency, queue, n)
		}
		return n, nil
	}
	if e.cfg.prefetch == 0 {
		return concurrency, nil
	}
	if concurrency > e.cfg.prefetch {
		return 0, fmt.Errorf("%w: queue %q: concurrency %d above amqp.WithPrefetch(%d) leaves workers idle",
			tinymq.ErrInvalidOption, queue, concurrency, e.cfg.prefetch)
	}
	return e.cfg.prefetch, nil
}

// addSubLocked adds s to its queue and starts it if the engine is started.
// The caller holds mu.
func (e *engine) addSubLocked(s *subscription) {
	q := s.q
	q.mu.Lock()
	q.subs = append(slices.Clip(q.subs), s)
	q.signalLocked()
	q.mu.Unlock()
	if e.started && !e.closing {
		e.startSubLocked(s)
	}
}

// Consume attaches a subscription of concurrency workers running c to the
// declared queue (basic.consume, on a channel of its own, with the prefetch
// of a RegisterQueue consumer); it consumes from Start on, or at once when
// the engine is started, and again after every reconnect until its Cancel
// (or its queue's delete or expiry). Several
// subscriptions, of this MQ and of others, compete for the queue's
// messages. It does no I/O.
func (e *engine) Consume(queue string, c tinymq.ConsumerFunc, concurrency int) (tinymq.EngineSubscription, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	prefetch, err := e.prefetchFor(queue, concurrency)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.byName[queue]
	if q == nil {
		return nil, fmt.Errorf("%w: %q (deleted, or expired on the broker)", tinymq.ErrUnknownQueue, queue)
	}
	s := newSubscription(q, c, concurrency, prefetch)
	e.addSubLocked(s)
	return s, nil
}

// PauseQueue cancels the consumers (basic.cancel) that this MQ's
// subscriptions have on the queue, and hands back what they had prefetched;
// their deliveries in flight finish. It waits, at most the publish timeout,
// until the broker confirmed each cancel, so that no delivery begins after
// it returns. The subscriptions stay valid, and consume again at
// ResumeQueue (after a reconnect too). Consumers of other processes are
// not paused.
func (e *engine) PauseQueue(name string) error {
	if err := e.usable(); err != nil {
		return err
	}
	q := e.queue(name)
	if q == nil {
		return fmt.Errorf("%w: %q", tinymq.ErrUnknownQueue, name)
	}
	q.mu.Lock()
	was := q.paused
	q.paused = true
	q.signalLocked()
	q.mu.Unlock()
	t := time.NewTimer(e.cfg.publishTimeout)
	defer t.Stop()
	for {
		q.mu.Lock()
		busy := slices.ContainsFunc(q.subs, func(s *subscription) bool { return s.consuming })
		changed := q.changed
		q.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-changed:
		case <-e.stop:
			return nil // the consumers are being cancelled for good
		case <-t.C:
			q.mu.Lock()
			q.paused = was
			q.signalLocked()
			q.mu.Unlock()
			return fmt.Errorf("tinymq/amqp: pausing queue %q: its consumers were not cancelled within %v", name, e.cfg.publishTimeout)
		}
	}
}

// ResumeQueue has the queue's subscriptions consume again (basic.consume).
// It does not wait for the broker.
func (e *engine) ResumeQueue(name string) error {
	if err := e.usable(); err != nil {
		return err
	}
	q := e.queue(name)
	if q == nil {
		return fmt.Errorf("%w: %q", tinymq.ErrUnknownQueue, name)
	}
	q.mu.Lock()
	q.paused = false
	q.signalLocked()
	q.mu.Unlock()
	return nil
}

// queue returns the declared queue of that name, or nil.
func (e *engine) queue(name string) *cqueue {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byName[name]
}

// Bind binds an existing queue to another exchange, declaring the exchange
// when this MQ has not.
func (e *engine) Bind(spec tinymq.BindingSpec) error {
	if err := e.usable(); err != nil {
		return err
	}
	if reserved(spec.Exchange) {
		return fmt.Errorf("%w: exchange name %q is the engine's", tinymq.ErrUnsupported, spec.Exchange)
	}
	if spec.Exchange == DefaultExchange {
		return fmt.Errorf("%w: binding to the default exchange (it routes to every queue by its name)", tinymq.ErrUnsupported)
	}
	if err := checkName("exchange name", spec.Exchange); err != nil {
		return err
	}
	binds, err := bindingSteps(spec)
	if err != nil {
		return err
	}
	e.declMu.Lock()
	defer e.declMu.Unlock()
	var steps []step
	e.topoMu.RLock()
	known := e.exchanges[spec.Exchange] != nil
	e.topoMu.RUnlock()
	if !known {
		steps = append(steps, e.exchangeStep(spec.Exchange, spec.Kind, ""))
	}
	return e.declareLocked(append(steps, binds...))
}

// Start starts every queue's consumer; it does not block. Consumers' contexts
// derive from ctx.
func (e *engine) Start(ctx context.Context) error {
	if err := e.usable(); err != nil {
		return err
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
		q.mu.Lock()
		subs := slices.Clone(q.subs)
		q.mu.Unlock()
		for _, s := range subs {
			e.startSubLocked(s)
		}
	}
	return nil
}

// startSubLocked starts s's manager, unless s was cancelled or started. The
// caller holds mu, and the engine is started and not closing.
func (e *engine) startSubLocked(s *subscription) {
	q := s.q
	q.mu.Lock()
	if s.cancelled || s.started {
		q.mu.Unlock()
		return
	}
	s.started = true
	q.mu.Unlock()
	e.mgrWG.Add(1)
	go s.run(e.queueCtx)
}

// Shutdown stops consuming, waits for the messages in consumers, and closes
// the connections; see [tinymq.Engine].
func (e *engine) Shutdown(ctx context.Context) error {
	e.shutOnce.Do(func() {
		e.mu.Lock()
		e.closing = true
		// The subscriptions that never started never will: they are done.
		for _, q := range e.queues {
			q.mu.Lock()
			for _, s := range q.subs {
				if !s.started {
					s.closeDone()
				}
			}
			q.mu.Unlock()
		}
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
	// Counted before the consumers' contexts are cancelled: a consumer that
	// returns at once on the cancel was still cut short by the deadline.
	n := int64(0)
	e.mu.Lock()
	for _, q := range e.queues {
		n += q.inFlight.Load()
	}
	for _, q := range e.deleted {
		n += q.inFlight.Load()
	}
	e.mu.Unlock()
	e.abortOnce.Do(func() {
		close(e.abort)
		e.cancelConsumers()
	})
	// Past the deadline every wait of a Publish under way ends (one whose
	// confirm is pending returns ErrUnconfirmed: the broker may have it), and
	// so does what is left of the stop, unless something hangs (a log
	// handler that blocks, a socket write held by the broker's flow
	// control): then keep the deadline, roughly.
	grace, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	select {
	case <-e.pubs.done():
	case <-grace.Done():
	}
	if n == 0 {
		// No consumer was cut short: what is left is closing the
		// connections, which takes milliseconds.
		select {
		case <-e.done:
			return nil
		case <-grace.Done():
			return fmt.Errorf("tinymq/amqp: shutdown deadline passed before the engine closed its connections (no message was in a consumer; the broker keeps the rest): %w", ctx.Err())
		}
	}
	return fmt.Errorf("tinymq/amqp: shutdown deadline passed with %d messages in consumers; they stay unacknowledged and the broker delivers them again: %w",
		n, ctx.Err())
}

// finish stops everything in order: the consumers (which finish what they
// are in, a retry's publish included), then the publishes under way (those
// waiting for a connection give up, those sent wait for their confirm, until
// a Shutdown deadline), then the connections, then waits for every goroutine.
func (e *engine) finish() {
	e.mgrWG.Wait()
	close(e.draining)
	select {
	case <-e.pubs.done():
	case <-e.abort:
	}
	close(e.quit)
	e.supWG.Wait()
	e.wrkWG.Wait()
	e.cancelConsumers()
	close(e.logStop)
	e.logWG.Wait()
	e.mu.Lock()
	e.logClosed = true
	lines := e.logQ // handed over after the loop's last look
	e.logQ = nil
	e.mu.Unlock()
	for _, l := range lines {
		e.run(l)
	}
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

// logLine is a line that logLater handed to the log loop.
type logLine struct {
	level slog.Level
	msg   string
	kv    []any
	fn    func() // instead of a line: a call into the MQ (see tellLater)
}

// logLater logs a line of a call that the MQ makes holding its own lock
// (DeleteQueue, DeleteExchange, Unbind, ...): the logger is user code, and a
// logger that calls the MQ back (a Publish) would wait for that lock while
// the call waits for the logger. The line goes to the log loop, which logs it
// soon after, with no lock held; once the engine has shut down it is logged
// at once. It does not block.
func (e *engine) logLater(level slog.Level, msg string, kv ...any) {
	if e.log.Handler() == slog.DiscardHandler {
		return
	}
	e.later(logLine{level: level, msg: msg, kv: kv})
}

// tellLater calls fn, a call into the MQ (which may take the MQ's lock), on
// the log loop, as logLater logs: the caller may hold the engine's locks, or
// run under the MQ's.
func (e *engine) tellLater(fn func()) {
	e.later(logLine{fn: fn})
}

// later queues l for the log loop, starting it if need be.
func (e *engine) later(l logLine) {
	e.mu.Lock()
	if e.logClosed {
		e.mu.Unlock()
		e.run(l)
		return
	}
	e.logQ = append(e.logQ, l)
	if !e.logStarted {
		e.logStarted = true
		e.logWG.Add(1)
		go e.logLoop()
	}
	e.mu.Unlock()
	select {
	case e.logWake <- struct{}{}:
	default: // a nudge is pending
	}
}

// logLoop is the log loop (see engine): it logs what logLater queued, until
// finish closes logStop.
func (e *engine) logLoop() {
	defer e.logWG.Done()
	defer e.own.Leave(e.own.Enter()) // the logger may call Stop
	for {
		e.mu.Lock()
		lines := e.logQ
		e.logQ = nil
		e.mu.Unlock()
		for _, l := range lines {
			e.run(l)
		}
		select {
		case <-e.logWake:
		case <-e.logStop:
			return // finish logs what came after this look
		}
	}
}

// run logs l, or makes its call.
func (e *engine) run(l logLine) {
	if l.fn != nil {
		l.fn()
		return
	}
	e.logKV(l.level, l.msg, l.kv...)
}

func (e *engine) logInfo(msg string, kv ...any) { e.logKV(slog.LevelInfo, msg, kv...) }
func (e *engine) logWarn(msg string, kv ...any) { e.logKV(slog.LevelWarn, msg, kv...) }
