package amqp_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBrokerListensOnLoopbackOnly checks the test harness itself: the node,
// its distribution port and its epmd listen on 127.0.0.1 or ::1 only, and
// rabbitmqctl reaches the node (same HOME, same cookie).
func TestBrokerListensOnLoopbackOnly(t *testing.T) {
	b := broker(t)
	out, err := b.Ctl(context.Background(), "list_queues", "name")
	require.NoError(t, err, out)

	listensOnLoopbackOnly(t, b.Ports())
}

// listensOnLoopbackOnly checks that something listens on each port, on
// 127.0.0.1 or ::1 only.
func listensOnLoopbackOnly(t *testing.T, ports []int) {
	t.Helper()
	ss, err := exec.Command("ss", "-ltn").CombinedOutput()
	if err != nil {
		t.Skipf("ss is not available: %v", err)
	}
	for _, port := range ports {
		suffix := ":" + strconv.Itoa(port)
		var locals []string
		for _, line := range strings.Split(string(ss), "\n") {
			if f := strings.Fields(line); len(f) >= 4 && strings.HasSuffix(f[3], suffix) {
				locals = append(locals, f[3])
			}
		}
		if assert.NotEmpty(t, locals, "nothing listens on port %d", port) {
			for _, l := range locals {
				assert.True(t, strings.HasPrefix(l, "127.0.0.1:") || strings.HasPrefix(l, "[::1]:"),
					"port %d listens on %s, beyond loopback", port, l)
			}
		}
	}
}
