package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// The benchmarks write 256-byte messages to a temporary directory (on the
// disk that holds os.TempDir) and report msgs/s. They compare Log.Commit
// (SyncAlways) with a bare group-commit loop (append + shared fdatasync, the
// floor of what any group commit can cost) and with one write+fdatasync per
// message (what group commit saves).

const benchPayload = 256

var benchCommitters = []int{1, 8, 64, 256}

// runCommitters splits b.N operations among n goroutines.
func runCommitters(b *testing.B, n int, op func(g, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(g, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkCommit(b *testing.B) {
	for _, n := range benchCommitters {
		b.Run(fmt.Sprint("committers=", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(benchPayload)
			l, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			val := make([]byte, benchPayload)
			syncs := l.Stats().Syncs
			runCommitters(b, n, func(g, i int) error {
				var batch Batch
				batch.Put(fmt.Appendf(nil, "%016d", i), val)
				return l.Commit(&batch)
			})
			b.ReportMetric(float64(l.Stats().Syncs-syncs)/float64(b.N), "syncs/op")
		})
	}
}

// rawGroupCommit is a bare leader/follower group commit on one file: writers
// append to a shared buffer; whoever finds no sync running writes the buffer
// and fdatasyncs it for everyone queued so far.
type rawGroupCommit struct {
	f       *os.File
	mu      sync.Mutex
	cond    sync.Cond
	buf     []byte
	off     int64
	queued  uint64 // messages appended to buf or written
	synced  uint64 // messages covered by a finished fdatasync
	syncing bool
	syncs   int
	err     error
}

func (g *rawGroupCommit) append(p []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.buf = append(g.buf, p...)
	g.queued++
	mine := g.queued
	for g.synced < mine && g.err == nil {
		if g.syncing {
			g.cond.Wait()
			continue
		}
		g.syncing = true
		buf, off, upto := g.buf, g.off, g.queued
		g.buf = nil
		g.off += int64(len(buf))
		g.mu.Unlock()
		_, err := g.f.WriteAt(buf, off)
		if err == nil {
			err = fdatasync(g.f)
		}
		g.mu.Lock()
		g.syncing = false
		g.syncs++
		g.synced, g.err = upto, err
		g.cond.Broadcast()
	}
	return g.err
}

func BenchmarkRawGroupCommit(b *testing.B) {
	for _, n := range benchCommitters {
		b.Run(fmt.Sprint("committers=", n), func(b *testing.B) {
			b.SetBytes(benchPayload)
			f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			g := &rawGroupCommit{f: f}
			g.cond.L = &g.mu
			msg := make([]byte, benchPayload)
			runCommitters(b, n, func(_, _ int) error { return g.append(msg) })
			b.ReportMetric(float64(g.syncs)/float64(b.N), "syncs/op")
		})
	}
}

func BenchmarkPerMessageFsync(b *testing.B) {
	b.SetBytes(benchPayload)
	f, err := os.Create(filepath.Join(b.TempDir(), "each"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	msg := make([]byte, benchPayload)
	var off int64
	runCommitters(b, 1, func(_, _ int) error {
		if _, err := f.WriteAt(msg, off); err != nil {
			return err
		}
		off += benchPayload
		return fdatasync(f)
	})
}
