package admin

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tinymq/tinymq"
)

// Bounds on what one response holds. Names are user input: a queue may be
// called anything, bind any number of keys, and fail with any error text.
// Each paged list has a budget of its own, so that one cannot crowd another
// out, and the first item of a page always fits its budget, so that paging
// on from next_offset always gets somewhere.
const (
	// maxStringBytes is the longest string (name, key, error) sent, in bytes
	// of UTF-8; longer ones are cut and end in "…".
	maxStringBytes = 256
	// maxErrorBytes is the longest error text of a response.
	maxErrorBytes = 1024
	// queueBudget and exchangeBudget bound the JSON of one page of queues
	// and of exchanges (or of bindings); a page that would be longer ends
	// early, with next_offset where the next one begins.
	queueBudget    = 2 << 20
	exchangeBudget = 1 << 20
	// deadLetterBudget bounds the recent dead letters (64 at most, which
	// always fit).
	deadLetterBudget = 1 << 20
	// maxArgEntries bounds the entries shown of one binding-argument table
	// (or of a message's headers).
	maxArgEntries = 32
	// maxKeysShown and maxTablesShown bound one binding's keys and argument
	// tables; maxBindingsShown an exchange's bindings in the overview
	// (api/bindings lists them all).
	maxKeysShown     = 64
	maxTablesShown   = 8
	maxBindingsShown = 16
	// maxDeadGroups bounds the queues listed with their dead letters.
	maxDeadGroups = 50
	// defaultLimit and maxLimit are a page's default and largest length.
	defaultLimit = 100
	maxLimit     = 1000
)

// overview is the JSON of /api/overview; the README documents every field.
type overview struct {
	Time          string `json:"time"`
	RefreshMillis int64  `json:"refresh_ms"`
	// RateSeconds is the interval the rates cover; null until known.
	RateSeconds   *float64 `json:"rate_seconds"`
	ExchangeCount int      `json:"exchange_count"`
	QueueCount    int      `json:"queue_count"`
	Totals        totals   `json:"totals"`
	// History is the totals' history, for the page's sparklines.
	History       historyView      `json:"history"`
	QueuePage     pageInfo         `json:"queue_page"`
	Queues        []queueView      `json:"queues"`
	ExchangePage  pageInfo         `json:"exchange_page"`
	Exchanges     []exchangeView   `json:"exchanges"`
	Selected      *queueView       `json:"selected"`
	DeadLetterSum deadLetterSum    `json:"dead_letter_totals"`
	DeadGroups    []deadGroup      `json:"dead_letter_groups"`
	DeadLetters   []deadLetterView `json:"dead_letters"`
	Actions       actionsView      `json:"actions"`
	// Truncated says that a list ended before its limit because of its
	// byte budget: the rest is on the next page (next_offset), or, for
	// an exchange's bindings, in api/bindings.
	Truncated bool `json:"truncated"`
}

type totals struct {
	Published     uint64   `json:"published"`
	PublishedRate *float64 `json:"published_per_sec"`
	Depth         int      `json:"depth"`
	InFlight      int      `json:"in_flight"`
	Failed        uint64   `json:"failed"`
	Consumers     int      `json:"consumers"`
	Paused        int      `json:"paused"`
	DeletedQueues uint64   `json:"deleted_queues"`
	ExpiredQueues uint64   `json:"expired_queues"`
	// Removed counts what the deletes of queues removed (Stats.Deleted).
	Removed uint64 `json:"removed"`
}

// pageInfo describes one page of a list.
type pageInfo struct {
	Sort   string `json:"sort,omitempty"`
	Order  string `json:"order,omitempty"`
	Filter string `json:"filter"`
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
	// Matched is how many items pass the filter, on every page.
	Matched int `json:"matched"`
	// NextOffset is the offset of the next page, or null on the last.
	NextOffset *int `json:"next_offset"`
}

type actionsView struct {
	Enabled  bool `json:"enabled"`
	Payloads bool `json:"payloads"`
}

type exchangeView struct {
	Name       string `json:"name"`
	Kind       string `json:"kind"`
	Alternate  string `json:"alternate"`
	Published  uint64 `json:"published"`
	Unroutable uint64 `json:"unroutable"`
	// DedupWindowMillis is WithDeduplication's window (0: none), and
	// Duplicates the publishes it found accepted already.
	DedupWindowMillis float64        `json:"deduplication_window_ms"`
	Duplicates        uint64         `json:"duplicates"`
	Rates             *exchangeRates `json:"rates"`
	BindingCount      int            `json:"binding_count"`
	Bindings          []bindingView  `json:"bindings"`
}

type exchangeRates struct {
	Published  float64 `json:"published_per_sec"`
	Unroutable float64 `json:"unroutable_per_sec"`
}

type bindingView struct {
	Queue string              `json:"queue"`
	Keys  []string            `json:"keys"`
	Args  []map[string]string `json:"args"`
	// Truncated says that keys or argument tables were left out.
	Truncated bool `json:"truncated,omitempty"`
}

type queueView struct {
	Name               string  `json:"name"`
	Concurrency        int     `json:"concurrency"`
	Consumers          int     `json:"consumers"`
	Paused             bool    `json:"paused"`
	Durable            bool    `json:"durable"`
	MaxAttempts        int     `json:"max_attempts"`
	MessageTTLMillis   float64 `json:"message_ttl_ms"`
	ExpiryMillis       float64 `json:"expiry_ms"`
	MaxLen             int     `json:"max_len"`
	Overflow           string  `json:"overflow"`
	DeadLetterExchange string  `json:"dead_letter_exchange"`
	DeadLetterKey      string  `json:"dead_letter_key"`
	Filtered           bool    `json:"filtered"`
	// The job-queue settings: WithDeliveryTimeout (0: none), WithRateLimit
	// (0: none), WithGroupOrdering, and the payload type of a typed queue
	// ("": any).
	DeliveryTimeoutMillis float64 `json:"delivery_timeout_ms"`
	RateLimit             float64 `json:"rate_limit_per_sec"`
	RateBurst             int     `json:"rate_burst"`
	GroupOrdering         bool    `json:"group_ordering"`
	PayloadType           string  `json:"payload_type"`
	Depth                 int     `json:"depth"`
	Ready                 int     `json:"ready"`
	Scheduled             int     `json:"scheduled"`
	InFlight              int     `json:"in_flight"`
	// OldestAgeMillis is how long the oldest ready message has waited
	// (QueueStats.OldestAge); 0 when none is ready.
	OldestAgeMillis float64 `json:"oldest_age_ms"`
	// Abandoned is how many calls outlived the delivery timeout and still
	// run (QueueStats.Abandoned): not in InFlight.
	Abandoned    int          `json:"abandoned"`
	Counters     counters     `json:"counters"`
	Rates        *queueRates  `json:"rates"`
	ConsumerTime consumerTime `json:"consumer_time"`
	History      historyView  `json:"history"`
}

// counters are the counters of tinymq.QueueStats.
type counters struct {
	Accepted     uint64 `json:"accepted"`
	Delivered    uint64 `json:"delivered"`
	Succeeded    uint64 `json:"succeeded"`
	Failed       uint64 `json:"failed"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Expired      uint64 `json:"expired"`
	Overflowed   uint64 `json:"overflowed"`
	Rejected     uint64 `json:"rejected"`
	Dropped      uint64 `json:"dropped"`
	Undelivered  uint64 `json:"undelivered"`
	Purged       uint64 `json:"purged"`
	Replayed     uint64 `json:"replayed"`
	Removed      uint64 `json:"removed"`
	TimedOut     uint64 `json:"timed_out"`
}

func countersOf(q tinymq.QueueStats) counters {
	return counters{Accepted: q.Accepted, Delivered: q.Delivered, Succeeded: q.Succeeded, Failed: q.Failed,
		Retried: q.Retried, DeadLettered: q.DeadLettered, Expired: q.Expired, Overflowed: q.Overflowed,
		Rejected: q.Rejected, Dropped: q.Dropped, Undelivered: q.Undelivered, Purged: q.Purged,
		Replayed: q.Replayed, Removed: q.Removed, TimedOut: q.TimedOut}
}

// queueRates are per-second rates of the queue's main counters. Published is
// the rate of Accepted: messages published into the queue.
type queueRates struct {
	Published    float64 `json:"published_per_sec"`
	Delivered    float64 `json:"delivered_per_sec"`
	Succeeded    float64 `json:"succeeded_per_sec"`
	Failed       float64 `json:"failed_per_sec"`
	DeadLettered float64 `json:"dead_lettered_per_sec"`
	Dropped      float64 `json:"dropped_per_sec"`
}

type consumerTime struct {
	Samples    uint64  `json:"samples"`
	MeanMillis float64 `json:"mean_ms"`
	P50Millis  float64 `json:"p50_ms"`
	P90Millis  float64 `json:"p90_ms"`
	P99Millis  float64 `json:"p99_ms"`
	MaxMillis  float64 `json:"max_ms"`
}

type deadLetterView struct {
	Time               string `json:"time"`
	Reason             string `json:"reason"`
	Exchange           string `json:"exchange"`
	Queue              string `json:"queue"`
	RoutingKey         string `json:"routing_key"`
	Attempts           int    `json:"attempts"`
	Count              int    `json:"count"`
	MessageID          uint64 `json:"message_id"`
	LastError          string `json:"last_error"`
	DeadLetterExchange string `json:"dead_letter_exchange"`
	Dropped            bool   `json:"dropped"`
	DropCause          string `json:"drop_cause"`
}

// deadLetterSum adds up the dead letters of every queue, deleted ones
// included: the real totals, not the ring's size.
type deadLetterSum struct {
	Total        uint64 `json:"total"`
	DeadLettered uint64 `json:"dead_lettered"`
	Dropped      uint64 `json:"dropped"`
	// Queues is how many queues (deleted ones as one) have any.
	Queues int `json:"queues"`
}

// deadGroup is one queue's dead letters, by reason.
type deadGroup struct {
	Queue string `json:"queue"`
	// Deleted marks the group of every deleted queue, added up (Queue "").
	Deleted      bool   `json:"deleted"`
	Total        uint64 `json:"total"`
	DeadLettered uint64 `json:"dead_lettered"`
	Dropped      uint64 `json:"dropped"`
	// Reasons split Total by reason: "expired" is the queue's Expired
	// count and "maxlen" its Overflowed count (both counted when the
	// message died), "rejected" the rest.
	Reasons []reasonGroup `json:"reasons"`
}

type reasonGroup struct {
	Reason string `json:"reason"`
	Total  uint64 `json:"total"`
	// Recent is how many of the recent dead letters (the ring) are of this
	// queue and reason; LastTime, LastError and LastOutcome describe the
	// newest of them.
	Recent      int    `json:"recent"`
	LastTime    string `json:"last_time"`
	LastError   string `json:"last_error"`
	LastOutcome string `json:"last_outcome"`
}

// Upper bounds on the JSON of each item apart from its strings: field names,
// punctuation and numbers (at most 24 bytes each).
const (
	queueFixedBytes      = 1900
	exchangeFixedBytes   = 420
	bindingFixedBytes    = 70
	deadLetterFixedBytes = 500
	groupFixedBytes      = 200
	reasonFixedBytes     = 160
)

// errCollect is returned when the MQ (its engine) panicked while being read.
var errCollect = errors.New("admin: reading the MQ panicked")

// overviewParams are the query parameters of api/overview; the README
// documents them.
type overviewParams struct {
	sort     string // "", "name", "depth", "rate"
	desc     bool
	filter   string
	offset   int
	limit    int
	xFilter  string
	xOffset  int
	xLimit   int
	selected string
}

func parseOverviewParams(q url.Values) (overviewParams, error) {
	p := overviewParams{sort: q.Get("sort"), filter: q.Get("filter"), xFilter: q.Get("exchange_filter"),
		selected: q.Get("queue")}
	switch p.sort {
	case "", "name":
	case "depth", "rate":
		p.desc = true
	default:
		return p, errors.New("bad request: sort must be name, depth or rate (or absent: registration order)")
	}
	switch q.Get("order") {
	case "":
	case "asc":
		p.desc = false
	case "desc":
		p.desc = true
	default:
		return p, errors.New("bad request: order must be asc or desc")
	}
	var err error
	if p.offset, err = intParam(q, "offset", 0, 0, math.MaxInt32); err != nil {
		return p, err
	}
	if p.limit, err = intParam(q, "limit", defaultLimit, 1, maxLimit); err != nil {
		return p, err
	}
	if p.xOffset, err = intParam(q, "exchange_offset", 0, 0, math.MaxInt32); err != nil {
		return p, err
	}
	if p.xLimit, err = intParam(q, "exchange_limit", defaultLimit, 1, maxLimit); err != nil {
		return p, err
	}
	return p, nil
}

// snapshot is what one request reads of the MQ.
type snapshot struct {
	topo tinymq.Topology
	st   tinymq.Stats
	dead []tinymq.DeadLetter
	at   time.Time
}

// read reads the MQ, without holding any lock of the handler's. An engine
// is user code: a panic in it fails this request only.
func (h *handler) read(withDead bool) (s snapshot, err error) {
	defer func() {
		if recover() != nil {
			err = errCollect
		}
	}()
	s.topo = h.mq.Topology()
	s.st = h.mq.Stats()
	s.at = time.Now()
	if withDead {
		s.dead = h.mq.RecentDeadLetters()
	}
	return s, nil
}

// queueRow is one queue while the overview filters and sorts them.
type queueRow struct {
	info  *tinymq.QueueInfo
	stats tinymq.QueueStats
	rate  float64 // published per second, for sorting
}

// overview reads the MQ and builds one bounded page of the overview.
func (h *handler) overview(p overviewParams) (overview, error) {
	s, err := h.read(true)
	if err != nil {
		return overview{}, err
	}
	topo, st := s.topo, s.st

	base, haveBase := h.samples.observe(s.at, st)
	dt := s.at.Sub(base.at)
	total := h.history.observe(s.at, st)

	ov := overview{
		Time:          formatTime(s.at),
		RefreshMillis: h.cfg.refresh.Milliseconds(),
		ExchangeCount: len(topo.Exchanges),
		QueueCount:    len(topo.Queues),
		Queues:        []queueView{},
		Exchanges:     []exchangeView{},
		DeadGroups:    []deadGroup{},
		DeadLetters:   []deadLetterView{},
		Actions:       actionsView{Enabled: h.cfg.actions, Payloads: h.cfg.actions && h.cfg.payloads},
		History:       total,
	}
	if haveBase {
		secs := math.Round(dt.Seconds()*1000) / 1000
		ov.RateSeconds = &secs
	}
	ov.Totals = totals{DeletedQueues: st.DeletedQueues, ExpiredQueues: st.ExpiredQueues, Removed: st.Deleted.Removed}

	// Every queue, for the totals, the filter and the sort.
	rows := make([]queueRow, 0, len(topo.Queues))
	needle := strings.ToLower(p.filter)
	for i := range topo.Queues {
		qi := &topo.Queues[i]
		qs := st.Queues[qi.Name]
		ov.Totals.Depth += qs.Depth
		ov.Totals.InFlight += qs.InFlight
		ov.Totals.Failed += qs.Failed
		ov.Totals.Consumers += qi.Consumers
		if qi.Paused {
			ov.Totals.Paused++
		}
		if needle != "" && !strings.Contains(strings.ToLower(qi.Name), needle) {
			continue
		}
		row := queueRow{info: qi, stats: qs}
		if haveBase && p.sort == "rate" {
			row.rate = perSecond(qs.Accepted, base.queues[qi.Name].accepted, dt)
		}
		rows = append(rows, row)
	}
	sortRows(rows, p.sort, p.desc)

	view := func(r queueRow) queueView {
		return h.queueViewOf(r.info, r.stats, base, haveBase, dt)
	}
	ov.QueuePage = pageInfo{Sort: p.sort, Order: order(p.desc, p.sort), Filter: clip(p.filter), Offset: p.offset,
		Limit: p.limit, Matched: len(rows)}
	budget := queueBudget
	end := min(len(rows), p.offset+p.limit)
	for i := p.offset; i < end; i++ {
		qv := view(rows[i])
		cost := qv.cost()
		if cost > budget {
			ov.Truncated = true
			end = i
			break
		}
		budget -= cost
		ov.Queues = append(ov.Queues, qv)
	}
	if end < len(rows) && end >= p.offset {
		ov.QueuePage.NextOffset = ptr(end)
	}
	if p.selected != "" {
		for i := range topo.Queues {
			if qi := &topo.Queues[i]; qi.Name == p.selected {
				qv := h.queueViewOf(qi, st.Queues[qi.Name], base, haveBase, dt)
				ov.Selected = &qv
				break
			}
		}
	}

	// Exchanges, paged likewise: a long list of queues cannot crowd them
	// out.
	var rate float64
	for _, ei := range topo.Exchanges {
		es := st.Exchanges[ei.Name]
		ov.Totals.Published += es.Published
		if haveBase {
			rate += perSecond(es.Published, base.exchanges[ei.Name].published, dt)
		}
	}
	if haveBase {
		rate = math.Round(rate*1000) / 1000
		ov.Totals.PublishedRate = &rate
	}
	xneedle := strings.ToLower(p.xFilter)
	var exchanges []*tinymq.ExchangeInfo
	for i := range topo.Exchanges {
		if ei := &topo.Exchanges[i]; xneedle == "" || strings.Contains(strings.ToLower(ei.Name), xneedle) {
			exchanges = append(exchanges, ei)
		}
	}
	ov.ExchangePage = pageInfo{Sort: "name", Order: "asc", Filter: clip(p.xFilter), Offset: p.xOffset,
		Limit: p.xLimit, Matched: len(exchanges)}
	budget = exchangeBudget
	end = min(len(exchanges), p.xOffset+p.xLimit)
	for i := p.xOffset; i < end; i++ {
		ei := exchanges[i]
		es := st.Exchanges[ei.Name]
		ev := exchangeView{
			Name:         clip(ei.Name),
			Kind:         ei.Kind.String(),
			Alternate:    clip(ei.Alternate),
			Published:    es.Published,
			Unroutable:   es.Unroutable,
			BindingCount: len(ei.Bindings),
			Bindings:     []bindingView{},

			DedupWindowMillis: millis(ei.DeduplicationWindow),
			Duplicates:        es.Duplicates,
		}
		if haveBase {
			old := base.exchanges[ei.Name]
			ev.Rates = &exchangeRates{
				Published:  perSecond(es.Published, old.published, dt),
				Unroutable: perSecond(es.Unroutable, old.unroutable, dt),
			}
		}
		cost := exchangeFixedBytes + jsonLen(ev.Name) + jsonLen(ev.Kind) + jsonLen(ev.Alternate)
		if cost > budget {
			// Never the first of a page: a bare exchange always fits.
			ov.Truncated = true
			end = i
			break
		}
		budget -= cost
		for j, b := range ei.Bindings {
			if j == maxBindingsShown {
				break
			}
			bv, cost := bindingOf(b)
			if cost > budget {
				ov.Truncated = true
				break
			}
			budget -= cost
			ev.Bindings = append(ev.Bindings, bv)
		}
		ov.Exchanges = append(ov.Exchanges, ev)
	}
	if end < len(exchanges) && end >= p.xOffset {
		ov.ExchangePage.NextOffset = ptr(end)
	}

	ov.DeadLetterSum, ov.DeadGroups = deadGroups(topo, st, s.dead)
	budget = deadLetterBudget
	for _, d := range s.dead {
		dv := deadLetterView{
			Time:               formatTime(d.Time),
			Reason:             clip(string(d.Reason)),
			Exchange:           clip(d.Exchange),
			Queue:              clip(d.Queue),
			RoutingKey:         clip(d.RoutingKey),
			Attempts:           d.Attempts,
			Count:              d.Count,
			MessageID:          d.MessageID,
			LastError:          clip(d.LastError),
			DeadLetterExchange: clip(d.DeadLetterExchange),
			Dropped:            d.Dropped,
			DropCause:          clip(d.DropCause),
		}
		cost := deadLetterFixedBytes + jsonLen(dv.Time) + jsonLen(dv.Reason) + jsonLen(dv.Exchange) +
			jsonLen(dv.Queue) + jsonLen(dv.RoutingKey) + jsonLen(dv.LastError) +
			jsonLen(dv.DeadLetterExchange) + jsonLen(dv.DropCause)
		if cost > budget {
			ov.Truncated = true
			break
		}
		budget -= cost
		ov.DeadLetters = append(ov.DeadLetters, dv)
	}
	return ov, nil
}

func ptr[T any](v T) *T { return &v }

// order names the direction of a sort, for the JSON.
func order(desc bool, sort string) string {
	if sort == "" {
		return ""
	}
	if desc {
		return "desc"
	}
	return "asc"
}

// sortRows sorts queues by key; "" keeps registration order. Ties go by
// name, so that pages do not shuffle between requests.
func sortRows(rows []queueRow, key string, desc bool) {
	if key == "" {
		if desc {
			slices.Reverse(rows)
		}
		return
	}
	slices.SortStableFunc(rows, func(a, b queueRow) int {
		var c int
		switch key {
		case "depth":
			c = cmp.Compare(a.stats.Depth, b.stats.Depth)
		case "rate":
			c = cmp.Compare(a.rate, b.rate)
		}
		if desc {
			c = -c
		}
		if c == 0 {
			c = strings.Compare(a.info.Name, b.info.Name)
			if desc && key == "name" {
				c = -c
			}
		}
		return c
	})
}

// queueViewOf describes one queue.
func (h *handler) queueViewOf(qi *tinymq.QueueInfo, qs tinymq.QueueStats, base sample, haveBase bool, dt time.Duration) queueView {
	qv := queueView{
		Name:               clip(qi.Name),
		Concurrency:        qi.Concurrency,
		Consumers:          qi.Consumers,
		Paused:             qi.Paused,
		Durable:            qi.Durable,
		MaxAttempts:        qi.MaxAttempts,
		MessageTTLMillis:   millis(qi.MessageTTL),
		ExpiryMillis:       millis(qi.Expiry),
		MaxLen:             qi.MaxLen,
		Overflow:           overflowName(qi.Overflow),
		DeadLetterExchange: clip(qi.DeadLetterExchange),
		DeadLetterKey:      clip(qi.DeadLetterKey),
		Filtered:           qi.Filtered,
		Depth:              qs.Depth,
		Ready:              qs.Ready,
		Scheduled:          qs.Scheduled,
		InFlight:           qs.InFlight,
		Counters:           countersOf(qs),

		DeliveryTimeoutMillis: millis(qi.DeliveryTimeout),
		RateLimit:             qi.RateLimit,
		RateBurst:             qi.RateBurst,
		GroupOrdering:         qi.GroupOrdering,
		PayloadType:           clip(qi.PayloadType),
		Abandoned:             qs.Abandoned,
		OldestAgeMillis:       millis(qs.OldestAge),
		ConsumerTime: consumerTime{
			Samples:    qs.ConsumerTime.Samples,
			MeanMillis: millis(qs.ConsumerTime.Mean),
			P50Millis:  millis(qs.ConsumerTime.P50),
			P90Millis:  millis(qs.ConsumerTime.P90),
			P99Millis:  millis(qs.ConsumerTime.P99),
			MaxMillis:  millis(qs.ConsumerTime.Max),
		},
		History: h.history.queue(qi.Name),
	}
	if haveBase {
		// A queue missing from the base did not exist then: its
		// counters started at zero since.
		old, c := base.queues[qi.Name], qv.Counters
		qv.Rates = &queueRates{
			Published:    perSecond(c.Accepted, old.accepted, dt),
			Delivered:    perSecond(c.Delivered, old.delivered, dt),
			Succeeded:    perSecond(c.Succeeded, old.succeeded, dt),
			Failed:       perSecond(c.Failed, old.failed, dt),
			DeadLettered: perSecond(c.DeadLettered, old.deadLettered, dt),
			Dropped:      perSecond(c.Dropped, old.dropped, dt),
		}
	}
	return qv
}

// cost is an upper bound on the queue's JSON.
func (qv *queueView) cost() int {
	return queueFixedBytes + qv.History.size() + jsonLen(qv.Name) + jsonLen(qv.Overflow) + jsonLen(qv.DeadLetterExchange) +
		jsonLen(qv.DeadLetterKey) + jsonLen(qv.PayloadType)
}

// deadGroups adds up the dead letters of every queue (their real totals,
// from Stats) and groups them by queue and reason, the queues with the most
// first (at most maxDeadGroups), with what the ring of recent dead letters
// says of each.
func deadGroups(topo tinymq.Topology, st tinymq.Stats, recent []tinymq.DeadLetter) (deadLetterSum, []deadGroup) {
	var sum deadLetterSum
	var groups []deadGroup
	add := func(name string, deleted bool, qs tinymq.QueueStats) {
		total := qs.DeadLettered + qs.Dropped
		if total == 0 {
			return
		}
		sum.Total += total
		sum.DeadLettered += qs.DeadLettered
		sum.Dropped += qs.Dropped
		sum.Queues++
		expired := min(qs.Expired, total)
		maxlen := min(qs.Overflowed, total-expired)
		g := deadGroup{Queue: name, Deleted: deleted, Total: total, DeadLettered: qs.DeadLettered, Dropped: qs.Dropped}
		for _, r := range []struct {
			reason tinymq.DeathReason
			n      uint64
		}{{tinymq.ReasonRejected, total - expired - maxlen}, {tinymq.ReasonExpired, expired}, {tinymq.ReasonMaxLen, maxlen}} {
			if r.n > 0 {
				g.Reasons = append(g.Reasons, reasonGroup{Reason: string(r.reason), Total: r.n})
			}
		}
		groups = append(groups, g)
	}
	for _, qi := range topo.Queues {
		add(qi.Name, false, st.Queues[qi.Name])
	}
	add("", true, st.Deleted)
	slices.SortFunc(groups, func(a, b deadGroup) int {
		if c := cmp.Compare(b.Total, a.Total); c != 0 {
			return c
		}
		return strings.Compare(a.Queue, b.Queue)
	})
	if len(groups) > maxDeadGroups {
		groups = groups[:maxDeadGroups]
	}
	index := make(map[string]int, len(groups))
	for i, g := range groups {
		if !g.Deleted {
			index[g.Queue] = i
		}
	}
	for _, d := range recent { // newest first
		i, ok := index[d.Queue]
		if !ok {
			continue // a deleted queue, or one not listed
		}
		g := &groups[i]
		j := slices.IndexFunc(g.Reasons, func(r reasonGroup) bool { return r.Reason == string(d.Reason) })
		if j < 0 {
			g.Reasons = append(g.Reasons, reasonGroup{Reason: clip(string(d.Reason))})
			j = len(g.Reasons) - 1
		}
		r := &g.Reasons[j]
		if r.Recent == 0 {
			r.LastTime, r.LastError = formatTime(d.Time), clip(d.LastError)
			r.LastOutcome = "dead-lettered to " + clip(d.DeadLetterExchange)
			if d.Dropped {
				r.LastOutcome = clip("dropped: " + d.DropCause)
			}
		}
		r.Recent++
	}
	for i := range groups {
		groups[i].Queue = clip(groups[i].Queue)
	}
	return sum, groups
}

// bindingsPage is the JSON of api/bindings.
type bindingsPage struct {
	Exchange string        `json:"exchange"`
	Page     pageInfo      `json:"page"`
	Bindings []bindingView `json:"bindings"`
}

// serveBindings lists the bindings of one exchange, paged.
func (h *handler) serveBindings(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("exchange")
	offset, err := intParam(q, "offset", 0, 0, math.MaxInt32)
	if err == nil {
		var limit int
		limit, err = intParam(q, "limit", defaultLimit, 1, maxLimit)
		if err == nil {
			h.writeBindings(w, name, offset, limit)
			return
		}
	}
	writeError(w, http.StatusBadRequest, err.Error())
}

func (h *handler) writeBindings(w http.ResponseWriter, name string, offset, limit int) {
	s, err := h.read(false)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	i, found := slices.BinarySearchFunc(s.topo.Exchanges, name, func(e tinymq.ExchangeInfo, n string) int {
		return strings.Compare(e.Name, n)
	})
	if !found {
		writeError(w, http.StatusNotFound, "not found: no such exchange")
		return
	}
	ei := s.topo.Exchanges[i]
	page := bindingsPage{Exchange: clip(name), Bindings: []bindingView{},
		Page: pageInfo{Offset: offset, Limit: limit, Matched: len(ei.Bindings)}}
	budget := exchangeBudget
	end := min(len(ei.Bindings), offset+limit)
	for j := offset; j < end; j++ {
		bv, cost := bindingOf(ei.Bindings[j])
		if cost > budget && j > offset {
			end = j
			break
		}
		budget -= cost
		page.Bindings = append(page.Bindings, bv)
	}
	if end < len(ei.Bindings) && end >= offset {
		page.Page.NextOffset = ptr(end)
	}
	writeJSON(w, http.StatusOK, page)
}

// bindingOf describes one binding (at most maxKeysShown keys and
// maxTablesShown argument tables) and returns an upper bound on its JSON.
func bindingOf(b tinymq.BindingSpec) (bindingView, int) {
	bv := bindingView{Queue: clip(b.Queue), Keys: []string{}, Args: []map[string]string{},
		Truncated: len(b.Keys) > maxKeysShown || len(b.Args) > maxTablesShown}
	cost := bindingFixedBytes + jsonLen(bv.Queue)
	for _, k := range b.Keys[:min(len(b.Keys), maxKeysShown)] {
		k = clip(k)
		bv.Keys = append(bv.Keys, k)
		cost += jsonLen(k) + 1
	}
	for _, table := range b.Args[:min(len(b.Args), maxTablesShown)] {
		m := make(map[string]string, min(len(table), maxArgEntries+1))
		cost += 3
		keys := slices.Sorted(maps.Keys(table))
		for i, k := range keys {
			if i == maxArgEntries {
				m["…"] = fmt.Sprintf("%d more", len(keys)-maxArgEntries)
				cost += jsonLen("…") + jsonLen(m["…"]) + 2
				break
			}
			ck, cv := clip(k), formatValue(table[k])
			m[ck] = cv
			cost += jsonLen(ck) + jsonLen(cv) + 2
		}
		bv.Args = append(bv.Args, m)
	}
	return bv, cost
}

// formatValue renders an AMQP field value (binding argument) as text of at
// most maxStringBytes: JSON cannot carry every one of them as is (NaN,
// []byte, nested tables of any depth).
func formatValue(v any) string {
	var b strings.Builder
	writeValue(&b, v, 0)
	return clip(b.String())
}

func writeValue(b *strings.Builder, v any, depth int) {
	if b.Len() > maxStringBytes {
		return
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case string:
		b.WriteString(strconv.Quote(clip(v)))
	case []byte:
		b.WriteString(strconv.Quote(clip(string(v))))
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case float32:
		b.WriteString(strconv.FormatFloat(float64(v), 'g', -1, 32))
	case float64:
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		fmt.Fprint(b, v)
	case time.Time:
		b.WriteString(formatTime(v))
	case []any:
		if depth > 4 {
			b.WriteString("[…]")
			return
		}
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() > maxStringBytes {
				break
			}
			writeValue(b, e, depth+1)
		}
		b.WriteByte(']')
	case map[string]any:
		if depth > 4 {
			b.WriteString("{…}")
			return
		}
		b.WriteByte('{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() > maxStringBytes {
				break
			}
			b.WriteString(strconv.Quote(clip(k)))
			b.WriteString(": ")
			writeValue(b, v[k], depth+1)
		}
		b.WriteByte('}')
	default:
		// Validated bindings hold none; say what it is without calling
		// its methods.
		fmt.Fprintf(b, "(%T)", v)
	}
}

// clip makes s valid UTF-8 of at most maxStringBytes, cutting it at a rune
// boundary and marking the cut with "…".
func clip(s string) string { return clipN(s, maxStringBytes) }

// clipN is clip to at most n bytes (n at least 8).
func clipN(s string, n int) string {
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// jsonLen is an upper bound on the length of s (valid UTF-8) encoded as a
// JSON string by encoding/json, quotes included: it escapes control
// characters, quotes, backslashes and <, >, & (as \u003c), and U+2028/U+2029.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c < 0x20, c == '"', c == '\\', c == '<', c == '>', c == '&':
			n += 6
		case c >= 0x80:
			n += 2 // a 3-byte U+2028 becomes 6 bytes
		default:
			n++
		}
	}
	return n
}

// millis converts d to milliseconds, rounded to the microsecond.
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/1e3) / 1e3
}

// formatTime formats t in UTC as RFC 3339, or "" for a zero time or one that
// RFC 3339 cannot hold.
func formatTime(t time.Time) string {
	if t.IsZero() || t.Year() < 0 || t.Year() > 9999 {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// overflowName names a queue's overflow behaviour as RabbitMQ does.
func overflowName(o tinymq.Overflow) string {
	switch o {
	case 0:
		return ""
	case tinymq.DropHead:
		return "drop-head"
	case tinymq.RejectPublish:
		return "reject-publish"
	case tinymq.Block:
		return "block"
	}
	return "overflow(" + strconv.Itoa(int(o)) + ")"
}
