package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/amqp"
	"github.com/tinymq/tinymq/amqp/internal/brokertest"
	"github.com/tinymq/tinymq/mqtest"
)

// One cluster of three nodes serves the whole test binary: starting it takes
// about 30 s here (the nodes boot side by side, then two join one at a time).
var sharedCluster struct {
	once sync.Once
	c    *brokertest.Cluster
}

// stopCluster stops the shared cluster, if a test started it (see
// stopBroker).
func stopCluster() {
	if sharedCluster.c != nil {
		sharedCluster.c.Stop()
	}
}

// cluster returns the shared three-node cluster, starting it on first use;
// it skips the test when RabbitMQ is not installed (fails it when CI is
// set).
func cluster(t testing.TB) *brokertest.Cluster {
	t.Helper()
	brokertest.Require(t)
	sharedCluster.once.Do(func() {
		start := time.Now()
		sharedCluster.c = brokertest.StartCluster(t, 3)
		t.Logf("RabbitMQ cluster of 3 nodes ready in %v", time.Since(start).Round(time.Millisecond))
	})
	if sharedCluster.c == nil {
		t.Fatal("the shared cluster failed to start (see the first cluster test's log)")
	}
	return sharedCluster.c
}

// dialLog records the address of the engine's last successful dial: the
// node it is connected to (both its connections go to one node).
type dialLog struct {
	mu   sync.Mutex
	last string
}

func (d *dialLog) dial(network, addr string) (net.Conn, error) {
	conn, err := amqp091.DefaultDial(10*time.Second)(network, addr)
	if err == nil {
		d.mu.Lock()
		d.last = addr
		d.mu.Unlock()
	}
	return conn, err
}

// node returns the index in urls of the node of the last dial, or -1.
func (d *dialLog) node(urls []string) int {
	d.mu.Lock()
	last := d.last
	d.mu.Unlock()
	return slices.IndexFunc(urls, func(u string) bool { return last != "" && strings.Contains(u, "@"+last+"/") })
}

// firstNode rotates the node that each new cluster MQ tries first, so that
// the MQs of a test spread over the nodes (routing and consuming across
// nodes).
var firstNode atomic.Uint32

// newClusterMQ returns an MQ with quorum queues on the shared cluster, given
// every node, stopped when the test ends, and the log of its dials.
func newClusterMQ(t testing.TB, opts ...amqp.Option) (*tinymq.MQ, *dialLog) {
	t.Helper()
	urls := cluster(t).URLs()
	k := int(firstNode.Add(1)) % len(urls)
	urls = append(urls[k:], urls[:k]...)
	dials := new(dialLog)
	opts = append([]amqp.Option{
		amqp.WithQuorumQueues(),
		amqp.WithNodes(urls[1:]...),
		amqp.WithReconnectBackoff(20*time.Millisecond, 500*time.Millisecond),
		amqp.WithAMQPConfig(amqp091.Config{Dial: dials.dial}),
	}, opts...)
	m := tinymq.New(amqp.Engine(urls[0], opts...), tinymq.WithLogger(logger()))
	t.Cleanup(m.Stop)
	return m, dials
}

// TestConformanceOnAClusterWithQuorumQueues runs the conformance suite on
// the three-node cluster, every queue a quorum queue (the wait and delay
// queues included), each MQ trying another node first. Quorum queues need
// one capability of their own: their length limit is approximate
// (ApproximateMaxLen: a queue learns it is full once its replicas agree,
// so a few publishes past the limit are accepted). DeleteQueue's IfUnused
// and IfEmpty, which they do not implement, the engine checks itself (see
// WithQuorumQueues), and the rest maps as on classic queues.
func TestConformanceOnAClusterWithQuorumQueues(t *testing.T) {
	caps := Broker
	caps.ApproximateMaxLen = true
	mqtest.Run(t, func(t *testing.T) *tinymq.MQ {
		m, _ := newClusterMQ(t)
		return m
	}, caps)
}

// TestClusterListensOnLoopbackOnly checks the harness: every node's AMQP and
// distribution ports and the cluster's epmd listen on loopback only, and
// the nodes form one cluster.
func TestClusterListensOnLoopbackOnly(t *testing.T) {
	c := cluster(t)
	out, err := c.Ctl(context.Background(), 0, "cluster_status", "--formatter", "json")
	require.NoError(t, err, out)
	for _, b := range c.Nodes() {
		assert.Contains(t, out, `"`+b.Node()+`"`)
	}
	var ports []int
	for _, b := range c.Nodes() {
		ports = append(ports, b.Ports()...) // AMQP, distribution, the shared epmd
	}
	listensOnLoopbackOnly(t, ports)
}

// TestWithNodesSkipsANodeThatIsDown gives the engine an unreachable first
// URL and a node of the cluster: it connects to the node, and an invalid
// node URL is refused as an invalid option.
func TestWithNodesSkipsANodeThatIsDown(t *testing.T) {
	c := cluster(t)
	n := uniq(t)
	m := tinymq.New(amqp.Engine("amqp://guest:guest@127.0.0.1:1/",
		amqp.WithNodes(c.URLs()[1]), amqp.WithQuorumQueues(), amqp.WithPublishTimeout(30*time.Second)),
		tinymq.WithLogger(logger()))
	defer m.Stop()
	require.NoError(t, m.DeclareQueue(n("q"), n("ex"), tinymq.Fanout))
	require.NoError(t, m.Publish(n("ex"), 1))

	bad := tinymq.New(amqp.Engine(c.URLs()[0], amqp.WithNodes("http://example.com/")))
	defer bad.Stop()
	assert.ErrorIs(t, bad.DeclareExchange(n("bad"), tinymq.Fanout), tinymq.ErrInvalidOption)
}

// TestQuorumQueuesAreDeclaredForEveryQueue checks on the broker that a
// queue, its retry wait queue and a delay queue are quorum queues that
// dead-letter at least once, and that the queue with a dead-letter exchange
// has the delivery limit; and that a queue's type cannot change, either way,
// with an error that says so.
func TestQuorumQueuesAreDeclaredForEveryQueue(t *testing.T) {
	c := cluster(t)
	n := uniq(t)
	m, _ := newClusterMQ(t)
	var calls atomic.Int32
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		if calls.Add(1) == 1 {
			return errors.New("fails once: its retry declares the wait queue")
		}
		return nil
	}, 1, tinymq.WithQueueName(n("q")),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Minute}),
		tinymq.WithDeadLetter(n("dead"), "")))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish(n("ex"), 1, tinymq.WithDelay(time.Minute)))
	require.NoError(t, m.Publish(n("ex"), 2))

	// The retry wait queue is declared at its first use: wait for it.
	var out string
	lines := map[string]string{}
	deadline := time.Now().Add(30 * time.Second)
	for len(lines) < 3 && time.Now().Before(deadline) {
		var err error
		out, err = c.Ctl(context.Background(), 0, "list_queues", "name", "type", "arguments", "--no-table-headers", "--quiet")
		require.NoError(t, err, out)
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], n("")) {
				lines[f[0]] = line
			}
		}
	}
	require.Len(t, lines, 3, "the queue, its retry wait queue and the delay queue:\n%s", out)
	for name, line := range lines {
		assert.Contains(t, line, "quorum", name)
		assert.Contains(t, line, "at-least-once", name)
	}
	assert.Contains(t, lines[n("q")], "x-delivery-limit", "the queue with a dead-letter exchange")

	classic := tinymq.New(amqp.Engine(c.URLs()[0]), tinymq.WithLogger(logger()))
	defer classic.Stop()
	require.NoError(t, classic.DeclareQueue(n("classic"), n("ex2"), tinymq.Fanout))
	quorum, _ := newClusterMQ(t)
	err := quorum.DeclareQueue(n("classic"), n("ex2"), tinymq.Fanout)
	assert.ErrorIs(t, err, tinymq.ErrDuplicateQueue)
	assert.ErrorContains(t, err, "exists on the broker as a classic queue")
	require.NoError(t, quorum.DeclareQueue(n("quorum"), n("ex2"), tinymq.Fanout))
	err = classic.DeclareQueue(n("quorum"), n("ex2"), tinymq.Fanout)
	assert.ErrorIs(t, err, tinymq.ErrDuplicateQueue)
	assert.ErrorContains(t, err, "exists on the broker as a quorum queue")
	// A classic queue with a dead-letter exchange: the broker names another
	// argument first.
	require.NoError(t, classic.DeclareQueue(n("classic.dl"), n("ex2"), tinymq.Fanout, tinymq.WithDeadLetter(n("dead"), "")))
	err = quorum.DeclareQueue(n("classic.dl"), n("ex2"), tinymq.Fanout, tinymq.WithDeadLetter(n("dead"), ""))
	assert.ErrorIs(t, err, tinymq.ErrDuplicateQueue)
	assert.ErrorContains(t, err, "classic queue")
}

// confirm is one publish that returned nil: when it was sent and when its
// Publish returned.
type confirm struct {
	i        int
	sent, at time.Time
}

// TestQuorumQueuesLoseNoConfirmedMessageWhenANodeIsKilled publishes from two
// goroutines and consumes with four workers (every tenth message failing
// its first attempt, so that it waits in the quorum retry wait queue) while
// the node the engine is connected to is killed with SIGKILL, twice: once
// node A, which is then restarted and rejoins, then the node the engine
// went to, B. It checks that publishing resumes on another node within 30 s
// of each kill (and logs how long it took), and that every message whose
// Publish returned nil is consumed at least once (it logs the duplicates).
// Should RabbitMQ's dead-letter worker hold the wait queue's retries after
// the failovers (a RabbitMQ 3.10 defect, see amqp/README.md), the test does
// what that README tells operators to, once, and logs it.
func TestQuorumQueuesLoseNoConfirmedMessageWhenANodeIsKilled(t *testing.T) {
	c := cluster(t)
	urls := c.URLs()
	n := uniq(t)
	const failoverBound = 30 * time.Second

	var mu sync.Mutex
	got := make(map[int]int)
	delivered := make(chan struct{}, 1) // a nudge after each delivery
	m, dials := newClusterMQ(t, amqp.WithPublishTimeout(2*time.Minute))
	require.NoError(t, m.RegisterQueue(n("ex"), tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		var i int
		if err := msg.Data.(tinymq.Encoded).Decode(&i); err != nil {
			return tinymq.Permanent(err)
		}
		if i%10 == 0 && msg.Attempt == 1 {
			return errors.New("the first attempt fails: the retry waits in a quorum queue")
		}
		mu.Lock()
		got[i]++
		mu.Unlock()
		select {
		case delivered <- struct{}{}:
		default:
		}
		return nil
	}, 4, tinymq.WithQueueName(n("q")),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: 200 * time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))

	// The publishers: two goroutines, joined through pubWG.
	var (
		cmu       sync.Mutex
		confirmed []confirm
		failed    []error // ErrUnconfirmed or ErrQueueFull, see below
	)
	progress := make(chan struct{}, 1) // a nudge after each confirm
	fatal := make(chan error, 2)
	stop := make(chan struct{})
	var pubWG sync.WaitGroup
	for p := range 2 {
		pubWG.Add(1)
		go func() {
			defer pubWG.Done()
			for i := p; ; i += 2 {
				select {
				case <-stop:
					return
				default:
				}
				sent := time.Now()
				err := m.Publish(n("ex"), i)
				cmu.Lock()
				switch {
				case err == nil:
					confirmed = append(confirmed, confirm{i: i, sent: sent, at: time.Now()})
				case errors.Is(err, amqp.ErrUnconfirmed), errors.Is(err, tinymq.ErrQueueFull):
					// The outcome is unknown, or the broker refused the
					// message (a quorum queue without a leader nacks):
					// both allowed by the promise, neither counted.
					failed = append(failed, err)
				default:
					cmu.Unlock()
					fatal <- err
					return
				}
				cmu.Unlock()
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	stopPublishers := sync.OnceFunc(func() {
		close(stop)
		pubWG.Wait()
	})
	defer stopPublishers()
	count := func() int {
		cmu.Lock()
		defer cmu.Unlock()
		return len(confirmed)
	}
	// waitUntil waits, at most d, for cond, checked after each confirm.
	waitUntil := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		deadline := time.After(d)
		for !cond() {
			select {
			case <-progress:
			case err := <-fatal:
				t.Fatalf("%s: a publish failed: %v", what, err)
			case <-deadline:
				cmu.Lock()
				nf := len(failed)
				last := ""
				if nf > 0 {
					last = failed[nf-1].Error()
				}
				cmu.Unlock()
				for i := range c.Nodes() {
					if out, err := c.Ctl(context.Background(), i, "list_queues", "name", "type", "leader", "members", "online", "messages"); err == nil {
						t.Logf("node %d's queues:\n%s", i+1, out)
						for j, u := range c.URLs() {
							conn, err := amqp091.Dial(u)
							if err != nil {
								continue
							}
							ch, _ := conn.Channel()
							_ = ch.Confirm(false)
							dc, err := ch.PublishWithDeferredConfirm(n("ex"), "", true, false, amqp091.Publishing{Body: []byte("1")})
							ok := err == nil && dc.Wait()
							t.Logf("a fresh publish on node %d: ack %v (%v)", j+1, ok, err)
							conn.Close()
						}
						break
					}
				}
				t.Fatalf("%s: not within %v (%d confirmed, %d failed, the last with %q)", what, d, count(), nf, last)
			}
		}
	}

	for round := range 2 {
		k := count()
		waitUntil(time.Minute, "before the kill", func() bool { return count() >= k+300 })
		victim := dials.node(urls)
		require.GreaterOrEqual(t, victim, 0, "the engine's node")
		killed := time.Now()
		c.Kill(t, victim)
		var resumed time.Duration
		waitUntil(2*failoverBound, "publishing after the kill", func() bool {
			cmu.Lock()
			defer cmu.Unlock()
			for _, cf := range confirmed[k:] {
				if cf.sent.After(killed) {
					resumed = cf.at.Sub(killed)
					return true
				}
			}
			return false
		})
		now := dials.node(urls)
		t.Logf("round %d: node %d killed; publishing resumed on node %d %v after the kill", round+1, victim+1, now+1, resumed.Round(time.Millisecond))
		assert.Less(t, resumed, failoverBound, "publishing resumes on another node")
		assert.NotEqual(t, victim, now, "the engine reconnected to another node")
		k = count()
		waitUntil(time.Minute, "after the failover", func() bool { return count() >= k+300 })
		restart := time.Now()
		c.Restart(t, victim)
		t.Logf("round %d: node %d restarted in %v", round+1, victim+1, time.Since(restart).Round(time.Millisecond))
	}
	k := count()
	waitUntil(time.Minute, "after the restarts", func() bool { return count() >= k+300 })
	stopPublishers()
	select {
	case err := <-fatal:
		t.Fatalf("a publish failed: %v", err)
	default:
	}

	cmu.Lock()
	want := slices.Clone(confirmed)
	unconfirmed := len(failed)
	kinds := map[string]int{}
	for _, err := range failed {
		kinds[err.Error()]++
	}
	cmu.Unlock()
	var failures []string
	for text, k := range kinds {
		failures = append(failures, fmt.Sprintf("%d× %q", k, text))
	}
	// RabbitMQ 3.10.8 (Debian 12's) sometimes leaves a quorum queue's
	// at-least-once dead-letter worker deaf after the elections of a
	// failover: the wait queue's expired retries stay in it as dead letters
	// (in its message count, neither ready nor unacknowledged) and move only
	// once the queue elects a leader again. They are held by the broker, not
	// lost; amqp/README.md tells operators how to see it and what to do,
	// which is what this does when deliveries stall with dead letters held:
	// restart the node that leads the wait queue, once, and then every
	// confirmed message must arrive.
	deadline := time.After(2 * time.Minute)
	stalled := time.NewTimer(20 * time.Second)
	defer stalled.Stop()
	restarted := false
	for {
		mu.Lock()
		missing, dups := 0, 0
		for _, cf := range want {
			switch c := got[cf.i]; {
			case c == 0:
				missing++
			case c > 1:
				dups += c - 1
			}
		}
		mu.Unlock()
		if missing == 0 {
			t.Logf("%d confirmed messages, all consumed; %d extra deliveries (at least once); %d publishes failed: %s",
				len(want), dups, unconfirmed, failures)
			break
		}
		select {
		case <-delivered:
			stalled.Reset(20 * time.Second)
		case <-stalled.C:
			stalled.Reset(20 * time.Second)
			if restarted {
				continue
			}
			leader, held := heldDeadLetters(t, c, "tinymq.retry."+n("q"))
			if held == 0 {
				continue
			}
			i := slices.IndexFunc(c.Nodes(), func(b *brokertest.Broker) bool { return b.Node() == leader })
			if i < 0 {
				continue
			}
			restarted = true
			t.Logf("%d of %d confirmed messages missing, and for 20 s no delivery: the wait queue holds %d dead letters that its leader, %s, does not move (RabbitMQ 3.10's dead-letter worker after a failover); restarting that node",
				missing, len(want), held, leader)
			c.Nodes()[i].Restart(t)
			deadline = time.After(2 * time.Minute)
		case <-deadline:
			out, _ := c.Ctl(context.Background(), 2, "list_queues", "name", "leader", "online", "messages", "messages_ready", "messages_unacknowledged")
			t.Logf("the queues:\n%s", out)
			t.Fatalf("%d of %d confirmed messages never consumed", missing, len(want))
		}
	}
	m.Stop()
}

// heldDeadLetters returns the leader of each quorum queue whose name starts
// with prefix and that holds messages neither ready nor unacknowledged (dead
// letters its worker has not moved yet), and how many it holds in all; "",
// 0 when there are none, or when the cluster cannot say.
func heldDeadLetters(t *testing.T, c *brokertest.Cluster, prefix string) (leader string, held int) {
	t.Helper()
	for i := range c.Nodes() {
		out, err := c.Ctl(context.Background(), i, "list_queues", "name", "leader", "messages", "messages_ready", "messages_unacknowledged", "--no-table-headers", "--quiet")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) != 5 || !strings.HasPrefix(f[0], prefix) {
				continue
			}
			var total, ready, unacked int
			if _, err := fmt.Sscan(f[2]+" "+f[3]+" "+f[4], &total, &ready, &unacked); err != nil {
				continue
			}
			if h := total - ready - unacked; h > 0 {
				leader, held = f[1], held+h
			}
		}
		return leader, held
	}
	return "", 0
}
