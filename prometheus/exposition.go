package tinymqprom

import (
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinymq/tinymq"
)

// contentType is the text exposition format that the handler writes
// (expfmt.FmtText).
const contentType = "text/plain; version=0.0.4; charset=utf-8"

// flushAt is how much text the handler gathers before it writes it out.
const flushAt = 64 << 10

// Handler returns an [http.Handler] that serves c's metrics, the same
// series a registry that holds c alone would serve (names, help, types,
// labels and values), in the Prometheus text format (version 0.0.4), gzipped
// when the request accepts it. It writes the text straight from one read of
// the MQ into a buffer that it keeps, building no metric object, and so is
// the route for an MQ of many queues: for 10,000 it costs a tenth of a
// registry's time and a hundredth of its memory (see the README). Serve it
// on a path, and scrape it as a job, of its own: c should then not be
// registered too, or its series are served twice.
//
// Each request reads the MQ as [Collector.Collect] does (it does not wait
// for consumers or stall publishers) and holds c's scrape lock while it
// writes the response, so scrapes of c take turns and a client that reads
// slowly holds up the next one (give the server a WriteTimeout); it never
// holds a lock of the MQ while writing. A panic while reading the MQ is
// counted in tinymq_collector_errors_total, which is served alone, with
// 200. It answers every method, as promhttp does. Before c is bound to an
// MQ (an [InstrumentHandler] option not given to New yet) it serves
// tinymq_collector_errors_total only.
func (c *Collector) Handler() http.Handler {
	return handler{c}
}

type handler struct{ c *Collector }

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.c
	gz := acceptsGzip(r.Header.Values("Accept-Encoding"))
	hdr := w.Header()
	hdr.Set("Content-Type", contentType)
	hdr.Add("Vary", "Accept-Encoding")
	if gz {
		hdr.Set("Content-Encoding", "gzip")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	read := c.readRecovered()
	var out io.Writer = w
	if gz {
		if c.gz == nil {
			c.gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed) // a valid level: no error
		} else {
			c.gz.Reset(w)
		}
		out = c.gz
	}
	c.exp.w, c.exp.err = out, nil
	c.writeText(&c.exp, read)
	c.exp.flush()
	if gz {
		_ = c.gz.Close() // an error is the client's: it is gone
		c.gz.Reset(io.Discard)
	}
	c.exp.w = nil
}

// InstrumentHandler is [Instrument] for an MQ of many queues: its option
// instruments the MQ that New makes as Instrument's does, but registers
// nothing, and its handler serves that MQ's metrics as
// [Collector.Handler] does, on a path of its own:
//
//	opt, metrics := tinymqprom.InstrumentHandler()
//	mq := tinymq.New(opt)
//	http.Handle("/metrics/tinymq", metrics)
//
// It does not block. It panics at once for an option NewCollector would
// refuse, and the option panics when given to a second New. Until New has
// made the MQ, the handler serves tinymq_collector_errors_total only.
func InstrumentHandler(opts ...Option) (tinymq.Option, http.Handler) {
	o, c := instrument(nil, opts)
	return o, c.Handler()
}

// readRecovered is read, with a panic recovered and counted: it then
// reports false, as for an MQ not bound yet. The caller holds mu.
func (c *Collector) readRecovered() (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			c.errs.Add(1)
			ok = false
		}
	}()
	return c.read()
}

// acceptsGzip reports whether the Accept-Encoding values accept gzip: a
// gzip or x-gzip coding with no q, or a q above 0.
func acceptsGzip(values []string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(part, ";")
			coding = strings.TrimSpace(coding)
			if !strings.EqualFold(coding, "gzip") && !strings.EqualFold(coding, "x-gzip") {
				continue
			}
			q := 1.0
			for p := range strings.SplitSeq(params, ";") {
				k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(k, "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
						q = f
					}
				}
			}
			if q > 0 {
				return true
			}
		}
	}
	return false
}

// familyKind says which numbers a family exposes.
type familyKind uint8

const (
	familyExchangeCounter familyKind = iota // exchangeCounters[index]
	familyQueueCounter                      // queueCounters[index]
	familyQueueGauge                        // queueGauges[index]
	familyStuck
	familyHist
	familyBinding
	familyDeletedQueues
	familyDeletedMsgs
	familyErrors
)

// textFamily is one metric family of the text exposition.
type textFamily struct {
	kind   familyKind
	index  int
	name   string
	header string // its # HELP and # TYPE lines
}

// textFamilies are every family the Collector exports, by name: the order
// of a registry's exposition.
var textFamilies = func() []textFamily {
	var fs []textFamily
	add := func(kind familyKind, index int, name, help, typ string) {
		fs = append(fs, textFamily{kind: kind, index: index, name: name,
			header: "# HELP " + name + " " + helpEscaper.Replace(help) + "\n# TYPE " + name + " " + typ + "\n"})
	}
	for i, e := range exchangeCounters {
		add(familyExchangeCounter, i, "tinymq_exchange_"+e.name+"_total", e.help, "counter")
	}
	for i, q := range queueCounters {
		add(familyQueueCounter, i, "tinymq_queue_"+q.name+"_total", q.help, "counter")
	}
	for i, q := range queueGauges {
		add(familyQueueGauge, i, "tinymq_queue_"+q.name, q.help, "gauge")
	}
	add(familyStuck, 0, stuckFamily.name, stuckFamily.help, "gauge")
	add(familyHist, 0, histFamily.name, histFamily.help, "histogram")
	add(familyBinding, 0, bindingFamily.name, bindingFamily.help, "gauge")
	add(familyDeletedQueues, 0, deletedQueuesFamily.name, deletedQueuesFamily.help, "counter")
	add(familyDeletedMsgs, 0, deletedMsgsFamily.name, deletedMsgsFamily.help, "counter")
	add(familyErrors, 0, errorsFamily.name, errorsFamily.help, "counter")
	slices.SortFunc(fs, func(a, b textFamily) int { return strings.Compare(a.name, b.name) })
	return fs
}()

// The escaping of the text format: help text escapes backslashes and line
// feeds, label values double quotes too.
var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	valueEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// textLabels are the label sets of the text exposition, as a registry
// writes them: sorted by name, the constant labels among the series' own,
// values escaped. A series' own set is kept open (without its closing
// brace) so that a histogram bucket can add le.
type textLabels struct {
	consts  [][2]string // name, escaped value; by name
	plain   string      // the closed set of a series with no label of its own: "" or {name="value",...}
	reasons [2]string   // the closed sets of tinymq_queues_deleted_total: deleted, expired
	le      []string    // `,le="bound"} ` for each bucket, +Inf last
}

func newTextLabels(consts prometheus.Labels, upper []float64) textLabels {
	var t textLabels
	for name, v := range consts {
		t.consts = append(t.consts, [2]string{name, valueEscaper.Replace(v)})
	}
	slices.SortFunc(t.consts, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	if len(t.consts) > 0 {
		t.plain = t.open() + "}"
	}
	t.reasons = [2]string{t.open("reason", "deleted") + "}", t.open("reason", "expired") + "}"}
	for _, b := range append(slices.Clone(upper), math.Inf(1)) {
		t.le = append(t.le, `,le="`+string(appendFloat(nil, b))+`"} `)
	}
	return t
}

// open returns the open label set of a series whose own labels are
// name/value pairs (values unescaped), given by name: `{a="1",queue="q"`.
func (t *textLabels) open(pairs ...string) string {
	var b strings.Builder
	b.WriteByte('{')
	i, n := 0, 0
	write := func(name, escaped string) {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(name)
		b.WriteString(`="`)
		b.WriteString(escaped)
		b.WriteByte('"')
	}
	for j := 0; j < len(pairs); j += 2 {
		for ; i < len(t.consts) && t.consts[i][0] < pairs[j]; i++ {
			write(t.consts[i][0], t.consts[i][1])
		}
		write(pairs[j], valueEscaper.Replace(pairs[j+1]))
	}
	for ; i < len(t.consts); i++ {
		write(t.consts[i][0], t.consts[i][1])
	}
	return b.String()
}

// expWriter gathers the text and writes it to w when flushAt is reached;
// after the first error of w it gathers nothing more.
type expWriter struct {
	buf []byte
	w   io.Writer
	err error
}

func (e *expWriter) flush() {
	if e.err == nil && len(e.buf) > 0 {
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

// sample writes the line of name with the open label set labels.
func (e *expWriter) sample(name, labels string, v float64) {
	b := append(e.buf, name...)
	b = append(b, labels...)
	b = append(b, '}', ' ')
	b = appendFloat(b, v)
	e.buf = append(b, '\n')
	if len(e.buf) >= flushAt {
		e.flush()
	}
}

// plain writes the line of name with the closed label set labels, or none.
func (e *expWriter) plain(name, labels string, v float64) {
	b := append(e.buf, name...)
	b = append(b, labels...)
	b = append(b, ' ')
	b = appendFloat(b, v)
	e.buf = append(b, '\n')
}

// bucket writes the bucket line of name with the open label set labels and
// le, the closing of the set.
func (e *expWriter) bucket(name, labels, le string, v float64) {
	b := append(e.buf, name...)
	b = append(b, "_bucket"...)
	b = append(b, labels...)
	b = append(b, le...)
	b = appendFloat(b, v)
	e.buf = append(b, '\n')
}

// appendFloat appends f as the text format writes a value (expfmt's
// writeFloat), without strconv's float formatting for a small integer.
func appendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	case f == math.Trunc(f) && f > -1e6 && f < 1e6: // as 'g' writes them
		return strconv.AppendInt(b, int64(f), 10)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// writeText writes the exposition of what the last read found (of
// tinymq_collector_errors_total alone when read is false), family by
// family in name order, each series in label order. The caller holds mu.
func (c *Collector) writeText(e *expWriter, read bool) {
	t := &c.text
	for _, f := range textFamilies {
		if e.err != nil {
			return
		}
		if f.kind != familyErrors && !read {
			continue
		}
		switch f.kind {
		case familyExchangeCounter:
			if len(c.sortedExchanges) == 0 {
				continue
			}
			e.buf = append(e.buf, f.header...)
			get := exchangeCounters[f.index].get
			for _, x := range c.sortedExchanges {
				if x.text == "" {
					x.text = t.open("exchange", x.label)
				}
				e.sample(f.name, x.text, float64(get(&x.stats)))
			}
		case familyQueueCounter, familyQueueGauge:
			if len(c.sortedQueues) == 0 {
				continue
			}
			e.buf = append(e.buf, f.header...)
			for _, q := range c.sortedQueues {
				var v float64
				if f.kind == familyQueueCounter {
					v = float64(queueCounters[f.index].get(&q.stats))
				} else {
					v = queueGauges[f.index].get(&q.stats)
				}
				e.sample(f.name, q.textLabels(t), v)
			}
		case familyStuck, familyHist:
			header := false
			for _, q := range c.sortedQueues {
				if !q.observed {
					continue
				}
				if !header {
					e.buf = append(e.buf, f.header...)
					header = true
				}
				if f.kind == familyStuck {
					e.sample(f.name, q.textLabels(t), float64(q.stuck))
				} else {
					c.writeHistogram(e, f.name, q)
				}
			}
		case familyBinding:
			if len(c.sortedBindings) == 0 {
				continue
			}
			e.buf = append(e.buf, f.header...)
			for _, b := range c.sortedBindings {
				if b.text == "" {
					b.text = t.open("exchange", b.exchange, "queue", b.queue)
				}
				e.sample(f.name, b.text, 1)
			}
		case familyDeletedQueues:
			e.buf = append(e.buf, f.header...)
			e.plain(f.name, t.reasons[0], float64(c.deleted))
			e.plain(f.name, t.reasons[1], float64(c.expired))
		case familyDeletedMsgs:
			e.buf = append(e.buf, f.header...)
			e.plain(f.name, t.plain, float64(c.removed))
		case familyErrors:
			e.buf = append(e.buf, f.header...)
			e.plain(f.name, t.plain, float64(c.errs.Load()))
		}
	}
}

// textLabels returns the open label set of q's series, made once.
func (q *queueSeries) textLabels(t *textLabels) string {
	if q.text == "" {
		q.text = t.open("queue", q.label)
	}
	return q.text
}

// writeHistogram writes the histogram of q, read from its observers (zero
// without), as Collect's histogram reads it: the count is the buckets' sum.
func (c *Collector) writeHistogram(e *expWriter, name string, q *queueSeries) {
	counts := c.scratch
	var count, sumNS uint64
	if o := q.obs; o != nil {
		sumNS = o.sumNS.Load()
		for i := range o.counts {
			counts[i] = o.counts[i].Load()
			count += counts[i]
		}
	} else {
		clear(counts)
	}
	labels := q.textLabels(&c.text)
	var cum uint64
	for i := range c.upper {
		cum += counts[i]
		e.bucket(name, labels, c.text.le[i], float64(cum))
	}
	e.bucket(name, labels, c.text.le[len(c.upper)], float64(count))
	b := append(e.buf, name...)
	b = append(b, "_sum"...)
	b = append(b, labels...)
	b = append(b, '}', ' ')
	b = appendFloat(b, float64(sumNS)/1e9)
	b = append(b, '\n')
	b = append(b, name...)
	b = append(b, "_count"...)
	b = append(b, labels...)
	b = append(b, '}', ' ')
	b = appendFloat(b, float64(count))
	e.buf = append(b, '\n')
	if len(e.buf) >= flushAt {
		e.flush()
	}
}
