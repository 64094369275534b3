package amqp

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/tinymq/tinymq"
)

// WithNodes gives the engine the AMQP URLs of other nodes of the same
// RabbitMQ cluster, besides the URL given to [Engine]: it connects to the
// first node that accepts a connection, trying them in order (the Engine
// URL first), and when that connection is lost it tries the next node
// first, then the others in turn, each round after the reconnect backoff
// ([WithReconnectBackoff]). On the new node it declares its whole topology
// again and resumes consuming, as after any reconnect; publishes whose
// confirm was lost with the node are sent again (at least once). Each URL is
// a full URL (credentials and vhost included) and must parse; the client
// configuration of [WithAMQPConfig] applies to every node. Pair it with
// [WithQuorumQueues]: a classic queue lives on one node, and is unavailable
// while that node is down. WithNodes does no I/O.
func WithNodes(urls ...string) Option {
	return optionFunc(func(c *config) error {
		for _, u := range urls {
			if _, err := amqp091.ParseURI(u); err != nil {
				return fmt.Errorf("%w: amqp.WithNodes: URL: %w", tinymq.ErrInvalidOption, err)
			}
		}
		c.nodes = append(c.nodes, urls...)
		return nil
	})
}

// nodeCursor is where the supervisor's next connection attempt starts in the
// list of node URLs. Only the supervisor goroutine uses it.
type nodeCursor struct {
	next int
}

// urls returns the node URLs: the Engine URL, then those of WithNodes.
func (e *engine) urls() []string {
	return append([]string{e.url}, e.cfg.nodes...)
}

// dialNode connects to the first node that accepts a connection, starting
// after the node of the last connection, and returns its URL. With one node
// its error is the dial's; with several it names each node's failure (host
// and port, never the credentials). Called by the supervisor only.
func (e *engine) dialNode(purpose string) (string, *amqp091.Connection, error) {
	urls := e.urls()
	errs := make([]error, 0, len(urls))
	for i := range urls {
		k := (e.cursor.next + i) % len(urls)
		conn, err := e.dial(urls[k], purpose)
		if err == nil {
			e.cursor.next = (k + 1) % len(urls) // after a loss, another node first
			return urls[k], conn, nil
		}
		if len(urls) == 1 {
			return "", nil, err
		}
		errs = append(errs, fmt.Errorf("node %s: %w", nodeAddr(urls[k]), err))
	}
	return "", nil, errors.Join(errs...)
}

// nodeAddr is the host and port of an AMQP URL, for errors and logs.
func nodeAddr(url string) string {
	u, err := amqp091.ParseURI(url)
	if err != nil {
		return "?"
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}
