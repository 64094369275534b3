package tinymq_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
