package amqp

import (
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/backoff"
)

// Option configures the engine made by [Engine]. An invalid option does not
// panic: every call of the MQ then returns an error wrapping
// [tinymq.ErrInvalidOption] that names it.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	publishTimeout time.Duration
	reconnect      backoff.Policy // the waits between attempts to connect or consume
	prefetch       int            // 0: each queue's concurrency
	amqp           amqp091.Config
	quorum         bool     // WithQuorumQueues (see quorum.go)
	nodes          []string // WithNodes: the other nodes' URLs (see nodes.go)

	queuePrefetch map[string]int  // WithQueuePrefetch, by queue name; before prefetch
	external      map[string]bool // WithExternalExchanges
	helperLease   time.Duration   // 0: defaultHelperLease; tests shorten it
}

func defaultConfig() config {
	return config{
		publishTimeout: 30 * time.Second,
		reconnect:      reconnectBackoff(100*time.Millisecond, 10*time.Second),
	}
}

// WithPublishTimeout bounds how long one Publish waits for the broker: for a
// connection while the broker is unreachable, then for its confirm. The
// default is 30s; the Publish's own context may end it sooner. Declarations
// (RegisterQueue, Bind, DeclareExchange) wait at most as long for a
// connection. d must be positive.
func WithPublishTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: amqp.WithPublishTimeout(%v): must be positive", tinymq.ErrInvalidOption, d)
		}
		c.publishTimeout = d
		return nil
	})
}

// WithReconnectBackoff sets the waits between attempts to reconnect after the
// connection was lost: the first is about initial, each next one twice the
// last, at most maxWait, each with random jitter (a wait of d becomes a value
// in [d/2, d]). The default is 100ms up to 10s. It needs
// 0 < initial <= maxWait.
func WithReconnectBackoff(initial, maxWait time.Duration) Option {
	return optionFunc(func(c *config) error {
		if initial <= 0 || maxWait < initial {
			return fmt.Errorf("%w: amqp.WithReconnectBackoff(%v, %v): need 0 < initial <= max",
				tinymq.ErrInvalidOption, initial, maxWait)
		}
		c.reconnect = reconnectBackoff(initial, maxWait)
		return nil
	})
}

// reconnectBackoff is the policy of WithReconnectBackoff(initial, maxWait).
func reconnectBackoff(initial, maxWait time.Duration) backoff.Policy {
	return backoff.Policy{Initial: initial, Max: maxWait, Multiplier: 2, Jitter: 0.5}
}

// WithPrefetch sets how many unacknowledged messages the broker hands each
// queue's consumer at once (AMQP basic.qos). By default a queue's prefetch is
// its concurrency, so that each worker has one message and the broker keeps
// the rest for other processes. A larger prefetch saves round trips when
// messages are small and consumers fast. RegisterQueue refuses, with
// [tinymq.ErrInvalidOption], a queue whose concurrency exceeds n: its extra
// workers would never get a message. n must be at least 1.
func WithPrefetch(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: amqp.WithPrefetch(%d): must be at least 1", tinymq.ErrInvalidOption, n)
		}
		c.prefetch = n
		return nil
	})
}

// WithQueuePrefetch sets the prefetch (AMQP basic.qos, see [WithPrefetch])
// of the consumers of one queue, by its name (WithQueueName), in place of
// WithPrefetch's or the queue's concurrency: its RegisterQueue consumer and
// every Consume of it. A queue of slow consumers keeps a prefetch of its
// concurrency, so that other processes get the rest, while one of small
// fast messages saves round trips. RegisterQueue (and Consume) refuse, with
// [tinymq.ErrInvalidOption], a concurrency above n. n must be at least 1 and
// the name not empty; given twice for a queue, the last one counts.
func WithQueuePrefetch(queue string, n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || queue == "" {
			return fmt.Errorf("%w: amqp.WithQueuePrefetch(%q, %d): needs a queue name and n of at least 1", tinymq.ErrInvalidOption, queue, n)
		}
		if c.queuePrefetch == nil {
			c.queuePrefetch = make(map[string]int)
		}
		c.queuePrefetch[queue] = n
		return nil
	})
}

// WithExternalExchanges names exchanges that other services own: the engine
// never declares, changes or deletes them. DeclareExchange, RegisterQueue and
// Bind check with a passive declaration (exchange.declare with passive set)
// that the broker has them, whatever their type and arguments, and fail
// with an error wrapping [tinymq.ErrUnknownExchange] when it has not; a
// Publish to one needs no declaration in this MQ. DeleteExchange of one, and
// WithAlternateExchange on one, are refused with [tinymq.ErrUnsupported].
// The broker's own exchanges (amq.direct, amq.topic, ... and
// [DefaultExchange]) are external without this option: RabbitMQ lets no
// client declare a name starting with "amq.".
func WithExternalExchanges(names ...string) Option {
	return optionFunc(func(c *config) error {
		for _, n := range names {
			if n == "" {
				return fmt.Errorf("%w: amqp.WithExternalExchanges: an empty name (the default exchange is amqp.DefaultExchange)", tinymq.ErrInvalidOption)
			}
			if c.external == nil {
				c.external = make(map[string]bool)
			}
			c.external[n] = true
		}
		return nil
	})
}

// WithAMQPConfig sets the client configuration used to dial the broker: TLS,
// SASL, vhost, heartbeat, a custom Dial. The URL given to [Engine] still
// supplies what the config leaves empty, as amqp091.DialConfig does. Its
// Recovery must be nil: the engine reconnects by itself. The defaults are a
// 10s heartbeat and a 10s connection timeout.
func WithAMQPConfig(cfg amqp091.Config) Option {
	return optionFunc(func(c *config) error {
		if cfg.Recovery != nil {
			return fmt.Errorf("%w: amqp.WithAMQPConfig: Recovery must be nil (the engine reconnects itself)", tinymq.ErrInvalidOption)
		}
		c.amqp = cfg
		return nil
	})
}
