package amqp

import (
	"fmt"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// WithQuorumQueues makes the engine declare every queue it declares as a
// RabbitMQ quorum queue (x-queue-type quorum): the application's queues, and
// the engine's own retry wait queues (tinymq.retry.<queue>.<ms>) and delay
// queues (tinymq.delay.<exchange>.<ms>), which hold messages too (a retry
// waiting for its backoff, a delayed publish). A quorum queue is replicated
// on the nodes of a cluster (Raft), so a message whose Publish returned nil
// survives the loss of a minority of them; give the engine the other nodes
// with [WithNodes] so that it reconnects to one that is up. The engine's two
// exchanges (tinymq.wait, tinymq.requeue) are cluster metadata, on every
// node already.
//
// What changes, on RabbitMQ 3.10 and later:
//   - dead-lettering is at least once (x-dead-letter-strategy at-least-once,
//     which needs x-overflow reject-publish): the broker keeps a dead letter,
//     a message whose retry wait or delay ended, or an expired message, in
//     its queue until the queue it goes to has it, where a classic queue
//     drops it when that queue is full or unreachable. A queue with
//     tinymq.WithMaxLen(n, tinymq.DropHead) and a dead-letter exchange keeps
//     the broker's at-most-once dead-lettering (at-least-once needs
//     reject-publish);
//   - a queue with a dead-letter exchange gets x-delivery-limit 20 (RabbitMQ
//     4's default): a message handed back 20 times without an ack (a
//     consumer that crashes its process, say) is dead-lettered with reason
//     "delivery_limit" instead of being delivered for ever. Every hand back
//     counts (a lost connection, Cancel, PauseQueue, Shutdown), not only
//     crashes; the engine's retries do not (each is a new message). A queue
//     without a dead-letter exchange gets no limit: the broker would drop the
//     message silently;
//   - DeleteQueue with tinymq.IfUnused or tinymq.IfEmpty, which quorum
//     queues do not implement (the broker would close the connection), is
//     checked by the engine with a passive declaration just before an
//     unconditional delete: a consumer or a message arriving in between is
//     deleted with the queue;
//   - a redelivered message carries the broker's x-delivery-count header.
//
// A queue's type cannot change: declaring as quorum a queue the broker has
// as a classic queue (or the other way round) fails with an error wrapping
// [tinymq.ErrDuplicateQueue] that says so. Quorum queues are slower than
// classic ones (each publish is replicated before its confirm): see
// README.md for figures.
func WithQuorumQueues() Option {
	return optionFunc(func(c *config) error {
		c.quorum = true
		return nil
	})
}

// quorumDeliveryLimit is the x-delivery-limit of a quorum queue with a
// dead-letter exchange: RabbitMQ 4's default, generous enough for the hand
// backs of a few reconnects and deploys.
const quorumDeliveryLimit = 20

// userQueueArgs completes the arguments of an application queue with those
// of its type: nothing for a classic queue; for a quorum queue the type, and
// with a dead-letter exchange at-least-once dead-lettering (unless the
// queue drops its head) and the delivery limit.
func (e *engine) userQueueArgs(spec tinymq.QueueSpec, args amqp091.Table) amqp091.Table {
	if !e.cfg.quorum {
		return args
	}
	args["x-queue-type"] = "quorum"
	if spec.DeadLetterExchange != "" {
		args["x-delivery-limit"] = int64(quorumDeliveryLimit)
		if spec.MaxLen == 0 || spec.Overflow == tinymq.RejectPublish {
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish" // at-least-once needs it; no limit without x-max-length
		}
	}
	return args
}

// helperQueueArgs completes the arguments of one of the engine's wait
// queues (a retry's or a delay's): a quorum queue dead-letters its messages
// at least once when their wait ends (its x-overflow only matters with a
// length limit, which it has not).
func (e *engine) helperQueueArgs(args amqp091.Table) amqp091.Table {
	if !e.cfg.quorum {
		return args
	}
	args["x-queue-type"] = "quorum"
	args["x-dead-letter-strategy"] = "at-least-once"
	args["x-overflow"] = "reject-publish"
	return args
}

// nackError is the error of a publish the broker refused (basic.nack). On
// classic queues that is a queue at its length limit with reject-publish;
// a quorum queue also refuses a publish while it has no leader (the node of
// its leader was lost, and the others are electing one: a few seconds).
func (e *engine) nackError() error {
	if e.cfg.quorum {
		return fmt.Errorf("%w: the broker refused the message (a queue at its length limit with reject-publish, or a quorum queue without a leader during a failover: publishing again may then succeed)", tinymq.ErrQueueFull)
	}
	return fmt.Errorf("%w: the broker refused the message (a queue at its length limit with reject-publish)", tinymq.ErrQueueFull)
}

// nackResetEvery bounds how often a nack replaces the publishing channel
// (see afterNack).
const nackResetEvery = time.Second

// afterNack replaces the publishing channel s after a nack, on an engine of
// quorum queues, at most once every nackResetEvery. RabbitMQ 3.10 (measured
// here) has a channel opened while a quorum queue's leader was being lost
// nack every later publish to that queue, long after a new leader was
// elected (over a minute), while a new channel's publishes are acked: the
// channel's view of the queue is stuck. Closing it makes the session open
// another (as after any channel closure), and the publishes waiting on it
// for their confirm are sent again on the new one (at least once). A queue
// that is really full with reject-publish costs a new channel a second.
func (e *engine) afterNack(s *pubSession) {
	if !e.cfg.quorum {
		return
	}
	now := time.Now().UnixNano()
	last := e.nackReset.Load()
	if now-last < int64(nackResetEvery) || !e.nackReset.CompareAndSwap(last, now) {
		return
	}
	e.logWarn("tinymq/amqp: a quorum queue refused a publish; replacing the publishing channel")
	_ = s.ch.Close() // the session sees it closed and opens another
}

// queueTypeError says that the broker has the queue of step s with another
// type than the engine declares, when err is that refusal (406, inequivalent
// x-queue-type); otherwise it returns nil.
func queueTypeError(s step, ae *amqp091.Error) error {
	if s.kind != stepQueue {
		return nil
	}
	if !strings.Contains(ae.Reason, "'x-queue-type'") {
		// The broker names the first argument that differs, which may be one
		// that WithQuorumQueues adds rather than the type.
		for _, k := range []string{"'x-delivery-limit'", "'x-dead-letter-strategy'", "'x-overflow'"} {
			if s.args["x-queue-type"] == "quorum" && strings.Contains(ae.Reason, k) {
				return fmt.Errorf("%w: queue %q exists on the broker with other arguments, perhaps as a classic queue (amqp.WithQuorumQueues declares a quorum queue, with %s; a queue's type cannot change): %w",
					tinymq.ErrDuplicateQueue, s.name, k, ae)
			}
		}
		return nil
	}
	if s.args["x-queue-type"] == "quorum" {
		return fmt.Errorf("%w: queue %q exists on the broker as a classic queue, and amqp.WithQuorumQueues declares a quorum queue; a queue's type cannot change (delete the queue, or move its messages to a new one): %w",
			tinymq.ErrDuplicateQueue, s.name, ae)
	}
	return fmt.Errorf("%w: queue %q exists on the broker as a quorum queue (or of another type), and this engine declares classic queues (use amqp.WithQuorumQueues); a queue's type cannot change: %w",
		tinymq.ErrDuplicateQueue, s.name, ae)
}

// deleteQueue deletes the queue with the broker's if-unused and if-empty,
// except on quorum queues, which do not implement them (RabbitMQ closes the
// connection with 540 NOT_IMPLEMENTED): there it reads the queue's consumers
// and ready messages with a passive declaration and refuses as the broker
// would, then deletes unconditionally. What arrives between the two is
// deleted with the queue.
func (e *engine) deleteQueue(ch *amqp091.Channel, name string, ifUnused, ifEmpty bool) (int, error) {
	if !e.cfg.quorum || !ifUnused && !ifEmpty {
		return ch.QueueDelete(name, ifUnused, ifEmpty, false)
	}
	qi, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	if ifUnused && qi.Consumers > 0 {
		return 0, fmt.Errorf("%w: queue %q has %d consumers", tinymq.ErrInUse, name, qi.Consumers)
	}
	if ifEmpty && qi.Messages > 0 {
		return 0, fmt.Errorf("%w: queue %q has %d ready messages", tinymq.ErrNotEmpty, name, qi.Messages)
	}
	return ch.QueueDelete(name, false, false, false)
}
