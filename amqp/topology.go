package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// The engine's own names on the broker. Everything it declares besides the
// application's exchanges and queues starts with "tinymq.", and the headers
// it adds start with "tinymq-"; both are stripped from what consumers see.
const (
	// waitExchange routes a message to the wait queue (a retry's or a delay's)
	// that its hdrWait header names. A headers exchange, so that the message
	// keeps its own routing key.
	waitExchange = "tinymq.wait"
	// requeueExchange routes a message whose retry wait ended back to the
	// queue that its hdrQueue header names, with its own routing key.
	requeueExchange = "tinymq.requeue"
	// retryPrefix names a queue's retry wait queues: tinymq.retry.<queue>.<ms>ms
	// (see wait.go).
	retryPrefix = "tinymq.retry."
	// delayPrefix names an exchange's delay queues: tinymq.delay.<exchange>.<ms>ms.
	delayPrefix = "tinymq.delay."

	hdrPrefix   = "tinymq-"
	hdrWait     = "tinymq-wait"     // the wait queue a message goes to
	hdrQueue    = "tinymq-queue"    // the queue a retried message goes back to
	hdrExchange = "tinymq-exchange" // the exchange a retried message was published to
	hdrAttempt  = "tinymq-attempt"  // the attempt a retried message comes back for
)

// reserved reports whether an application name collides with the engine's.
func reserved(name string) bool {
	return name == waitExchange || name == requeueExchange ||
		strings.HasPrefix(name, retryPrefix) || strings.HasPrefix(name, delayPrefix)
}

// millis rounds d up to whole milliseconds, at least 1, as AMQP TTLs count.
func millis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 || ms == 0 {
		ms++
	}
	return ms
}

type stepKind uint8

const (
	stepExchange stepKind = iota + 1
	stepQueue
	stepBind
)

// step is one declaration, kept so that it can be made again on a new
// connection (the broker may have lost it, or be a new node).
type step struct {
	kind     stepKind
	name     string // exchange or queue
	xkind    string // exchange type
	exchange string // binding: the exchange
	key      string // binding: the key
	args     amqp091.Table
	passive  bool // exchange: another service's, only checked (see WithExternalExchanges)
}

func (s step) String() string {
	switch s.kind {
	case stepExchange:
		return fmt.Sprintf("exchange %q", s.name)
	case stepQueue:
		return fmt.Sprintf("queue %q", s.name)
	default:
		return fmt.Sprintf("binding of queue %q to exchange %q", s.name, s.exchange)
	}
}

func (s step) apply(ch *amqp091.Channel) error {
	switch s.kind {
	case stepExchange:
		if s.passive {
			if s.name == DefaultExchange {
				return nil // every broker has it; it cannot be declared, even passively
			}
			return ch.ExchangeDeclarePassive(s.name, s.xkind, true, false, false, false, nil)
		}
		return ch.ExchangeDeclare(s.name, s.xkind, true, false, false, false, s.args)
	case stepQueue:
		_, err := ch.QueueDeclare(s.name, true, false, false, false, s.args)
		return err
	default:
		return ch.QueueBind(s.name, s.key, s.exchange, false, s.args)
	}
}

// exchangeStep is the declaration of an exchange of this MQ, or the check
// that the broker has an external one (see WithExternalExchanges).
func (e *engine) exchangeStep(name string, kind tinymq.ExchangeType, alternate string) step {
	if e.external(name) {
		return step{kind: stepExchange, name: name, xkind: kind.String(), passive: true}
	}
	return exchangeStep(name, kind, alternate)
}

// external reports whether the exchange is another service's or the
// broker's (amq.*, the default exchange): never declared, changed or deleted.
func (e *engine) external(name string) bool {
	return strings.HasPrefix(name, "amq.") || e.cfg.external[name]
}

// DefaultExchange is the name under which the engine publishes to RabbitMQ's
// default exchange (the exchange "" on the wire, which amqp091-go users
// publish to), as the broker's management tools name it: it routes a
// message to the queue named by its routing key:
//
//	mq.Publish(amqp.DefaultExchange, job, tinymq.WithRoutingKey("jobs"))
//
// It is external (see [WithExternalExchanges]) and needs no declaration. A
// queue registered on it, with its own name as the binding key
// (RegisterQueue(amqp.DefaultExchange, tinymq.Direct, fn, 1,
// tinymq.WithQueueName("jobs"), tinymq.WithBindingKey("jobs"))), gets no
// binding on the broker, which routes to every queue by its name; another
// binding key, Bind and Unbind are refused with [tinymq.ErrUnsupported].
const DefaultExchange = "amq.default"

// wireExchange is the name of an exchange in AMQP methods.
func wireExchange(name string) string {
	if name == DefaultExchange {
		return ""
	}
	return name
}

func exchangeStep(name string, kind tinymq.ExchangeType, alternate string) step {
	var args amqp091.Table
	if alternate != "" {
		args = amqp091.Table{"alternate-exchange": alternate}
	}
	return step{kind: stepExchange, name: name, xkind: kind.String(), args: args}
}

// bindingSteps returns the bindings of spec: one per key, one per argument
// table, or one with neither.
func bindingSteps(spec tinymq.BindingSpec) ([]step, error) {
	var steps []step
	switch {
	case len(spec.Keys) > 0:
		for _, k := range spec.Keys {
			steps = append(steps, step{kind: stepBind, name: spec.Queue, exchange: spec.Exchange, key: k})
		}
	case len(spec.Args) > 0:
		for _, a := range spec.Args {
			t, err := toTable(a)
			if err != nil {
				return nil, fmt.Errorf("%w: binding arguments: %w", tinymq.ErrInvalidBinding, err)
			}
			steps = append(steps, step{kind: stepBind, name: spec.Queue, exchange: spec.Exchange, args: t})
		}
	default:
		steps = append(steps, step{kind: stepBind, name: spec.Queue, exchange: spec.Exchange})
	}
	return steps, nil
}

// baseSteps are the engine's own exchanges, declared first on every
// connection.
func baseSteps() []step {
	return []step{
		{kind: stepExchange, name: waitExchange, xkind: "headers"},
		{kind: stepExchange, name: requeueExchange, xkind: "headers"},
	}
}

// declare applies steps on the publishing connection and records them, so
// that every later connection declares them again. It waits at most the
// publish timeout for a connection, and applies again what a lost connection
// interrupted. Declarations are one at a time (declMu).
func (e *engine) declare(steps []step) error {
	e.declMu.Lock()
	defer e.declMu.Unlock()
	return e.declareLocked(steps)
}

// declareLocked is declare for a caller that holds declMu. A step recorded
// already (a queue declared again, a binding made again) is not recorded
// twice.
func (e *engine) declareLocked(steps []step) error {
	e.ensureRunning()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.publishTimeout)
	defer cancel()
	from, recorded := 0, 0 // steps[from:] are to apply; steps[:recorded] are in e.steps
	var skip uint64
	for {
		conn, gen, err := e.waitConn(ctx, skip)
		if err != nil {
			return fmt.Errorf("tinymq/amqp: declaring %v: %w", steps[from], err)
		}
		n, err := applySteps(conn, steps[from:])
		// Record what was applied. If the connection changed meanwhile, the
		// supervisor may have re-declared the topology without these steps:
		// apply them all again on the new connection (declaring is idempotent).
		e.topoMu.Lock()
		if done := from + n; done > recorded {
			for _, s := range steps[recorded:done] {
				if s.kind == stepExchange && (e.exchanges[s.name] != nil || reserved(s.name)) || e.recordedLocked(s) {
					continue // recorded already
				}
				e.steps = append(e.steps, s)
				e.noteStepLocked(s)
			}
			recorded = done
		}
		same := e.gen == gen
		e.topoMu.Unlock()
		switch {
		case !same:
			from, skip = 0, 0
		case err == nil:
			return nil
		case !conn.IsClosed():
			return declareError(steps[from+n], err)
		default: // the connection was lost: go on with the rest on the next one
			from += n
			skip = gen
		}
	}
}

// applySteps applies steps in order on one channel and returns how many
// succeeded.
func applySteps(conn *amqp091.Connection, steps []step) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	for i, s := range steps {
		if err := s.apply(ch); err != nil {
			return i, err
		}
	}
	return len(steps), nil
}

// redeclare applies every recorded step on conn, after a reconnect. A step the
// broker refuses (someone declared it differently meanwhile) is logged and
// skipped: the rest still matters. A queue with an expiry that the broker no
// longer has expired: it is not declared again (see withoutExpired).
func (e *engine) redeclare(conn *amqp091.Connection, steps []step) error {
	return e.redeclareLogging(conn, steps, e.logKV)
}

// redeclareQuietly is redeclare for a call that the MQ makes holding its
// own lock: it logs through logLater, and the error too.
func (e *engine) redeclareQuietly(conn *amqp091.Connection, steps []step) {
	if err := e.redeclareLogging(conn, steps, e.logLater); err != nil {
		e.logLater(slog.LevelWarn, "tinymq/amqp: declaring the topology again failed", "err", err.Error())
	}
}

func (e *engine) redeclareLogging(conn *amqp091.Connection, steps []step, logf func(slog.Level, string, ...any)) error {
	steps = e.withoutExpired(conn, steps)
	for len(steps) > 0 {
		n, err := applySteps(conn, steps)
		if err == nil {
			return nil
		}
		if conn.IsClosed() {
			return err
		}
		logf(slog.LevelError, "tinymq/amqp: re-declaring after a reconnect failed; skipping it",
			"step", steps[n].String(), "err", err.Error())
		steps = steps[n+1:]
	}
	return nil
}

// withoutExpired returns steps without those of the queues declared with
// an expiry (x-expires) that the broker does not have: unused for that long,
// the broker deleted them, and declaring them again would bring back what
// expired. Their state is forgotten by the next Stats, or by their
// subscriptions, which find them gone (see expire). It checks each such
// queue with a passive declaration on a channel of its own (a use of the
// queue, but one that is declared again right after anyway).
func (e *engine) withoutExpired(conn *amqp091.Connection, steps []step) []step {
	var gone map[string]bool
	for _, s := range steps {
		if s.kind != stepQueue || s.args["x-expires"] == nil {
			continue
		}
		if exists, err := queueExists(conn, s.name); err == nil && !exists {
			if gone == nil {
				gone = make(map[string]bool)
			}
			gone[s.name] = true
		}
	}
	if gone == nil {
		return steps
	}
	e.mu.Lock()
	for name := range gone {
		if q := e.byName[name]; q != nil {
			for _, w := range q.waitQs {
				gone[w] = true
			}
		}
	}
	e.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(steps), func(s step) bool { return s.kind != stepExchange && gone[s.name] })
}

// noteStepLocked keeps what Publish needs to know of an exchange, and which
// exchange each delay queue delays for. The caller holds topoMu.
func (e *engine) noteStepLocked(s step) {
	if s.kind == stepExchange && !reserved(s.name) && e.exchanges[s.name] == nil {
		e.exchanges[s.name] = &exchangeState{kind: s.xkind}
	}
	if s.kind == stepQueue && strings.HasPrefix(s.name, delayPrefix) {
		e.delays[s.name], _ = s.args["x-dead-letter-exchange"].(string)
	}
}

// recordedLocked reports whether s is recorded already: a queue or an
// exchange of its name, or the same binding. The caller holds topoMu.
func (e *engine) recordedLocked(s step) bool {
	return slices.ContainsFunc(e.steps, func(o step) bool { return sameStep(o, s) })
}

// sameStep reports whether a and b declare the same thing: an exchange or a
// queue of one name (the broker refuses one declared with other arguments),
// or one binding, with the same key and arguments.
func sameStep(a, b step) bool {
	if a.kind != b.kind || a.name != b.name {
		return false
	}
	if a.kind != stepBind {
		return true
	}
	return a.exchange == b.exchange && a.key == b.key && reflect.DeepEqual(a.args, b.args)
}

// removeStepsLocked takes the steps for which drop reports true out of the
// record, so that no later connection declares them again, and returns the
// record as it was, for restoreSteps. The caller holds declMu and topoMu.
func (e *engine) removeStepsLocked(drop func(step) bool) (old []step) {
	old = slices.Clone(e.steps)
	e.steps = slices.DeleteFunc(e.steps, drop)
	return old
}

// restoreSteps puts back the record that removeStepsLocked returned, after
// the broker refused the removal, and declares it again if a reconnect
// since gen may have left it out. The caller holds declMu, so that nothing
// else changed the record meanwhile.
func (e *engine) restoreSteps(old []step, gen uint64) {
	e.topoMu.Lock()
	e.steps = old
	again := e.gen != gen
	e.topoMu.Unlock()
	if !again {
		return
	}
	e.mu.Lock()
	conn := e.pubConn
	e.mu.Unlock()
	if conn != nil {
		e.redeclareQuietly(conn, old)
	}
}

// queueExists reports whether the broker has the queue, with a passive
// declaration on a channel of its own (the broker closes it when it does not).
func queueExists(conn *amqp091.Connection, name string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	switch {
	case err == nil:
		return true, nil
	case amqpCode(err) == amqp091.NotFound:
		return false, nil
	}
	return false, err
}

// probeQueue reports whether the broker has the queue without using it:
// a passive declaration would count as a use of a queue with an expiry and
// start its x-expires again, so that a Stats called every second would keep
// an unused queue forever. It binds the queue to the engine's wait exchange
// with arguments that no message has, and unbinds it again (a binding is no
// use); only when the broker refuses the binding for want of the queue or the
// exchange does it confirm with a passive declaration.
func probeQueue(conn *amqp091.Connection, name string) (bool, error) {
	err := withChannel(conn, func(ch *amqp091.Channel) error {
		if err := ch.QueueBind(name, "", waitExchange, false, probeArgs); err != nil {
			return err
		}
		return ch.QueueUnbind(name, "", waitExchange, probeArgs)
	})
	switch {
	case err == nil:
		return true, nil
	case amqpCode(err) == amqp091.NotFound:
		return queueExists(conn, name)
	}
	return false, err
}

// probeArgs are the arguments of probeQueue's binding: a message matches
// them only if it has the header, which the engine never sets.
var probeArgs = amqp091.Table{"x-match": "all", hdrPrefix + "probe": "never routes"}

// amqpCode returns the AMQP reply code of the broker's error, or 0.
func amqpCode(err error) int {
	var ae *amqp091.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// withChannel runs fn on a channel of its own, which a refusal by the broker
// closes without harming others.
func withChannel(conn *amqp091.Connection, fn func(ch *amqp091.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return fn(ch)
}

// operate runs op on the publishing connection: it waits at most the
// publish timeout for one, and runs op again on the next connection when the
// connection is lost under it, so op must be idempotent. It returns op's
// error otherwise, or why no connection came.
func (e *engine) operate(op func(conn *amqp091.Connection) error) error {
	e.ensureRunning()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.publishTimeout)
	defer cancel()
	var skip uint64
	for {
		conn, gen, err := e.waitConn(ctx, skip)
		if err != nil {
			return err
		}
		if err := op(conn); err == nil || !conn.IsClosed() {
			return err
		}
		skip = gen
	}
}

// declareError says what the broker refused.
func declareError(s step, err error) error {
	var ae *amqp091.Error
	if s.passive && errors.As(err, &ae) && ae.Code == amqp091.NotFound {
		return fmt.Errorf("%w: external exchange %q is not on the broker (its owner declares it): %w", tinymq.ErrUnknownExchange, s.name, err)
	}
	if errors.As(err, &ae) && ae.Code == amqp091.PreconditionFailed {
		if terr := queueTypeError(s, ae); terr != nil {
			return terr
		}
		switch s.kind {
		case stepExchange:
			return fmt.Errorf("%w: exchange %q exists on the broker with another type or other arguments: %w",
				tinymq.ErrExchangeMismatch, s.name, err)
		case stepQueue:
			return fmt.Errorf("%w: queue %q exists on the broker with other arguments (delete it, or change it with a policy): %w",
				tinymq.ErrDuplicateQueue, s.name, err)
		}
	}
	return fmt.Errorf("tinymq/amqp: declaring %v: %w", s, err)
}
