package tinymq

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/tinymq/tinymq/internal/guard"
)

type mqState uint8

const (
	stateNew mqState = iota
	stateRunning
	stateStopping // no more publishes; workers drain the queues
)

// MQ is a registry of exchanges and the queues bound to them. Create one with
// [New]; the zero MQ is ready to use too, with the default options. All its
// methods are safe for concurrent use.
type MQ struct {
	// Concurrency map. The goroutines of an MQ, who starts each and who
	// waits for it:
	//
	//   - workers: concurrency per subscription (RegisterQueue's, or each
	//     Consume), started by Start (or at once when running), each running
	//     one worker slot (worker.run); a worker whose consumer calls
	//     runtime.Goexit starts its own replacement before it ends. A worker
	//     ends when its subscription is cancelled (or its queue deleted),
	//     once its delivery in flight is settled, or when the stopping queue
	//     is closed; the last of a subscription's closes its done, which
	//     Cancel waits for. All are in wg; drain waits.
	//   - delivery-timeout handlers (worker.go, timedOut): with
	//     WithDeliveryTimeout only, one per call whose context ends (its
	//     deadline, or the abort's cancel), run by context.AfterFunc. Each
	//     joins wg on its first line (safe: the call's worker is still in wg,
	//     waiting in timedCall.finish if the call returned) and, when the
	//     deadline won, becomes the slot's new worker, the late call's
	//     goroutine staying in wg and in its subscription's alive count as an
	//     abandoned one (at most concurrency per subscription) until its
	//     consumer returns. So Stop and Cancel wait for abandoned calls;
	//     Shutdown's deadline bounds the wait.
	//   - the scheduler (scheduler.run): started by Start, in wg; it ends when
	//     drain closes schedQuit. It also deletes the queues whose
	//     WithQueueExpiry passed (expireQueue): no queue has a goroutine or a
	//     timer of its own. It keeps the coarse clock that stamps enqueued
	//     entries (scheduler.stamp): every 10 ms for a second after an
	//     enqueue started it, then not until the next enqueue.
	//   - the drain (drain): started by the first Stop or Shutdown of a
	//     running MQ; it waits for quiescence (or the abort), closes the
	//     queues and the scheduler, waits for wg, closes the log, waits for
	//     the log's lines (waitLogs) and closes done, which every Stop and
	//     Shutdown waits for.
	//   - guards (own.Guard, internal/guard): one per call of user code other than a
	//     consumer (a logger, a codec encoding a dead letter, the methods of
	//     a consumer's error or panic value), started and joined by the
	//     goroutine that needs the call.
	//   - the log's lines (walLogger.log): one per line that the write-ahead
	//     log reports after it opened, at most maxWalLogs at once, each
	//     running a guard; started by the log's writer, which does not wait;
	//     joined by waitLogs, after the log is closed.
	//   - the log's writer (internal/wal): started by the log's Open, joined
	//     by its Close (closeLog).
	//   - the context callback (context.AfterFunc on Start's ctx): runs Stop
	//     in a goroutine of its own when that ctx ends; drain unregisters it.
	//
	// User code runs in three places only, never under an MQ lock: a
	// consumer in a worker's process (recovered per message); a filter or a
	// Publish's codec on the publisher's goroutine with no lock held
	// (recovered); everything else in a guard, whose goroutine registers in
	// own, as workers, the scheduler and the drain do, so that a Stop it
	// calls does not wait for itself. What is logged under the write lock is
	// held (logHeld) and logged by unlock.
	//
	// Locks, in the order they may be taken: m.mu (read or write; the write
	// lock is never held across user code or a log write (Shutdown's abort
	// takes it too, so that each publish is counted by the abort or not at
	// all: see abortAll), and Publish never
	// holds the read lock across a log sync: see enqueueAdmitted), then
	// ex.reserveMu (held across the commit of an ID reservation, with no MQ
	// lock), then queue locks, several at once only in queue id order (see
	// quiescent). A rate-limited worker that finds no token releases its
	// queue's lock before it hands the scheduler its wake. The scheduler's
	// lock, the durable log's d.mu, the
	// dead-letter ring's lock, an exchange's dedupTable.mu (taken with no
	// MQ lock, before and after a deduplicated publish routes: see
	// publishOnce) and walLogger.mu are leaves: none is held while
	// another of these locks is taken or user code runs; d.mu alone is held
	// while the log takes an acknowledgement's batch (or a declare's, a
	// delete's or a purge's: durableLog.deleteQueue takes the MQ's read lock
	// before d.mu, and waits for the sync with neither), which waits for the
	// log's writer only when a segment's worth is already waiting.
	log    *slog.Logger
	codec  Codec
	engine Engine // nil: in memory
	// boundEngine is the engine that boundEngines holds for m (see
	// bindEngine), until a Shutdown returned nil: then released is set,
	// final holds the engine's last Stats, and m no longer calls the engine,
	// which may serve another MQ.
	boundEngine Engine
	released    atomic.Bool
	final       atomic.Pointer[Stats]
	dataDir     string
	syncEvery   time.Duration
	repairLog   bool
	maxSize     int // WithMaxMessageSize; 0: defaultMaxMessageSize

	middleware    []Middleware        // WithMiddleware, outermost first
	pubMiddleware []PublishMiddleware // WithPublishMiddleware, outermost first
	pubChain      PublishFunc         // pubMiddleware around publishInner (init), or nil
	setup         []func(*MQ)         // WithSetup, run by New

	initOnce sync.Once
	own      guard.Owned // goroutine ids of the MQ's own goroutines

	// mu guards everything below it. Publish holds the read lock while it routes
	// and enqueues (which never blocks on a consumer); declaring, binding,
	// starting and stopping take the write lock.
	mu            sync.RWMutex
	state         mqState
	exchanges     map[string]*exchange
	lastEx        atomic.Pointer[exchange] // the exchange last published to: a lookup without hashing
	queues        map[string]*queue
	order         []*queue              // queues in registration order
	queueSeq      int                   // queues created so far: the next one's id and default number
	deleted       []*queue              // deleted queues whose counts are not yet in deletedSum (see Stats)
	deletedSum    QueueStats            // the counts of deleted queues that have settled
	deletedQueues uint64                // queues deleted, by DeleteQueue or expiry
	expiredQueues uint64                // of those, by expiry
	retiredSeqs   map[string]retiredSeq // deleted exchanges: where their IDs ended
	ctx           context.Context       // the consumers' context, from Start
	cancel        context.CancelFunc
	stopAfter     func() bool // unregisters the stop on Start's ctx

	held            []heldLog     // lines logged under the write lock, for unlock to log
	evicted         []eviction    // messages restore evicted under the write lock, for unlock to dead-letter
	topologyVersion atomic.Uint64 // see TopologyVersion: increased by unlock, under the write lock

	sched      *scheduler
	wg         sync.WaitGroup // every worker, and the scheduler
	stopOnce   sync.Once
	stoppedNew bool          // the stop came before Start (set in stopOnce)
	idle       chan struct{} // a stopping queue ran out of work
	schedQuit  chan struct{} // closed to stop the scheduler
	done       chan struct{} // closed when every worker has returned
	stopErr    error         // set before done is closed

	abortOnce sync.Once
	aborted   chan struct{} // closed when Shutdown's deadline passed
	lost      abortTally    // what the abort dropped, set before aborted is closed
	// settling counts the MQ's goroutines in user code (a logger, a
	// dead-letter exchange's filter or codec) for messages that have
	// reached their end, or for none: a worker settling a failure or an
	// expired message, the scheduler expiring, the drain logging what it
	// stranded or the log's close, a line of the log's (see settleBegin).
	// The stop waits for them; Shutdown's deadline does not (see abortAll).
	settling atomic.Int64
	// stranded counts the messages of in-memory queues that the stop found
	// waiting where no consumer takes them (see queue.strand): undelivered,
	// and returned by Shutdown. Added under the queue's lock, so that each
	// is counted by strand or by an abort, never both.
	stranded atomic.Int64
	// transit counts the dead letters on their way from a queue that no
	// longer holds them to the dead-letter exchange's queues: expired by
	// the scheduler (expireHead), evicted by a publish or a restore
	// (DropHead). Added under the source queue's lock as the message leaves
	// it, and ended (transitDone) once the dead letter is in its targets or
	// dropped, so that a stopping MQ, which reads it holding every queue's
	// lock, never closes a target before it arrives. (A worker's dead
	// letters need no count: its queue is busy until it is done.)
	transit atomic.Int64
	// evicting is the part of transit that DropHead evicted: dead letters
	// settled on a publisher's goroutine (or a restore's caller), which,
	// unlike the scheduler's, is not counted in settling.
	evicting atomic.Int64
	// lostLate counts the messages that failed before a Shutdown deadline
	// and were being dead-lettered when it came (so that its abort did not
	// count them in a consumer: see queue.fail), and whose dead letter the
	// abort then kept from its end (dropped, or left on disk). abortAll
	// reads it after settling.
	lostLate atomic.Int64
	// late is closed when one of the MQ's goroutines enters user code after
	// the deadline's abort (see settleBegin): a Shutdown that found nothing
	// lost and waits for the stop then returns rather than wait for it.
	late     chan struct{}
	lateOnce sync.Once

	deadLetters deadLetterRing

	dur        *durableLog // the write-ahead log once open; set under the write lock
	anyDurable atomic.Bool // a durable queue is bound to some exchange

	payloads map[*queue]reflect.Type // the payload type of each typed queue (see typeQueueLocked); under mu
}

// abortTally is what Shutdown's deadline left undone.
type abortTally struct {
	undelivered uint64 // accepted messages that never reached a consumer
	inConsumers uint64 // messages in a consumer when the deadline passed
	abandoned   uint64 // calls that outlived WithDeliveryTimeout, still running
	settling    uint64 // the MQ's goroutines in user code after their messages' end
}

// New returns an MQ with no exchanges. Publishing is possible at once; delivery
// begins with [MQ.Start].
func New(opts ...Option) *MQ {
	m := new(MQ)
	for _, o := range opts {
		if o != nil {
			o.applyMQ(m)
		}
	}
	m.init()
	setup := m.setup
	m.setup = nil
	for _, fn := range setup {
		fn(m)
	}
	return m
}

// init gives the MQ what New gives it; every exported method calls it first,
// so that the zero MQ works.
func (m *MQ) init() {
	m.initOnce.Do(func() {
		if m.log == nil {
			m.log = defaultLogger
		}
		if m.codec == nil {
			m.codec = JSONCodec{}
		}
		if len(m.pubMiddleware) > 0 {
			m.pubChain = m.publishChain()
		}
		m.exchanges = make(map[string]*exchange)
		m.queues = make(map[string]*queue)
		m.sched = newScheduler()
		m.idle = make(chan struct{}, 1)
		m.schedQuit = make(chan struct{})
		m.done = make(chan struct{})
		m.aborted = make(chan struct{})
		m.late = make(chan struct{})
		if m.engine != nil {
			var bound bool
			if m.engine, bound = bindEngine(m, m.engine); bound {
				m.boundEngine = m.engine
			}
			// Forget holds m weakly: a bound engine must not keep an MQ
			// dropped without a Shutdown alive (see bindEngine).
			wm := weak.Make(m)
			forget := func(queue string) {
				if m := wm.Value(); m != nil {
					m.forgetOnEngine(queue)
				}
			}
			m.engine.Init(EngineConfig{Logger: m.log, Codec: m.codec, Forget: forget})
		}
	})
}

// DeclareExchange declares an exchange of the given kind, so that it can take
// options such as [WithAlternateExchange]. Declaring an existing exchange again
// with the same kind and options does nothing; with others it returns
// [ErrExchangeMismatch]. [MQ.RegisterQueue] declares exchanges with no options on
// first use, so declare an exchange that needs options before registering its
// queues. It does not block on consumers; after Stop it returns [ErrStopped].
func (m *MQ) DeclareExchange(name string, kind ExchangeType, opts ...ExchangeOption) error {
	m.init()
	var cfg exchangeConfig
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: nil ExchangeOption", ErrInvalidOption)
		}
		if err := o.applyExchange(&cfg); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	if m.engine != nil {
		if name == "" {
			return fmt.Errorf("%w: exchange name", ErrEmptyName)
		}
		if !kind.valid() {
			return fmt.Errorf("%w: %d", ErrInvalidKind, uint8(kind))
		}
		if ex := m.exchanges[name]; ex != nil && (ex.kind != kind || ex.cfg != cfg) {
			return fmt.Errorf("%w: %q has another kind or other options", ErrExchangeMismatch, name)
		}
		if cfg.dedup > 0 {
			return fmt.Errorf("%w: WithDeduplication", ErrUnsupported)
		}
		if err := m.engine.DeclareExchange(ExchangeSpec{Name: name, Kind: kind, Alternate: cfg.alternate}); err != nil {
			return err
		}
		_, err := m.declareLocked(name, kind, cfg, true)
		return err
	}
	_, err := m.declareLocked(name, kind, cfg, true)
	return err
}

// declareLocked returns the exchange name, declaring it if need be. With
// checkCfg, an existing exchange must also have cfg.
func (m *MQ) declareLocked(name string, kind ExchangeType, cfg exchangeConfig, checkCfg bool) (*exchange, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: exchange name", ErrEmptyName)
	}
	if !kind.valid() {
		return nil, fmt.Errorf("%w: %d", ErrInvalidKind, uint8(kind))
	}
	if ex := m.exchanges[name]; ex != nil {
		if ex.kind != kind {
			return nil, fmt.Errorf("%w: %q is %s, not %s", ErrExchangeMismatch, name, ex.kind, kind)
		}
		if checkCfg && ex.cfg != cfg {
			return nil, fmt.Errorf("%w: %q has other options", ErrExchangeMismatch, name)
		}
		return ex, nil
	}
	if m.engine == nil {
		if err := m.openLog(); err != nil { // IDs need the log's reservations from the start
			return nil, err
		}
	}
	ex := newExchange(name, kind, cfg)
	if m.dur != nil {
		ex.base = m.dur.seqs[name]
		ex.seq.Store(ex.base)
	}
	if r, ok := m.retiredSeqs[name]; ok { // IDs go on from the deleted exchange of this name
		ex.base = max(ex.base, r.seq)
		ex.seq.Store(ex.base)
		ex.reserved.Store(r.reserved)
		delete(m.retiredSeqs, name)
	}
	m.exchanges[name] = ex
	if m.dur != nil {
		m.dur.restoreDedup(ex) // WithDeduplication's IDs from before a restart
	}
	return ex, nil
}

// RegisterQueue declares the exchange on first use, creates a queue, binds it to
// the exchange and has concurrency workers call consumer for its messages. With
// concurrency 1, messages are delivered in the order they were published.
//
// It may be called before or after [MQ.Start]; a queue registered while running
// starts at once and receives every message published after RegisterQueue
// returns. It does not block on consumers. After Stop it returns [ErrStopped].
// Invalid arguments return an error matching one of [ErrEmptyName],
// [ErrInvalidKind], [ErrNilConsumer], [ErrInvalidConcurrency],
// [ErrExchangeMismatch], [ErrDuplicateQueue], [ErrInvalidBinding],
// [ErrKeyTooLong] or [ErrInvalidOption], and change nothing. concurrency is
// at most [MaxConcurrency]; each worker is a goroutine.
func (m *MQ) RegisterQueue(exchange string, kind ExchangeType, consumer ConsumerFunc, concurrency int, opts ...QueueOption) error {
	if consumer == nil {
		return ErrNilConsumer
	}
	return m.register(exchange, kind, consumerOf(consumer), concurrency, opts)
}

// consumerOf is a ConsumerFunc as a queue's consumer.
func consumerOf(fn ConsumerFunc) consumer { return consumer{fn: fn} }

// register is RegisterQueue for a consumer of either form.
func (m *MQ) register(exchange string, kind ExchangeType, c consumer, concurrency int, opts []QueueOption) error {
	if concurrency < 1 || concurrency > MaxConcurrency {
		return fmt.Errorf("%w: got %d, want 1 to %d", ErrInvalidConcurrency, concurrency, MaxConcurrency)
	}
	m.init()
	c = m.wrapConsumer(c)
	cfg, hbs, err := queueOptions(kind, opts)
	if err != nil {
		return err
	}

	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	name := cfg.name
	if name == "" {
		name = fmt.Sprintf("%s#%d", exchange, m.queueSeq+1)
	}
	if m.queues[name] != nil {
		return fmt.Errorf("%w: %q", ErrDuplicateQueue, name)
	}
	if err := m.decodable(name, cfg.durable, c); err != nil {
		return err
	}
	q, err := m.createQueueLocked(exchange, kind, name, cfg, hbs, &c, concurrency)
	if err != nil {
		return err
	}
	return m.typeQueueLocked(q, c) // a new queue: it takes any type
}

// Bind binds an existing queue to another exchange, declaring that exchange on
// first use, so that one queue (and its consumer) receives what several
// exchanges route to it: for example a device's queue bound both to a fanout
// exchange for broadcasts and to a topic exchange for its own messages. It takes
// the binding options [WithBindingKey] and [WithBindingArgs], validated as in
// RegisterQueue. It does not block on consumers; after Stop it returns
// [ErrStopped].
func (m *MQ) Bind(queue, exchange string, kind ExchangeType, opts ...BindingOption) error {
	m.init()
	b, hbs, err := bindingOptions(kind, opts)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.unlock()
	if m.state >= stateStopping {
		return ErrStopped
	}
	q := m.queues[queue]
	if q == nil {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	if m.engine != nil {
		if exchange == "" {
			return fmt.Errorf("%w: exchange name", ErrEmptyName)
		}
		ex, err := m.declareLocked(exchange, kind, exchangeConfig{}, false)
		if err != nil {
			return err
		}
		if err := m.engine.Bind(BindingSpec{Queue: queue, Exchange: exchange, Kind: kind, Keys: b.keys, Args: b.args}); err != nil {
			return err
		}
		ex.bind(q, b, hbs)
		return nil
	}
	ex, err := m.declareLocked(exchange, kind, exchangeConfig{}, false)
	if err != nil {
		return err
	}
	ex.bind(q, b, hbs)
	m.logDeclared(q)
	return nil
}

// startWorkers starts the workers of q's subscriptions. The caller holds
// the write lock and the MQ is running, so Stop cannot be waiting on the
// WaitGroup yet.
func (m *MQ) startWorkers(q *queue) {
	q.lock()
	subs := q.subs
	q.mu.Unlock()
	for _, s := range subs {
		m.startSub(s)
	}
}

// Start starts the workers of every queue and returns; it does not block.
// Messages published before Start are delivered now. The consumers' context is
// derived from ctx: cancelling ctx cancels it and stops the MQ as [MQ.Stop]
// does. Start returns [ErrAlreadyStarted] when called twice and [ErrStopped]
// after Stop.
func (m *MQ) Start(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	m.init()
	m.mu.Lock()
	defer m.unlock()
	switch m.state {
	case stateRunning:
		return ErrAlreadyStarted
	case stateStopping:
		return ErrStopped
	}
	if m.engine != nil {
		if m.dataDir != "" { // the broker keeps the messages: a log would be silently unused
			return fmt.Errorf("%w: WithDataDir", ErrUnsupported)
		}
		if err := m.engine.Start(ctx); err != nil {
			return err
		}
		m.state = stateRunning
		m.stopAfter = context.AfterFunc(ctx, m.Stop)
		return nil
	}
	if err := m.openLog(); err != nil {
		return err
	}
	if m.dur != nil {
		for q, n := range m.dur.unregistered() {
			msg := "tinymq: the log holds messages of a durable queue that is not registered"
			if m.queues[q] != nil {
				msg = "tinymq: the log holds messages of a durable queue that is registered without WithDurable"
			}
			m.logHeld(slog.LevelWarn, msg, slog.String("queue", q), slog.Int("count", n))
		}
	}
	m.ctx, m.cancel = context.WithCancel(ctx)
	m.state = stateRunning
	for _, q := range m.order {
		m.startWorkers(q)
	}
	m.wg.Add(1)
	go m.sched.run(m.schedQuit, &m.wg, &m.own)
	m.stopAfter = context.AfterFunc(ctx, m.Stop)
	return nil
}

// Health reports whether the MQ is ready, for a readiness probe: nil once
// Start has run and until Stop or Shutdown begins, while its write-ahead log
// (if any) takes writes; else [ErrNotStarted], [ErrStopped], or an error
// wrapping [ErrLog] that says why the log failed (durable publishes fail
// until a restart then). It does not block and works in every state. On an
// [Engine] it reports the MQ's own state only.
func (m *MQ) Health() error {
	m.init()
	m.mu.RLock()
	state, dur := m.state, m.dur
	m.mu.RUnlock()
	switch state {
	case stateNew:
		return ErrNotStarted
	case stateStopping:
		return ErrStopped
	}
	if dur != nil {
		if err := dur.log.Err(); err != nil {
			return fmt.Errorf("%w: %w", ErrLog, err)
		}
	}
	return nil
}

// Stop stops accepting messages and waits until every message already accepted
// has reached its end: delivered, or retried until it succeeded or was
// dead-lettered (dead letters published meanwhile included), or expired. It
// waits for messages delayed or backing off too. What waits in a queue that
// no consumer takes (it has none, or is paused) is not waited for: it stays
// there, counted undelivered (a durable queue's stay in the log), and from
// the moment the stop begins it no longer expires or is evicted by a length
// limit. Then every worker has
// returned and Stop cancels the consumers' context. It waits, too, for the
// consumer calls that [WithDeliveryTimeout] abandoned (their contexts ended
// at their deadlines) to return. It blocks for as long as that takes; use
// [MQ.Shutdown] to bound it. Stop is idempotent and safe to
// call concurrently: every call returns once the MQ has stopped. Publishers
// blocked on a full queue return [ErrStopped]. Stop before Start delivers
// nothing: it logs how many accepted messages it dropped.
//
// Called from a consumer (or a logger the MQ calls), Stop begins the stop
// and returns at once: waiting would wait for the caller itself. The stop
// completes once that consumer returns.
func (m *MQ) Stop() {
	_ = m.Shutdown(context.Background())
}

// Shutdown is [MQ.Stop] bounded by ctx. It returns nil once every accepted
// message has reached its end and every worker has returned, or an error
// wrapping [ErrUndelivered] if the stop found messages waiting in an in-memory
// queue that no consumer takes (paused, or without a consumer): they are lost
// (a durable queue's stay in its log). If ctx ends first, it cancels the
// consumers' context, drops the messages that no worker has begun (those
// waiting for a delay or retry included), and returns an error wrapping both
// [ErrUndelivered] and ctx.Err() that says how many accepted messages never
// reached a consumer; the drops are logged by the MQ's own goroutine, so a
// slow logger cannot hold Shutdown past its deadline. (The deadline's abort
// takes the MQ's write lock, so it waits for a RegisterQueue, Bind or Start in
// progress, which may be opening a data directory's log.) Workers still inside
// a consumer then return when the consumer does; call Stop to wait for them. A
// message that a worker had begun when ctx ended counts as in a consumer, even
// if its consumer call begins just after (with the consumers' context already
// cancelled); so does one whose failure came just before ctx ended and whose
// retry or dead letter the deadline then stopped. Consumer calls that
// [WithDeliveryTimeout] abandoned are waited
// for like workers: if some still run when ctx ends, Shutdown returns an error
// wrapping ctx.Err() that counts them (wrapping ErrUndelivered only if
// messages were lost too), though their messages were settled at their
// deadlines; so are the MQ's own goroutines still in user code (a logger, a
// dead-letter filter or codec) for a message that had reached its end or for
// a dead letter on its way (which Stop waits for), or that
// enter user code after the deadline (the stop's last log lines, a line of the
// write-ahead log's): a blocked logger never holds Shutdown past its deadline.
// A worker still dead-lettering a failed message at the deadline is counted
// the same way; that dead letter may then be dropped (counted in Stats,
// logged).
// If nothing was lost (nothing waited, no consumer was running, no abandoned
// call and no such goroutine), Shutdown returns nil even when ctx had ended.
// Shutdown before Start drops what was published and returns an error wrapping
// ErrUndelivered if that was anything. Called from a consumer, it begins the
// stop and returns [ErrCalledFromConsumer] at once. A nil ctx is refused with
// [ErrInvalidOption], and nothing stops.
func (m *MQ) Shutdown(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	m.init()
	if m.engine != nil {
		// The engine's shutdown first: a RegisterQueue or a Bind may hold
		// the write lock while the engine waits for the broker, and the
		// engine's shutdown ends that wait (and refuses what comes after it).
		if m.released.Load() {
			return nil // shut down; the engine may serve another MQ now
		}
		err := m.engine.Shutdown(ctx)
		if err == nil && m.boundEngine != nil && !m.released.Swap(true) {
			st := finalStats(m.engine)
			m.final.Store(&st)
			unbindEngine(m, m.boundEngine)
		}
		m.stopOnce.Do(func() {
			m.mu.Lock()
			m.state = stateStopping
			m.mu.Unlock()
			if m.stopAfter != nil {
				m.stopAfter()
			}
		})
		return err
	}
	m.stopOnce.Do(m.beginStop)
	if m.own.Mine() {
		return ErrCalledFromConsumer
	}
	// done first: when both done and ctx are ready, select would pick one at
	// random, and an MQ that has stopped must not report a deadline.
	select {
	case <-m.done:
		return m.stopErr
	default:
	}
	select {
	case <-m.done:
		return m.stopErr
	case <-ctx.Done():
	}
	if m.stoppedNew {
		return m.shutdownNewLate(ctx)
	}
	m.abortOnce.Do(func() {
		// Count first, then cancel: a cancelled consumer may return at once,
		// and it was still in the consumer when the deadline passed.
		m.lost = m.abortAll()
		m.cancel()
		// What is not done stays in the log: close it now, so that the data
		// directory is free once Shutdown returns, even while a consumer
		// that ignores its context still runs (its acknowledgement is then
		// lost, and the message delivered again after a restart).
		// It logs nothing here: the drain logs the close's error.
		m.closeLogQuietly()
		close(m.aborted)
	})
	if m.lost == (abortTally{}) {
		// Nothing was lost: the workers have nothing left and no consumer
		// to wait for, so the stop ends at once, unless the MQ's goroutines
		// run user code after the abort (the stop's last log lines, a line
		// of the log's): Shutdown does not wait for that. Either settleBegin
		// saw aborted closed, or its count is seen here.
		select {
		case <-m.done:
			return m.stopErr
		default:
		}
		if n := m.settling.Load(); n > 0 {
			return m.lateErr(ctx, n)
		}
		select {
		case <-m.done:
			return m.stopErr
		case <-m.late:
			return m.lateErr(ctx, m.settling.Load())
		}
	}
	if m.lost.undelivered == 0 && m.lost.inConsumers == 0 {
		// Every message has reached its end, but some goroutines have not:
		// abandoned calls (WithDeliveryTimeout), or the MQ's own in user
		// code after a message's end.
		return fmt.Errorf("tinymq: %d consumer calls abandoned after their delivery timeout still run, %d of the MQ's goroutines still run a logger, filter or codec: %w",
			m.lost.abandoned, m.lost.settling, ctx.Err())
	}
	return fmt.Errorf("%w: %d never reached a consumer, %d were in consumers, %d abandoned calls still run, %d of the MQ's goroutines still run a logger, filter or codec: %w",
		ErrUndelivered, m.lost.undelivered, m.lost.inConsumers, m.lost.abandoned, m.lost.settling, ctx.Err())
}

// shutdownNewLate is Shutdown past ctx's end after a stop before Start,
// which had nothing to abort: the drops were counted at once (stopErr), and
// only finishNew's log lines may still run, which Shutdown does not wait for
// (closing aborted makes settleBegin signal late, as after an abort).
func (m *MQ) shutdownNewLate(ctx context.Context) error {
	if m.stopErr != nil {
		return m.stopErr
	}
	m.abortOnce.Do(func() { close(m.aborted) })
	select {
	case <-m.done:
		return nil
	default:
	}
	if n := m.settling.Load(); n > 0 {
		return m.lateErr(ctx, n)
	}
	select {
	case <-m.done:
		return nil
	case <-m.late:
		return m.lateErr(ctx, m.settling.Load())
	}
}

// lateErr is Shutdown's error when nothing was lost at the deadline but n of
// the MQ's goroutines then ran user code.
func (m *MQ) lateErr(ctx context.Context, n int64) error {
	return fmt.Errorf("tinymq: 0 consumer calls abandoned after their delivery timeout still run, %d of the MQ's goroutines still run a logger, filter or codec: %w",
		max(n, 1), ctx.Err())
}

// settleBegin counts the calling goroutine, one of the MQ's, in settling as
// it runs user code that no message waits for (the caller takes it off with
// settling.Add(-1)). After the deadline's abort it also closes late, so
// that a Shutdown waiting for the stop does not wait for that user code.
func (m *MQ) settleBegin() {
	m.settling.Add(1)
	select {
	case <-m.aborted:
		m.lateOnce.Do(func() { close(m.late) })
	default:
	}
}

// abortAll aborts every queue and returns what was lost. It holds the write
// lock, so that no publish is between its queues' admission and its
// inbound hold (see enqueueAdmitted): each publish is counted either by the
// abort or not at all. Publishes hold the read lock only briefly (never
// across a log sync or user code), so the deadline is not held up.
func (m *MQ) abortAll() abortTally {
	m.mu.Lock()
	defer m.mu.Unlock()
	var total abortTally
	for _, q := range m.order {
		undelivered, running := q.abort()
		total.undelivered += undelivered
		total.inConsumers += running
		q.lock()
		total.abandoned += uint64(q.abandoned)
		q.mu.Unlock()
	}
	for _, q := range m.deleted { // a deleted queue's deliveries still in flight
		total.inConsumers += q.inHand()
	}
	// Those that the stop stranded before the abort came: a queue it
	// stranded is closed, and its abort above counted nothing.
	total.undelivered += uint64(m.stranded.Load())
	// Read last: a worker counts itself settling before its message's end
	// (see queue.settle), and the drain before it strands a queue's
	// messages, so that each message either was counted above or its
	// goroutine is counted here. Once the deadline has passed, waiting for
	// the stop would wait for that user code, which may block for good.
	total.settling = uint64(max(m.settling.Load(), 0))
	// After settling: a worker counts a message lost late before it leaves
	// settling, so that it is counted here or its worker was above.
	total.inConsumers += uint64(max(m.lostLate.Load(), 0))
	// An evicted dead letter on its way (see transit) is in user code or
	// about to be (a filter, a logger), as a goroutine in settling is (the
	// scheduler's expired ones are counted there); none begins once the
	// queues are aborted.
	total.settling += uint64(max(m.evicting.Load(), 0))
	return total
}

// pastDeadline reports whether a Shutdown deadline's abort has begun.
func (m *MQ) pastDeadline() bool {
	select {
	case <-m.aborted:
		return true
	default:
		return false
	}
}

// logLost logs, with msg, what abort left undelivered in each queue.
func (m *MQ) logLost(msg string) {
	m.mu.RLock()
	queues := slices.Clone(m.order)
	m.mu.RUnlock()
	for _, q := range queues {
		q.lock()
		n := q.abortLost
		q.mu.Unlock()
		if n > 0 {
			m.logAttrs(slog.LevelError, msg, func(a []slog.Attr) []slog.Attr {
				return append(a, slog.String("queue", q.name), slog.Uint64("count", n))
			})
		}
	}
}

// beginStop stops publishing and starts draining; it runs once, and calls
// no user code.
func (m *MQ) beginStop() {
	m.mu.Lock()
	prev := m.state
	m.state = stateStopping
	queues := slices.Clone(m.order)
	m.mu.Unlock()

	if prev == stateNew {
		m.stoppedNew = true
		if n := m.abortAll().undelivered; n > 0 {
			m.stopErr = fmt.Errorf("%w: %d messages published before Start were dropped by a stop before Start", ErrUndelivered, n)
		}
		go m.finishNew()
		return
	}
	for _, q := range queues {
		q.stop()
	}
	go m.drain(queues)
}

// finishNew ends a stop before Start on a goroutine of the MQ's, which done
// waits for: it logs what was dropped, closes the log and waits for its
// lines, so that a logger that blocks holds this goroutine, never a
// Shutdown's deadline (its user code counts in settling).
func (m *MQ) finishNew() {
	id := m.own.Enter()
	defer m.own.Leave(id)
	if m.stopErr != nil {
		m.settleBegin()
		m.logLost("tinymq: stopped before Start, messages not delivered")
		m.settling.Add(-1)
	}
	m.closeLog()
	m.waitLogs()
	close(m.done)
}

// drain waits until no queue has work left and no dead letter is on its way,
// all at one instant (a consumer may still dead-letter into a queue that was
// idle), strands at that instant what waits in the queues that no consumer
// takes (see quiesce), closes the queues and the scheduler, waits for every
// worker, and closes done. After an abort it logs what was dropped, and
// waits for the dead letters still on their way before it closes done.
func (m *MQ) drain(queues []*queue) {
	id := m.own.Enter()
	defer m.own.Leave(id)
	// What waits in a queue that no consumer takes (it has none, or is
	// paused) stays there, as in a broker: undelivered, logged, and
	// returned by Shutdown (a durable queue's stay in the log: not lost).
	var stranded []int
wait:
	for {
		var ok bool
		if stranded, ok = m.quiesce(queues); ok {
			break
		}
		select {
		case <-m.idle:
		case <-m.aborted:
			// An abort counts what the queues hold; strand counts what
			// a queue it has not reached yet holds, never both.
			stranded = make([]int, len(queues))
			for i, q := range queues {
				stranded[i] = q.strand()
			}
			break wait
		}
	}
	for i, q := range queues {
		if n := stranded[i]; n > 0 {
			if q.cfg.durable {
				m.logAttrs(slog.LevelWarn, "tinymq: stopped with messages in a queue that no consumer takes; they stay in the log for the next start", func(a []slog.Attr) []slog.Attr {
					return append(a, slog.String("queue", q.name), slog.Int("count", n))
				})
			} else {
				m.logAttrs(slog.LevelError, "tinymq: stopped with messages in a queue that no consumer takes, not delivered", func(a []slog.Attr) []slog.Attr {
					return append(a, slog.String("queue", q.name), slog.Int("count", n))
				})
			}
			m.settling.Add(-1) // counted by strand
		}
	}
	// A queue that lost messages to an abort was aborted before it could
	// look quiescent, so every such loss is known here.
	m.logLost("tinymq: shutdown deadline passed, messages not delivered")
	for _, q := range queues {
		q.close()
	}
	close(m.schedQuit)
	m.wg.Wait()
	// After a deadline's abort, a dead letter may still be on its way (an
	// eviction settled on a publisher's goroutine, in a filter that
	// blocks): the stop ends once it has reached its end. (A graceful stop
	// found none, and none can begin after it.)
	for m.transit.Load() > 0 {
		<-m.idle
	}
	m.closeLog()
	m.waitLogs()
	m.cancel()
	m.stopAfter()
	if n := m.stranded.Load(); n > 0 {
		m.stopErr = fmt.Errorf("%w: %d messages waited in queues that no consumer takes (paused, or without a consumer)", ErrUndelivered, n)
	}
	close(m.done)
}

// quiesce reports whether every queue is empty and idle, with no dead
// letter on its way between them, and if so strands, at that same instant,
// what waits in the queues that no consumer takes (see queue.strandLocked),
// and returns how many per queue: once it is done, no message moves any
// more. A first pass looks at one queue at a time and usually stops at the
// first busy one; only when all looked idle does it check again holding all
// their locks at once (in id order), so that no message moves between
// queues meanwhile: an expiry cannot take a stranded queue's head between
// the check and the strand, nor a dead letter reach a queue stranded before
// it.
func (m *MQ) quiesce(queues []*queue) ([]int, bool) {
	for _, q := range queues {
		q.lock()
		idle := q.quiescentLocked()
		q.mu.Unlock()
		if !idle {
			return nil, false
		}
	}
	for _, q := range queues {
		q.lock()
	}
	ok := m.transit.Load() == 0
	for _, q := range queues {
		ok = ok && q.quiescentLocked()
	}
	var stranded []int
	if ok {
		stranded = make([]int, len(queues))
		for i, q := range queues {
			stranded[i] = q.strandLocked()
		}
	}
	for _, q := range queues {
		q.mu.Unlock()
	}
	return stranded, ok
}

// evictedInTransit counts n messages that DropHead evicted as dead letters on their
// way (see transit and evicting). The caller holds the queue's lock.
func (m *MQ) evictedInTransit(n int) {
	if n > 0 {
		m.transit.Add(int64(n))
		m.evicting.Add(int64(n))
	}
}

// transitDone ends the transit of n dead letters (see MQ.transit), and
// wakes a stopping MQ that waits for them.
func (m *MQ) transitDone(n int) {
	if m.transit.Add(-int64(n)) == 0 {
		select {
		case m.idle <- struct{}{}:
		default:
		}
	}
}
