package benchmarks

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The benchmarks run each workload of cmd/peerbench through go test, one
// system at a time; cmd/peerbench interleaves them and prints the ratios.
// ns/msg is the figure to read; ns/op includes setting the system up.

func BenchmarkThroughput(b *testing.B) {
	cases := []struct {
		name       string
		subs, pubs int
	}{{"1pub-1sub", 1, 1}, {"1pub-4subs", 4, 1}, {"4pubs-1sub", 1, 4}}
	for _, c := range cases {
		for _, sys := range Systems() {
			b.Run(c.name+"/"+sys.Name, func(b *testing.B) {
				d, err := Throughput(sys, c.subs, c.pubs, max(b.N, c.pubs))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(d.Nanoseconds()), "ns/msg")
			})
		}
	}
}

func BenchmarkTopic(b *testing.B) {
	for _, bindings := range []int{10, 1000} {
		for _, sys := range Systems() {
			if sys.Topic == nil {
				continue
			}
			b.Run(fmt.Sprintf("bindings=%d/%s", bindings, sys.Name), func(b *testing.B) {
				d, err := Topic(sys, bindings, b.N)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(d.Nanoseconds()), "ns/msg")
			})
		}
	}
}

func BenchmarkPingPong(b *testing.B) {
	for _, sys := range Systems() {
		b.Run(sys.Name, func(b *testing.B) {
			l, err := PingPong(sys, b.N)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(l.P50.Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(l.P99.Nanoseconds()), "p99-ns")
		})
	}
}

func BenchmarkMemoryQueued(b *testing.B) {
	for _, subs := range []int{1, 4} {
		for _, sys := range Systems() {
			b.Run(fmt.Sprintf("subs=%d/%s", subs, sys.Name), func(b *testing.B) {
				m, err := MemoryQueued(sys, max(b.N, 1000), subs)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(m.BytesPerMsg, "B/queued-msg")
			})
		}
	}
}

// lossy is a system that loses every tenth message, to check that the
// workloads notice instead of waiting forever or reporting a figure.
func lossy() System {
	s := Systems()[0]
	fanout := s.Fanout
	s.Fanout = func(subs, buffer int, h Handler) (Pipeline, error) {
		n := 0
		return fanout(subs, buffer, func(sub int, b []byte) {
			n++
			if n%10 != 0 {
				h(sub, b)
			}
		})
	}
	return s
}

func TestWorkloadsReportLostMessages(t *testing.T) {
	old := Timeout
	Timeout = 200 * time.Millisecond
	defer func() { Timeout = old }()
	if _, err := Throughput(lossy(), 1, 1, 100); err == nil {
		t.Error("Throughput did not notice lost messages")
	}
	if _, err := MemoryQueued(lossy(), 100, 1); err == nil {
		t.Error("MemoryQueued did not notice lost messages")
	}
	if _, err := Latency(lossy(), 1000, 50*time.Millisecond); err == nil {
		t.Error("Latency did not notice lost messages")
	}
}

func TestEverySystemDeliversEverything(t *testing.T) {
	for _, sys := range Systems() {
		t.Run(sys.Name, func(t *testing.T) {
			if _, err := Throughput(sys, 4, 2, 1000); err != nil {
				t.Fatal(err)
			}
			if sys.Topic != nil {
				if _, err := Topic(sys, 100, 1000); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := PingPong(sys, 50); err != nil {
				t.Fatal(err)
			}
			if _, err := MemoryQueued(sys, 200, 4); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestTopicKeyMatchesOneBinding(t *testing.T) {
	seen := map[string]bool{}
	for i := range 1000 {
		seen[TopicKey(i, 10)] = true
	}
	if len(seen) != 10 {
		t.Errorf("keys cover %d of 10 bindings", len(seen))
	}
}
