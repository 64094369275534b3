// Package brokertest starts a throwaway RabbitMQ node for tests: bound to
// 127.0.0.1 only, with its own temporary data folder, its own epmd on a
// private port, and its own AMQP and distribution ports. It needs the Debian
// rabbitmq-server package (see ../../install-rabbitmq.sh).
//
// When the broker's binaries are missing, Start skips the test saying why, or,
// when the environment variable CI is set to a true value, fails it: on CI a
// missing broker is a broken setup, not a reason to test less.
package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// Paths of the broker's own scripts: the /usr/sbin wrappers switch to the
// rabbitmq user and change HOME, which would split the Erlang cookie of the
// server from that of the CLI.
const (
	ServerBin = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	CtlBin    = "/usr/lib/rabbitmq/bin/rabbitmqctl"
)

// StartTimeout bounds the wait for a node to accept AMQP connections. The
// notes measured 6-8 s here, up to 20 s on a loaded machine.
var StartTimeout = 90 * time.Second

// Broker is one running node. Its methods are safe for concurrent use.
type Broker struct {
	dir      string
	home     string // HOME (its .erlang.cookie): dir, or a cluster's folder
	amqpPort int
	distPort int
	epmdPort int
	node     string

	mu     sync.Mutex
	epmd   *exec.Cmd
	server *exec.Cmd
	waited chan struct{} // closed when server exits
	log    *bytes.Buffer // the server's stdout and stderr
}

// Available reports whether the broker's binaries are installed, and if not,
// why.
func Available() (bool, string) {
	for _, p := range []string{ServerBin, CtlBin} {
		if _, err := os.Stat(p); err != nil {
			return false, fmt.Sprintf("RabbitMQ is not installed (%s: %v); run amqp/install-rabbitmq.sh", p, err)
		}
	}
	if _, err := exec.LookPath("epmd"); err != nil {
		return false, "epmd (Erlang) is not on PATH; run amqp/install-rabbitmq.sh"
	}
	return true, ""
}

// Require skips tb when the broker cannot run here, or fails it on CI.
func Require(tb testing.TB) {
	tb.Helper()
	if ok, why := Available(); !ok {
		if onCI() {
			tb.Fatalf("CI is set and the broker cannot run: %s", why)
		}
		tb.Skip(why)
	}
}

func onCI() bool {
	v, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && v
}

// Start starts a node and waits until it accepts AMQP connections. It calls
// Require first. The caller must call Stop; Start arranges nothing itself, so
// that one node can serve a whole test binary.
func Start(tb testing.TB) *Broker {
	tb.Helper()
	Require(tb)
	b, err := start()
	if err != nil {
		tb.Fatalf("starting RabbitMQ: %v", err)
	}
	return b
}

// StartNode is Start for programs: it returns an error where Start would
// skip or fail a test. The caller must call Stop.
func StartNode() (*Broker, error) {
	if ok, why := Available(); !ok {
		return nil, errors.New(why)
	}
	return start()
}

func start() (*Broker, error) {
	dir, err := os.MkdirTemp("", "tinymq-rabbitmq-")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &Broker{
		dir:      dir,
		amqpPort: ports[0],
		distPort: ports[1],
		epmdPort: ports[2],
		node:     fmt.Sprintf("tinymq%d@localhost", ports[0]),
	}
	if err := b.writeFiles(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := b.startEpmd(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := b.startServer(); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// writeFiles makes the node's data and log folders and its configuration
// files in its folder, so that nothing of /etc/rabbitmq is read.
func (b *Broker) writeFiles() error {
	for _, sub := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(b.dir, sub), 0o700); err != nil {
			return err
		}
	}
	files := map[string]string{
		"rabbitmq.conf":     "loopback_users.guest = true\n",
		"rabbitmq-env.conf": "",
		"enabled_plugins":   "[].\n",
		"advanced.config":   "[].\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(b.dir, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// URL is the node's AMQP URL, as guest on 127.0.0.1.
func (b *Broker) URL() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", b.amqpPort)
}

// Ports returns the node's AMQP, distribution and epmd ports.
func (b *Broker) Ports() []int { return []int{b.amqpPort, b.distPort, b.epmdPort} }

// Node is the node's Erlang name, as name@localhost.
func (b *Broker) Node() string { return b.node }

func (b *Broker) env() []string {
	kernel := "-kernel inet_dist_use_interface {127,0,0,1}"
	home := b.home
	if home == "" {
		home = b.dir
	}
	return append(os.Environ(),
		"HOME="+home,
		"RABBITMQ_NODENAME="+b.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(b.amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(b.distPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT="+strconv.Itoa(b.epmdPort),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+kernel,
		"RABBITMQ_CTL_ERL_ARGS="+kernel,
		"RABBITMQ_MNESIA_BASE="+filepath.Join(b.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(b.dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_CONFIG_FILE="+filepath.Join(b.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(b.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(b.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(b.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(b.dir, "rabbitmq.pid"),
	)
}

// startEpmd starts a private epmd in the foreground, so that its PID is ours
// to stop, and waits until it listens; a node started before that would
// start a daemon epmd of its own that nobody stops.
func (b *Broker) startEpmd() error {
	path, err := exec.LookPath("epmd")
	if err != nil {
		return err
	}
	cmd := exec.Command(path, "-port", strconv.Itoa(b.epmdPort), "-address", "127.0.0.1")
	cmd.Env = b.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("epmd: %w", err)
	}
	b.epmd = cmd
	if err := waitListening(b.epmdPort, 10*time.Second); err != nil {
		return fmt.Errorf("epmd: %w", err)
	}
	return nil
}

func (b *Broker) startServer() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cmd := exec.Command(ServerBin)
	cmd.Env = b.env()
	cmd.Dir = b.dir
	log := new(bytes.Buffer)
	w := &lockedWriter{buf: log}
	cmd.Stdout, cmd.Stderr = w, w
	// Its own process group: the script runs erl as a child, and a stuck
	// node is then killed with every process it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rabbitmq-server: %w", err)
	}
	waited := make(chan struct{})
	go func() { // joined by stopServer, which waits for waited
		_ = cmd.Wait()
		close(waited)
	}()
	b.server, b.waited, b.log = cmd, waited, log
	if err := b.awaitAMQP(waited); err != nil {
		return fmt.Errorf("%w\n--- server output:\n%s", err, w.String())
	}
	return nil
}

// awaitAMQP dials until the node accepts an AMQP connection.
func (b *Broker) awaitAMQP(exited <-chan struct{}) error {
	deadline := time.Now().Add(StartTimeout)
	for {
		conn, err := amqp091.DialConfig(b.URL(), amqp091.Config{Dial: amqp091.DefaultDial(2 * time.Second)})
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not AMQP-ready after %v: %w", StartTimeout, err)
		}
		select {
		case <-exited:
			return errors.New("rabbitmq-server exited before it was ready")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Restart stops the node and starts it again on the same ports and data
// folder, so durable queues and persistent messages survive. Clients see
// their connections close.
func (b *Broker) Restart(tb testing.TB) {
	tb.Helper()
	b.stopServer()
	if err := b.startServer(); err != nil {
		tb.Fatalf("restarting RabbitMQ: %v", err)
	}
}

// StopServer stops the node, leaving epmd and the data folder for
// StartServer. Clients see their connections close.
func (b *Broker) StopServer() { b.stopServer() }

// StartServer starts the node stopped by StopServer and waits until it is
// AMQP-ready.
func (b *Broker) StartServer(tb testing.TB) {
	tb.Helper()
	if err := b.startServer(); err != nil {
		tb.Fatalf("starting RabbitMQ again: %v", err)
	}
}

// stopServer stops the node by its PID: SIGTERM to the script, which stops
// the node gracefully; SIGKILL to its process group if that takes too long.
func (b *Broker) stopServer() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.server == nil {
		return
	}
	pid := b.server.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-b.waited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-b.waited
	}
	// The script is gone; make sure nothing it started outlives it.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	b.server = nil
}

// Stop stops the node and its epmd and removes the data folder. It is
// idempotent.
func (b *Broker) Stop() {
	b.stopServer()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.epmd != nil {
		_ = b.epmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = b.epmd.Wait(); close(done) }() // joined just below
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-b.epmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		b.epmd = nil
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
		b.dir = ""
	}
}

// Log returns what the node has written so far, for a failing test.
func (b *Broker) Log() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.log == nil {
		return ""
	}
	return (&lockedWriter{buf: b.log}).String()
}

// Ctl runs rabbitmqctl against the node with a timeout and returns its
// output.
func (b *Broker) Ctl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, CtlBin, append([]string{"-n", b.node}, args...)...)
	cmd.Env = b.env()
	cmd.Dir = b.dir
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func waitListening(port int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // polling a port: nothing to wait on
	}
}

// lockedWriter collects a child's output; os/exec copies from two pipes on
// two goroutines.
type lockedWriter struct {
	buf *bytes.Buffer
}

var logMu sync.Mutex

func (w *lockedWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	return w.buf.Write(p)
}

func (w *lockedWriter) String() string {
	logMu.Lock()
	defer logMu.Unlock()
	return w.buf.String()
}
