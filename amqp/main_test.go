package amqp_test

import (
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
	"github.com/tinymq/tinymq/amqp/internal/brokertest"
)

// One broker serves the whole test binary: starting a node takes seconds.
var shared struct {
	once   sync.Once
	broker *brokertest.Broker
	err    error
}

// stopBroker wraps testing.M so that the broker stops after the tests and
// before goleak looks for leaked goroutines.
type stopBroker struct{ *testing.M }

func (s stopBroker) Run() int {
	defer func() {
		if shared.broker != nil {
			shared.broker.Stop()
		}
	}()
	defer stopCluster()
	return s.M.Run()
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopBroker{m})
}

// broker returns the shared broker, starting it on first use; it skips the
// test when RabbitMQ is not installed (fails it when CI is set).
func broker(t testing.TB) *brokertest.Broker {
	t.Helper()
	brokertest.Require(t)
	shared.once.Do(func() {
		start := time.Now()
		shared.broker = brokertest.Start(t)
		t.Logf("RabbitMQ node %s ready in %v", shared.broker.Node(), time.Since(start).Round(time.Millisecond))
	})
	if shared.broker == nil {
		t.Fatal("the shared broker failed to start (see the first test's log)")
	}
	return shared.broker
}

// logger discards unless TINYMQ_TEST_LOG is set: engines log after tests end.
func logger() *slog.Logger {
	if os.Getenv("TINYMQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newMQ returns an MQ on the shared broker, stopped when the test ends.
func newMQ(t testing.TB, opts ...amqp.Option) *tinymq.MQ {
	t.Helper()
	b := broker(t)
	opts = append([]amqp.Option{amqp.WithReconnectBackoff(20*time.Millisecond, 500*time.Millisecond)}, opts...)
	m := tinymq.New(amqp.Engine(b.URL(), opts...), tinymq.WithLogger(logger()))
	t.Cleanup(m.Stop)
	return m
}
