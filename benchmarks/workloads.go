package benchmarks

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Timeout bounds every wait for deliveries: a system that loses messages is
// reported, not waited for forever.
var Timeout = 2 * time.Minute

// waiter counts deliveries and closes done at want.
type waiter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func newWaiter(want int) *waiter { return &waiter{want: int64(want), done: make(chan struct{})} }

func (w *waiter) add() {
	if w.n.Add(1) == w.want {
		close(w.done)
	}
}

func (w *waiter) wait() error {
	select {
	case <-w.done:
		return nil
	case <-time.After(Timeout):
		return fmt.Errorf("lost messages: %d of %d delivered after %v", w.n.Load(), w.want, Timeout)
	}
}

// Throughput publishes n 64-byte messages from pubs goroutines to subs
// subscribers, and returns the time per published message until every
// subscriber has received every message.
func Throughput(sys System, subs, pubs, n int) (time.Duration, error) {
	w := newWaiter(n * subs)
	p, err := sys.Fanout(subs, 0, func(int, []byte) { w.add() })
	if err != nil {
		return 0, err
	}
	payload := make([]byte, 64)
	start := time.Now()
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for g := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += pubs {
				if err := p.Publish(payload); err != nil {
					pubErr.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
		p.Close()
		return 0, err
	}
	return finish(p, w, start, n)
}

// finish waits for every delivery, closes p, and returns the time per message
// since start.
func finish(p Pipeline, w *waiter, start time.Time, n int) (time.Duration, error) {
	err := w.wait()
	elapsed := time.Since(start)
	p.Close()
	return elapsed / time.Duration(n), err
}

// TopicKey is the routing key of message i with the given number of bindings:
// it matches the binding "device.<k>.*" of exactly one subscriber.
func TopicKey(i, bindings int) string {
	return "device." + strconv.Itoa((i*7919)%bindings) + ".temperature"
}

// Topic publishes n messages through pattern routing with the given number of
// bindings, each matching one, and returns the time per message delivered.
func Topic(sys System, bindings, n int) (time.Duration, error) {
	w := newWaiter(n)
	p, err := sys.Topic(bindings, func(int, []byte) { w.add() })
	if err != nil {
		return 0, err
	}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = TopicKey(i, bindings)
	}
	payload := make([]byte, 64)
	start := time.Now()
	for i := range n {
		if err := p.PublishKey(keys[i%len(keys)], payload); err != nil {
			p.Close()
			return 0, err
		}
	}
	return finish(p, w, start, n)
}

// Latencies are percentiles of end-to-end latency.
type Latencies struct {
	P50, P99, P999 time.Duration
}

func percentiles(d []time.Duration) Latencies {
	slices.Sort(d)
	at := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return Latencies{at(0.50), at(0.99), at(0.999)}
}

// base is the origin of the timestamps carried in latency payloads.
var base = time.Now()

// Latency publishes at a steady rate (messages per second) for the given
// duration to one subscriber, each message carrying its send time, and
// returns the percentiles of publish -> handler latency.
func Latency(sys System, rate int, duration time.Duration) (Latencies, error) {
	n := int(float64(rate) * duration.Seconds())
	lat := make([]time.Duration, n)
	w := newWaiter(n)
	var idx atomic.Int64
	p, err := sys.Fanout(1, 0, func(_ int, b []byte) {
		sent := time.Duration(binary.LittleEndian.Uint64(b))
		lat[idx.Add(1)-1] = time.Since(base) - sent
		w.add()
	})
	if err != nil {
		return Latencies{}, err
	}
	interval := time.Second / time.Duration(rate)
	start := time.Since(base)
	for i := range n {
		target := start + time.Duration(i)*interval
		for {
			now := time.Since(base)
			if now >= target {
				break
			}
			if target-now > 200*time.Microsecond {
				time.Sleep(target - now - 100*time.Microsecond)
			} else {
				runtime.Gosched()
			}
		}
		b := make([]byte, 64)
		binary.LittleEndian.PutUint64(b, uint64(time.Since(base)))
		if err := p.Publish(b); err != nil {
			p.Close()
			return Latencies{}, err
		}
	}
	err = w.wait()
	p.Close()
	if err != nil {
		return Latencies{}, err
	}
	return percentiles(lat), nil
}

// PingPong publishes one message at a time and waits until the subscriber has
// it before the next: the hand-off latency of an idle system.
func PingPong(sys System, n int) (Latencies, error) {
	back := make(chan struct{}, 1)
	p, err := sys.Fanout(1, 0, func(int, []byte) { back <- struct{}{} })
	if err != nil {
		return Latencies{}, err
	}
	payload := make([]byte, 64)
	rtt := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if err := p.Publish(payload); err != nil {
			p.Close()
			return Latencies{}, err
		}
		select {
		case <-back:
		case <-time.After(Timeout):
			p.Close()
			return Latencies{}, fmt.Errorf("ping %d lost", i)
		}
		rtt[i] = time.Since(start)
	}
	p.Close()
	return percentiles(rtt), nil
}

// Memory is what queueing messages behind a stalled consumer costs.
type Memory struct {
	BytesPerMsg    float64       // heap growth per queued message, payload included
	PeakRSS        int64         // peak resident memory growth, bytes
	RetainedPerMsg float64       // heap still held per message once drained
	HeapRatio      float64       // heap after draining / heap before
	Publish        time.Duration // time to publish them all
}

// MemoryQueued publishes n messages of 100 bytes (each its own buffer,
// published once and shared by the subscribers) to subs fanout subscribers
// that are stalled until all are published, then lets them drain. The figures
// per message are per published message, whatever subs is.
func MemoryQueued(sys System, n, subs int) (Memory, error) {
	gate := make(chan struct{})
	w := newWaiter(n * subs)
	runtime.GC()
	debug.FreeOSMemory()
	before := heapAlloc()
	resetPeakRSS()
	rss0 := procStatus("VmRSS")
	p, err := sys.Fanout(subs, n, func(int, []byte) {
		<-gate
		w.add()
	})
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	start := time.Now()
	var published atomic.Int64
	pubDone := make(chan error, 1)
	go func() {
		for range n {
			if err := p.Publish(make([]byte, 100)); err != nil {
				pubDone <- err
				return
			}
			published.Add(1)
		}
		pubDone <- nil
	}()
	// A publisher that makes no progress for a while waits for the stalled
	// consumer: report it rather than deadlock.
	for last := int64(-1); ; {
		select {
		case err := <-pubDone:
			if err != nil {
				close(gate)
				p.Close()
				return Memory{}, err
			}
		case <-time.After(5 * time.Second):
			if k := published.Load(); k != last {
				last = k
				continue
			}
			close(gate)
			<-pubDone
			_ = w.wait()
			p.Close()
			return Memory{}, fmt.Errorf("the publisher blocks behind a stalled consumer: it stopped after %d messages", published.Load())
		}
		break
	}
	m.Publish = time.Since(start)
	runtime.GC()
	queued := heapAlloc()
	m.BytesPerMsg = float64(queued-before) / float64(n)
	close(gate)
	err = w.wait()
	m.PeakRSS = procStatus("VmHWM") - rss0
	runtime.GC()
	debug.FreeOSMemory()
	after := heapAlloc()
	m.RetainedPerMsg = float64(after-before) / float64(n)
	m.HeapRatio = float64(after) / float64(before)
	p.Close()
	return m, err
}

func heapAlloc() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// resetPeakRSS makes VmHWM start again from the current RSS (Linux).
func resetPeakRSS() {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// procStatus reads a "kB" field of /proc/self/status, in bytes; 0 if absent.
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
