package tinymq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tinymq/tinymq"
)

// BenchmarkDurablePublish measures confirmed publishes to a durable queue
// (Publish returns once an fdatasync covers the message) with 1 to 256
// concurrent publishers, beside two floors on the same disk in the same run:
// "rawgroup", a bare append + fdatasync loop where concurrent writers share
// syncs (the best any group-committing log can do), and "fsync", one write
// and fdatasync per message (what a log without group commit does). Each
// reports msgs/s and the p99 latency of one publish, in a steady state (after
// the same warm-up for each). 256-byte payloads.
//
//	go test -c -o durable.test .
//	for i in $(seq 9); do ./durable.test -test.run '^$' -test.bench DurablePublish -test.benchtime 20000x; done | tee durable.txt
//	benchstat -col /impl durable.txt
//
// (A loop rather than -count 9, which would run each system 9 times in a row:
// on a shared machine, only alternating runs compare.)
func BenchmarkDurablePublish(b *testing.B) {
	payload := make([]byte, 256)
	for _, publishers := range []int{1, 8, 64, 256} {
		for _, impl := range []string{"tinymq", "rawgroup", "fsync"} {
			if impl == "fsync" && publishers > 1 {
				continue // one sync per message whatever the concurrency
			}
			b.Run(fmt.Sprintf("publishers=%d/impl=%s", publishers, impl), func(b *testing.B) {
				var publish func([]byte) error
				var closeFn func()
				switch impl {
				case "tinymq":
					m := tinymq.New(tinymq.WithDataDir(b.TempDir()))
					err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 4,
						tinymq.WithQueueName("q"), tinymq.WithDurable())
					if err != nil {
						b.Fatal(err)
					}
					if err := m.Start(context.Background()); err != nil {
						b.Fatal(err)
					}
					publish = func(p []byte) error { return m.Publish("ev", p) }
					closeFn = m.Stop
				case "rawgroup":
					g := newRawGroup(b)
					publish, closeFn = g.append, g.close
				case "fsync":
					f := openRaw(b)
					var mu sync.Mutex
					publish = func(p []byte) error {
						mu.Lock()
						defer mu.Unlock()
						if _, err := f.Write(p); err != nil {
							return err
						}
						return syscall.Fdatasync(int(f.Fd()))
					}
					closeFn = func() { f.Close() }
				}
				defer closeFn()
				lat := make([][]time.Duration, publishers)
				run := func(per int) {
					var wg sync.WaitGroup
					for i := range publishers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							l := make([]time.Duration, 0, per)
							for range per {
								t0 := time.Now()
								if err := publish(payload); err != nil {
									b.Error(err)
									return
								}
								l = append(l, time.Since(t0))
							}
							lat[i] = l
						}()
					}
					wg.Wait()
				}
				// Steady state: the same warm-up for every impl (files created,
				// the log's group size and ID reservations settled).
				run(max(10, 2000/publishers))
				b.ResetTimer()
				start := time.Now()
				run(b.N/publishers + 1)
				elapsed := time.Since(start)
				b.StopTimer()
				all := slices.Concat(lat...)
				slices.Sort(all)
				b.ReportMetric(float64(len(all))/elapsed.Seconds(), "msgs/s")
				if len(all) > 0 {
					b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
				}
			})
		}
	}
}

func openRaw(b *testing.B) *os.File {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	return f
}

// rawGroup is a bare group commit: writers queue their record, one
// goroutine writes everything queued at once, fdatasyncs, and answers all.
type rawGroup struct {
	reqs chan rawReq
	done chan struct{}
}

type rawReq struct {
	p   []byte
	ack chan error
}

func newRawGroup(b *testing.B) *rawGroup {
	f := openRaw(b)
	g := &rawGroup{reqs: make(chan rawReq, 1024), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		defer f.Close()
		var buf []byte
		var acks []chan error
		for r := range g.reqs {
			buf, acks = append(buf[:0], r.p...), append(acks[:0], r.ack)
		more:
			for {
				select {
				case r, ok := <-g.reqs:
					if !ok {
						break more
					}
					buf, acks = append(buf, r.p...), append(acks, r.ack)
				default:
					break more
				}
			}
			_, err := f.Write(buf)
			if err == nil {
				err = syscall.Fdatasync(int(f.Fd()))
			}
			for _, a := range acks {
				a <- err
			}
		}
	}()
	return g
}

func (g *rawGroup) append(p []byte) error {
	ack := make(chan error, 1)
	g.reqs <- rawReq{p: p, ack: ack}
	return <-ack
}

func (g *rawGroup) close() {
	close(g.reqs)
	<-g.done
}

// BenchmarkRecover measures a restart with a backlog: New plus the
// RegisterQueue of a durable queue whose log holds n unacknowledged messages
// of 64 bytes, until Stats shows all of them. The data directory is built
// once per size, outside the timer (publishes with nothing consuming, then
// Stop). It reports ns/msg, and heap/disk: how much the live heap grew
// (measured after a GC, with the recovered MQ still open) per byte of live
// log on disk. Recovery cost should be linear in n: ns/msg and allocs/op / n
// should not grow with it.
//
//	go test -run '^$' -bench Recover -benchtime 3x .
func BenchmarkRecover(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			dir := b.TempDir()
			disk := buildBacklog(b, dir, n)
			b.ReportAllocs()
			b.SetBytes(disk)
			var grown uint64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				b.StartTimer()
				m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithLogger(discardLogger))
				if err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
					tinymq.WithQueueName("q"), tinymq.WithDurable()); err != nil {
					b.Fatal(err)
				}
				if got := m.Stats().Queues["q"].Depth; got != n {
					b.Fatalf("Depth = %d after the restart, want %d", got, n)
				}
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&after)
				if after.HeapAlloc > before.HeapAlloc {
					grown = max(grown, after.HeapAlloc-before.HeapAlloc)
				}
				m.Stop() // before Start: the messages stay in the log
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/msg")
			b.ReportMetric(float64(grown)/float64(disk), "heap/disk")
		})
	}
}

// buildBacklog publishes n messages of 64 bytes to a durable queue of a new MQ
// in dir, with nothing consuming them, stops it, and returns the size of the
// log on disk.
func buildBacklog(tb testing.TB, dir string, n int) int64 {
	tb.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithSync(time.Hour), tinymq.WithLogger(discardLogger))
	if err := m.RegisterQueue("ev", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("q"), tinymq.WithDurable()); err != nil {
		tb.Fatal(err)
	}
	payload := tinymq.Encoded{Body: make([]byte, 64)}
	const publishers = 8
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < n; i += publishers {
				if err := m.Publish("ev", payload); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
	m.Stop()
	var size int64
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range ents {
		if info, err := e.Info(); err == nil && filepath.Ext(e.Name()) == ".wal" {
			size += info.Size()
		}
	}
	return size
}
