// Command peerbench runs the same workloads against TinyMQ, plain channels and
// the in-process peers, interleaved round by round so that a noisy machine
// affects all alike, and prints one Markdown table of medians with each
// system's ratio to the plain channel. By default the throughput rows are
// medians of 5 rounds, the latency and ping-pong rows of 9, the memory rows
// of 2.
//
//	cd benchmarks && go run ./cmd/peerbench            # the full run, about 8 minutes
//	cd benchmarks && go run ./cmd/peerbench -quick     # seconds: checks that it works
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tinymq/tinymq/benchmarks"
)

type kind int

const (
	throughput kind = iota // ns per message: ratio is chan/system (higher is better)
	cost                   // latency or memory: ratio is system/chan (lower is better)
	info                   // no ratio
)

type row struct {
	label string
	kind  kind
	unit  string
	scale float64 // value divided by scale for display
}

type workload struct {
	name   string
	rows   []row
	rounds int
	topic  bool // needs System.Topic
	run    func(sys benchmarks.System) ([]float64, error)
}

func main() {
	var (
		n         = flag.Int("n", 200_000, "messages per throughput run")
		rounds    = flag.Int("rounds", 5, "interleaved rounds of the throughput and topic workloads")
		latRounds = flag.Int("latency-rounds", 9, "interleaved rounds of the latency and ping-pong workloads")
		memN      = flag.Int("mem-n", 1_000_000, "messages queued in the memory workload with 1 subscriber")
		memFanN   = flag.Int("mem-fanout-n", 250_000, "messages queued in the memory workload with 4 fanout subscribers")
		memRounds = flag.Int("mem-rounds", 2, "rounds of the memory workloads")
		rate      = flag.Int("rate", 20_000, "messages per second in the latency workload")
		latDur    = flag.Duration("latency-duration", time.Second, "length of one latency run")
		pings     = flag.Int("pingpongs", 20_000, "round trips per ping-pong run")
		bindings  = flag.Int("bindings", 10_000, "bindings in the large topic workload")
		only      = flag.String("systems", "", "comma-separated systems to run (default all)")
		quick     = flag.Bool("quick", false, "tiny sizes, one round: a smoke test, not a measurement")
	)
	flag.Parse()
	if *quick {
		*n, *rounds, *latRounds, *memN, *memFanN, *memRounds = 2000, 1, 1, 20_000, 5000, 1
		*latDur, *pings, *bindings = 100*time.Millisecond, 200, 1000
		benchmarks.Timeout = 30 * time.Second
	}

	systems := benchmarks.Systems()
	if *only != "" {
		want := strings.Split(*only, ",")
		systems = slices.DeleteFunc(systems, func(s benchmarks.System) bool { return !slices.Contains(want, s.Name) })
	}
	ns := func(d time.Duration) float64 { return float64(d.Nanoseconds()) }
	thr := func(subs, pubs int) func(benchmarks.System) ([]float64, error) {
		return func(s benchmarks.System) ([]float64, error) {
			d, err := benchmarks.Throughput(s, subs, pubs, *n)
			return []float64{ns(d)}, err
		}
	}
	topic := func(b int) func(benchmarks.System) ([]float64, error) {
		return func(s benchmarks.System) ([]float64, error) {
			d, err := benchmarks.Topic(s, b, *n)
			return []float64{ns(d)}, err
		}
	}
	lat := func(l benchmarks.Latencies, err error) ([]float64, error) {
		return []float64{ns(l.P50), ns(l.P99), ns(l.P999)}, err
	}
	latRows := func(what string) []row {
		return []row{{what + " p50", cost, "µs", 1e3}, {what + " p99", cost, "µs", 1e3}, {what + " p99.9", cost, "µs", 1e3}}
	}
	memory := func(n, subs int) workload {
		subsLabel := fmt.Sprintf("%d sub", subs)
		if subs != 1 {
			subsLabel += "s"
		}
		what := fmt.Sprintf("%s queued, %s", thousands(n), subsLabel)
		return workload{name: "memory, " + subsLabel, rounds: *memRounds, rows: []row{
			{what + ": heap per msg", cost, "B", 1},
			{"  peak RSS growth", cost, "MiB", 1 << 20},
			{"  heap kept per msg after draining", info, "B", 1},
			{"  heap after draining / before", info, "x", 1},
			{"  time to publish them all", info, "ms", 1e6},
		}, run: func(s benchmarks.System) ([]float64, error) {
			m, err := benchmarks.MemoryQueued(s, n, subs)
			return []float64{m.BytesPerMsg, float64(m.PeakRSS), m.RetainedPerMsg, m.HeapRatio, ns(m.Publish)}, err
		}}
	}
	workloads := []workload{
		{name: "1 publisher -> 1 consumer", rows: []row{{"1 pub -> 1 sub", throughput, "ns/msg", 1}}, rounds: *rounds, run: thr(1, 1)},
		{name: "1 publisher -> 4 fanout queues", rows: []row{{"1 pub -> 4 fanout subs", throughput, "ns/msg", 1}}, rounds: *rounds, run: thr(4, 1)},
		{name: "4 parallel publishers", rows: []row{{"4 pubs -> 1 sub", throughput, "ns/msg", 1}}, rounds: *rounds, run: thr(1, 4)},
		{name: "topic, 10 bindings", rows: []row{{"topic, 10 bindings", throughput, "ns/msg", 1}}, rounds: *rounds, topic: true, run: topic(10)},
		{name: "topic, many bindings", rows: []row{{fmt.Sprintf("topic, %d bindings", *bindings), throughput, "ns/msg", 1}}, rounds: *rounds, topic: true, run: topic(*bindings)},
		{name: "latency", rows: latRows(fmt.Sprintf("latency @%dk/s", *rate/1000)), rounds: *latRounds, run: func(s benchmarks.System) ([]float64, error) {
			return lat(benchmarks.Latency(s, *rate, *latDur))
		}},
		{name: "ping-pong", rows: latRows("ping-pong"), rounds: *latRounds, run: func(s benchmarks.System) ([]float64, error) {
			return lat(benchmarks.PingPong(s, *pings))
		}},
		memory(*memN, 1),
		memory(*memFanN, 4),
	}

	// values[workload][row][system] holds one value per round.
	values := make([][]map[string][]float64, len(workloads))
	failures := map[string]string{}
	for wi, w := range workloads {
		values[wi] = make([]map[string][]float64, len(w.rows))
		for ri := range w.rows {
			values[wi][ri] = map[string][]float64{}
		}
	}
	maxRounds := max(*rounds, *latRounds, *memRounds)
	for round := range maxRounds {
		for wi, w := range workloads {
			if round >= w.rounds {
				continue
			}
			for _, s := range systems {
				if w.topic && s.Topic == nil {
					continue
				}
				key := w.name + "/" + s.Name
				if _, failed := failures[key]; failed {
					continue
				}
				fmt.Fprintf(os.Stderr, "round %d/%d: %s: %s\n", round+1, w.rounds, w.name, s.Name)
				vals, err := w.run(s)
				if err != nil {
					failures[key] = err.Error()
					continue
				}
				for ri, v := range vals {
					values[wi][ri][s.Name] = append(values[wi][ri][s.Name], v)
				}
			}
		}
	}
	summary := fmt.Sprintf("Interleaved rounds, medians reported: throughput and topic %d, latency and ping-pong %d, memory %d; one latency run: %v at %d msgs/s.",
		*rounds, *latRounds, *memRounds, *latDur, *rate)
	printTable(summary, workloads, values, systems, failures)
}

// thousands formats n with commas: 1,000,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	start := len(s) % 3
	if n < 0 {
		start = (len(s) - 1) % 3
		start++
	}
	out := s[:start]
	for i := start; i < len(s); i += 3 {
		if out != "" && out != "-" {
			out += ","
		}
		out += s[i : i+3]
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func printTable(summary string, workloads []workload, values [][]map[string][]float64, systems []benchmarks.System, failures map[string]string) {
	fmt.Printf("Machine: %s, %d cores, GOMAXPROCS %d, %s, %s\n", cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0),
		runtime.Version(), time.Now().UTC().Format("2006-01-02"))
	fmt.Printf("Command: %s\n%s\n\n", strings.Join(os.Args, " "), summary)
	fmt.Print("| workload | unit |")
	for _, s := range systems {
		fmt.Printf(" %s |", s.Name)
	}
	fmt.Print("\n|---|---|")
	for range systems {
		fmt.Print("---:|")
	}
	fmt.Println()
	for wi, w := range workloads {
		for ri, r := range w.rows {
			fmt.Printf("| %s | %s |", r.label, r.unit)
			floor, hasFloor := values[wi][ri]["chan"]
			for _, s := range systems {
				v, ok := values[wi][ri][s.Name]
				switch {
				case failures[w.name+"/"+s.Name] != "":
					fmt.Print(" failed* |")
				case !ok:
					fmt.Print(" — |")
				default:
					m := median(v)
					cell := format(m / r.scale)
					if hasFloor && r.kind != info && s.Name != "chan" {
						f := median(floor)
						ratio := m / f
						if r.kind == throughput {
							ratio = f / m
						}
						cell += fmt.Sprintf(" (%.2fx)", ratio)
					}
					fmt.Printf(" %s |", cell)
				}
			}
			fmt.Println()
		}
	}
	fmt.Println("\nRatios are to chan in the same run: for ns/msg rows, chan's time / the system's (throughput, higher is better);")
	fmt.Println("for latency and memory rows, the system's value / chan's (lower is better). Medians of the rounds.")
	fmt.Println("\nNotes:")
	for _, s := range systems {
		fmt.Printf("- %s: %s\n", s.Name, s.Note)
	}
	keys := make([]string, 0, len(failures))
	for k := range failures {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Printf("- *%s failed: %s\n", k, failures[k])
	}
}

func format(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
