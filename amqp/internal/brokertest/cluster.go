package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cluster is a RabbitMQ cluster of nodes on 127.0.0.1: each node has its own
// AMQP and distribution ports and its own data folder; they share one
// private epmd, on a private port, and one HOME, with its Erlang cookie.
// Nodes are named n1@localhost, n2@localhost, ... (the names are private to
// the cluster's epmd). Its methods are safe for concurrent use, except on
// the same node.
type Cluster struct {
	holder *Broker // owns the epmd and the shared folder; runs no server
	nodes  []*Broker
}

// StartCluster starts n nodes side by side, joins nodes 2..n to node 1
// (rabbitmqctl stop_app, join_cluster, start_app) and waits until every node
// accepts AMQP connections. It calls Require first. The caller must call
// Stop.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	Require(tb)
	c, err := startCluster(n)
	if err != nil {
		tb.Fatalf("starting a RabbitMQ cluster of %d nodes: %v", n, err)
	}
	return c
}

// clusterAdvanced is the cluster nodes' advanced.config. A quorum queue that
// dead-letters at least once (x-dead-letter-strategy at-least-once) sends
// its dead letters again when their target did not confirm them within
// dead_letter_worker_publisher_confirm_timeout, 3 minutes by default; a
// failover (the target's leader lost) leaves them unconfirmed, so the
// default holds them for minutes. 5 s keeps the tests short, and is what
// README.md advises for a cluster.
const clusterAdvanced = "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].\n"

func startCluster(n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("brokertest: a cluster needs at least one node, not %d", n)
	}
	home, err := os.MkdirTemp("", "tinymq-rabbitmq-cluster-")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1 + 2*n)
	if err != nil {
		os.RemoveAll(home)
		return nil, err
	}
	c := &Cluster{holder: &Broker{dir: home, home: home, epmdPort: ports[0]}}
	// One cookie for every node and for the CLI, written before any node
	// starts: nodes starting side by side would each make one of their own.
	cookie := make([]byte, 16)
	_, _ = rand.Read(cookie)
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(strings.ToUpper(hex.EncodeToString(cookie))), 0o400); err != nil {
		c.holder.Stop()
		return nil, err
	}
	for i := range n {
		b := &Broker{
			dir:      filepath.Join(home, "n"+strconv.Itoa(i+1)),
			home:     home,
			amqpPort: ports[1+2*i],
			distPort: ports[2+2*i],
			epmdPort: ports[0],
			node:     fmt.Sprintf("n%d@localhost", i+1),
		}
		if err := os.Mkdir(b.dir, 0o700); err != nil {
			c.holder.Stop()
			return nil, err
		}
		if err := b.writeFiles(); err != nil {
			c.holder.Stop()
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(b.dir, "advanced.config"), []byte(clusterAdvanced), 0o600); err != nil {
			c.holder.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, b)
	}
	if err := c.holder.startEpmd(); err != nil {
		c.holder.Stop()
		return nil, err
	}
	// Boot every node at once: on this 2-core machine that roughly halves the
	// start of three nodes.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, b := range c.nodes {
		wg.Add(1)
		go func() { // joined just below
			defer wg.Done()
			errs[i] = b.startServer()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Stop()
		return nil, err
	}
	// Join one at a time: each join changes the cluster's schema.
	seed := c.nodes[0].node
	for _, b := range c.nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", seed}, {"start_app"}} {
			if out, err := b.Ctl(context.Background(), args...); err != nil {
				c.Stop()
				return nil, fmt.Errorf("node %s: rabbitmqctl %s: %w\n%s", b.node, strings.Join(args, " "), err, out)
			}
		}
		if err := b.awaitAMQP(b.exited()); err != nil {
			c.Stop()
			return nil, fmt.Errorf("node %s after joining: %w", b.node, err)
		}
	}
	return c, nil
}

// Nodes returns the cluster's nodes, node 1 first.
func (c *Cluster) Nodes() []*Broker { return c.nodes }

// URLs returns the nodes' AMQP URLs, node 1 first.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, b := range c.nodes {
		urls[i] = b.URL()
	}
	return urls
}

// EpmdPort is the port of the cluster's epmd.
func (c *Cluster) EpmdPort() int { return c.holder.epmdPort }

// Kill kills node i (0-based) with SIGKILL, with no chance to say goodbye,
// as a crashed machine would: the signal goes to the process group of its
// rabbitmq-server script, which holds the Erlang VM (beam) the script
// started, and Kill waits until that VM is gone. Its data folder stays, for
// Restart.
func (c *Cluster) Kill(tb testing.TB, i int) {
	tb.Helper()
	if err := c.nodes[i].kill(); err != nil {
		tb.Fatalf("killing node %s: %v", c.nodes[i].node, err)
	}
}

// Restart starts node i again on its ports and data folder, after Kill; it
// rejoins the cluster by itself (its data folder remembers it), and Restart
// waits until it accepts AMQP connections.
func (c *Cluster) Restart(tb testing.TB, i int) {
	tb.Helper()
	if err := c.nodes[i].startServer(); err != nil {
		tb.Fatalf("restarting node %s: %v", c.nodes[i].node, err)
	}
}

// Ctl runs rabbitmqctl against node i.
func (c *Cluster) Ctl(ctx context.Context, i int, args ...string) (string, error) {
	return c.nodes[i].Ctl(ctx, args...)
}

// Stop stops every node (side by side), then the epmd, and removes the
// cluster's folder. It is idempotent.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, b := range c.nodes {
		wg.Add(1)
		go func() { // joined just below
			defer wg.Done()
			b.stopServer()
		}()
	}
	wg.Wait()
	c.holder.Stop()
}

// exited returns a channel closed when the node's server exits, or one
// already closed when it is not running.
func (b *Broker) exited() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waited == nil || b.server == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return b.waited
}

// kill sends SIGKILL to the node's process group (the script, the Erlang VM
// and its helpers) and waits until the script was reaped and the VM, whose
// OS PID the node wrote to its pid file, is gone.
func (b *Broker) kill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.server == nil {
		return errors.New("the node is not running")
	}
	beam := 0
	if text, err := os.ReadFile(filepath.Join(b.dir, "rabbitmq.pid")); err == nil {
		beam, _ = strconv.Atoi(strings.TrimSpace(string(text)))
	}
	pid := b.server.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL to process group %d: %w", pid, err)
	}
	select {
	case <-b.waited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("the rabbitmq-server script (PID %d) did not exit after SIGKILL", pid)
	}
	b.server = nil
	if beam == 0 {
		return errors.New("no Erlang VM PID in the node's pid file")
	}
	deadline := time.Now().Add(30 * time.Second)
	for alive(beam) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the Erlang VM (PID %d) is still alive after SIGKILL", beam)
		}
		time.Sleep(20 * time.Millisecond) // polling a process: nothing to wait on
	}
	return nil
}

// alive reports whether process pid runs (not gone, not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(stat)
	if k := strings.LastIndexByte(s, ')'); k >= 0 && k+2 < len(s) {
		return s[k+2] != 'Z' && s[k+2] != 'X'
	}
	return true
}
