package amqp

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
)

// TestShutdownEndsADeclarationWaitingForTheBroker is the engine's half of
// the promise that a declaration waiting for the broker does not hold
// Shutdown past its deadline: once Shutdown begins, the declaration returns
// ErrStopped at once. (Through an MQ, the core must let the engine's Shutdown
// begin while the declaration holds the MQ's lock; see
// TestShutdownKeepsItsDeadlineWhileADeclarationWaitsForTheBroker.)
func TestShutdownEndsADeclarationWaitingForTheBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close()) // nothing listens: the broker is down
	e := newEngine(fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
		WithPublishTimeout(20*time.Second), WithReconnectBackoff(20*time.Millisecond, 100*time.Millisecond))
	e.Init(tinymq.EngineConfig{})
	declared := make(chan error, 1)
	go func() { declared <- e.DeclareExchange(tinymq.ExchangeSpec{Name: "ex", Kind: tinymq.Fanout}) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		failed := e.lastErr != nil
		e.mu.Unlock()
		if failed {
			break // the declaration started the engine, which found no broker
		}
		require.True(t, time.Now().Before(deadline), "the engine never tried to connect")
		<-time.After(10 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	assert.NoError(t, e.Shutdown(ctx))
	assert.Less(t, time.Since(start), time.Second, "nothing was left to wait for")
	select {
	case err := <-declared:
		assert.ErrorIs(t, err, tinymq.ErrStopped)
	case <-time.After(100 * time.Millisecond):
		t.Error("the declaration under way outlived Shutdown")
		<-declared
	}
	assert.ErrorIs(t, e.DeclareExchange(tinymq.ExchangeSpec{Name: "ex2", Kind: tinymq.Fanout}), tinymq.ErrStopped,
		"a call after Shutdown began is refused")
}
