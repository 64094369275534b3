package tinymq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tinymq/tinymq/internal/wal"
)

// WithDataDir makes the MQ keep the messages of its durable queues
// ([WithDurable]) in a write-ahead log in dir, created if missing. The log is
// opened by the first RegisterQueue of a durable queue, or by Start; a second
// MQ, in this process or another, opening the same dir gets an error wrapping
// [ErrLocked] from that call. Stop and Shutdown close it.
//
// With a data directory, message IDs stay unique across restarts: each
// exchange reserves its IDs in blocks recorded in the log.
func WithDataDir(dir string) Option {
	return optionFunc(func(m *MQ) { m.dataDir = dir })
}

// WithLogRepair lets the MQ open a write-ahead log that is damaged before its
// end (a bad record followed by good ones; a torn tail left by a crash is
// always cut): the log is cut at the first bad byte, the bytes cut are kept
// beside it in files named "<segment>.corrupt-<offset>", and what was cut is
// logged. Without it such a log makes Start (or the first RegisterQueue of a
// durable queue) fail with an error wrapping [ErrLog] that names the file and
// the offset. Messages after the damage are lost to the MQ, so repair only
// after keeping a copy of the directory.
func WithLogRepair() Option {
	return optionFunc(func(m *MQ) { m.repairLog = true })
}

// WithSync sets how a Publish to a durable queue waits for the disk. With 0,
// the default, Publish returns nil only once the message is on disk (an
// fdatasync covers it); concurrent publishers share one fdatasync (group
// commit), so throughput grows with them. With an interval d > 0, Publish
// returns once the message is written to the operating system, and the log is
// synced at least every d: a crash of the process loses nothing, a crash of
// the machine or a power loss loses the messages of the last d. A negative d
// is treated as 0.
func WithSync(d time.Duration) Option {
	return optionFunc(func(m *MQ) { m.syncEvery = max(d, 0) })
}

// WithDurable makes the queue keep its messages in the MQ's write-ahead log
// (see [WithDataDir]), so that they survive a crash or a kill -9: a Publish
// that reached the queue returned nil only once the message was on disk, and
// on the next Start with the same directory, after the queue is registered
// again under the same name, every message that its consumer had not
// acknowledged (returned nil for) is delivered again, with
// [Msg.Redelivered] set. Retry attempts and backoffs, delays, TTL deadlines
// and death records survive too.
//
// Data reaches the consumer of a durable queue as an [Encoded], made by the
// MQ's [Codec], every time, before and after a restart alike; a [Handler]
// consumer gets its type T as on any queue. The queue needs a stable name
// ([WithQueueName]) and the MQ a data directory; otherwise RegisterQueue
// returns [ErrInvalidOption].
func WithDurable() QueueOption {
	return queueOptionFunc(func(c *queueConfig) error {
		c.durable = true
		return nil
	})
}

// walFaults, set only by tests, injects disk faults into every log opened.
var walFaults *wal.Faults

// idBlock is how many message IDs an exchange reserves in the log at a time.
const idBlock = 4096

// durableLog is an MQ's write-ahead log and what it knows of it.
type durableLog struct {
	log   *wal.Log
	codec Codec

	mu        sync.Mutex
	refs      map[string]*msgRefs        // message key -> the durable queues still holding it
	recovered map[string][]*recoveredMsg // queue -> its messages found on disk, not yet registered
	seqs      map[string]uint64          // exchange -> IDs reserved before this run
}

// msgRefs is what the log knows of one live message: how many durable queues
// still hold it, and which acknowledged it already (their a/ keys go with it).
type msgRefs struct {
	pending int
	acked   []string // queues whose a/ key is in the log
	stated  []string // queues whose s/ key is in the log
}

// recoveredMsg is a message found on disk for one queue.
type recoveredMsg struct {
	key   string
	id    uint64
	exch  string
	msg   *storedMsg
	state queueState
}

// openLog opens the MQ's log and reads what it holds. The caller holds the
// write lock. It returns nil at once when the log is open or there is no data
// directory.
func (m *MQ) openLog() error {
	if m.dur != nil || m.dataDir == "" {
		return m.durErr
	}
	l, err := wal.Open(m.dataDir, wal.Options{Sync: wal.SyncInterval(m.syncEvery), Repair: m.repairLog, Logger: m.log, Faults: walFaults})
	if err != nil {
		if errors.Is(err, wal.ErrLocked) {
			err = fmt.Errorf("%w: %w", ErrLocked, err)
		} else {
			err = fmt.Errorf("%w: opening %s: %w", ErrLog, m.dataDir, err)
		}
		m.durErr = err
		return err
	}
	d := &durableLog{log: l, codec: m.codec, refs: make(map[string]*msgRefs),
		recovered: make(map[string][]*recoveredMsg), seqs: make(map[string]uint64)}
	if err := d.recover(); err != nil {
		_ = l.Close()
		m.durErr = fmt.Errorf("%w: reading %s: %w", ErrLog, m.dataDir, err)
		return m.durErr
	}
	m.dur = d
	for name, ex := range m.exchanges { // declared before the log was open: nothing published yet
		if ex.seq.Load() == 0 {
			ex.base = d.seqs[name]
			ex.seq.Store(ex.base)
		}
	}
	return nil
}

// recover rebuilds refs, recovered and seqs from the log.
func (d *durableLog) recover() error {
	msgs := make(map[string]*storedMsg)
	acked := make(map[string][]string) // message key -> queues
	states := make(map[string]map[string]queueState)
	var bad error
	err := d.log.Range(func(k, v []byte) bool {
		switch string(k[:min(len(k), 2)]) {
		case "m/":
			s, err := decodeStoredMsg(v)
			if err != nil {
				bad = err
				return false
			}
			msgs[string(k)] = s
		case "a/":
			q, mk, ok := parseQueueKey(k)
			if !ok {
				bad = errBadRecord
				return false
			}
			acked[mk] = append(acked[mk], q)
		case "s/":
			q, mk, ok := parseQueueKey(k)
			st, err := decodeQueueState(v)
			if !ok || err != nil {
				bad = errBadRecord
				return false
			}
			if states[mk] == nil {
				states[mk] = make(map[string]queueState)
			}
			states[mk][q] = st
		case "x/":
			r := &reader{b: v}
			if n := r.uvarint(); r.err == nil {
				d.seqs[string(k[2:])] = n
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	if bad != nil {
		return bad
	}
	for k, s := range msgs {
		exch, id, ok := parseMsgKey(k)
		if !ok {
			return errBadRecord
		}
		d.seqs[exch] = max(d.seqs[exch], id)
		r := &msgRefs{acked: acked[k]}
		for q := range states[k] {
			r.stated = append(r.stated, q)
		}
		for _, q := range s.queues {
			if slices.Contains(r.acked, q) {
				continue
			}
			r.pending++
			d.recovered[q] = append(d.recovered[q], &recoveredMsg{key: k, id: id, exch: exch, msg: s, state: states[k][q]})
		}
		d.refs[k] = r
	}
	for _, list := range d.recovered {
		slices.SortFunc(list, func(a, b *recoveredMsg) int {
			if c := cmpInt64(a.msg.publishedAt, b.msg.publishedAt); c != 0 {
				return c
			}
			return cmpInt64(int64(a.id), int64(b.id))
		})
	}
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// reserveIDs makes sure that IDs up to id of ex are recorded as used before
// any of them is handed out, so that IDs stay unique across restarts. It
// reserves idBlock IDs at a time, and the next block once half of the current
// one is used, by one publisher while the others go on; a publisher blocks
// for the commit only when the IDs run out before that reservation is done.
//
// With b, the batch of a message about to be committed, the reservation ahead
// joins b instead of costing a commit (and a publisher a whole sync) of its
// own: then done must be called once b's commit returned, with its outcome.
func (m *MQ) reserveIDs(ex *exchange, id uint64, b *wal.Batch) (done func(committed bool), err error) {
	d := m.dur
	if d == nil {
		return noReserve, nil
	}
	if r := ex.reserved.Load(); id <= r {
		if r-id >= idBlock/2 || !ex.reserveMu.TryLock() {
			return noReserve, nil
		}
		// Running low: reserve ahead. A failure is not this publish's (its
		// ID is reserved); the publish that needs the IDs reports it.
		if ex.reserved.Load() != r {
			ex.reserveMu.Unlock()
			return noReserve, nil
		}
		if b != nil {
			putReserved(b, ex, r+idBlock)
			return func(committed bool) {
				if committed {
					ex.reserved.Store(r + idBlock)
				}
				ex.reserveMu.Unlock()
			}, nil
		}
		_ = m.commitReserved(ex, r+idBlock)
		ex.reserveMu.Unlock()
		return noReserve, nil
	}
	ex.reserveMu.Lock()
	defer ex.reserveMu.Unlock()
	if id <= ex.reserved.Load() {
		return noReserve, nil
	}
	return noReserve, m.commitReserved(ex, id+idBlock)
}

func noReserve(bool) {}

func putReserved(b *wal.Batch, ex *exchange, next uint64) {
	var buf [binary.MaxVarintLen64]byte
	b.Put([]byte("x/"+ex.name), binary.AppendUvarint(buf[:0], next))
}

// commitReserved records that ex's IDs up to next are reserved. The caller
// holds ex.reserveMu.
func (m *MQ) commitReserved(ex *exchange, next uint64) error {
	var b wal.Batch
	putReserved(&b, ex, next)
	if err := m.dur.log.Commit(&b); err != nil {
		return fmt.Errorf("%w: reserving message IDs: %w", ErrLog, err)
	}
	ex.reserved.Store(next)
	return nil
}

// encodeData encodes a published value with the MQ's codec. Data that is
// already an Encoded (a dead letter of a durable queue) keeps its bytes. The
// codec is user code: it runs on a goroutine of its own, joined here, so that
// a panic, an error or even runtime.Goexit in it becomes an error wrapping
// ErrPayloadType and never unwinds the publisher, which holds the MQ's read
// lock and room in its queues. A goroutine costs about a microsecond, next to
// the fdatasync a durable publish waits for.
func encodeData(c Codec, data any) ([]byte, error) {
	if e, ok := data.(Encoded); ok {
		return e.Body, nil
	}
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		r := result{err: fmt.Errorf("%w: the codec called runtime.Goexit", ErrPayloadType)}
		defer func() {
			if p := recover(); p != nil {
				r = result{err: fmt.Errorf("%w: the codec panicked: %v", ErrPayloadType, p)}
			}
			done <- r
		}()
		b, err := c.Marshal(data)
		if err != nil {
			r = result{err: fmt.Errorf("%w: encoding: %w", ErrPayloadType, err)}
		} else {
			r = result{b: b}
		}
	}()
	r := <-done
	return r.b, r.err
}

// ack records that queue is done with the message of key (acknowledged,
// dead-lettered, dropped or expired). With b, the records join b (so that a
// dead letter's move is one atomic batch); otherwise they are ordered in the
// log without waiting for a sync.
func (d *durableLog) ack(queue, key string, b *wal.Batch) {
	d.mu.Lock()
	r := d.refs[key]
	if r == nil {
		r = &msgRefs{pending: 1}
	}
	last := r.pending <= 1
	stated := slices.Contains(r.stated, queue)
	var acked, states []string
	if last {
		acked, states = r.acked, r.stated
		delete(d.refs, key)
	} else {
		r.pending--
		r.acked = append(r.acked, queue)
		if stated {
			r.stated = slices.DeleteFunc(r.stated, func(q string) bool { return q == queue })
		}
	}
	d.mu.Unlock()
	async := b == nil
	if async {
		sc := getScratch()
		defer putScratch(sc)
		b = &sc.b
	}
	// Only keys that are in the log are deleted: a message that one queue
	// acknowledges without a retry costs one Delete.
	if last {
		b.Delete([]byte(key))
		for _, q := range acked {
			b.Delete(queueKey("a/", q, key))
		}
		for _, q := range states {
			b.Delete(queueKey("s/", q, key))
		}
	} else {
		b.Put(queueKey("a/", queue, key), nil)
		if stated {
			b.Delete(queueKey("s/", queue, key))
		}
	}
	if async {
		_ = d.log.CommitAsync(b) // a lost acknowledgement means a redelivery
	}
}

// saveState records a message's retry state in queue, without waiting.
func (d *durableLog) saveState(queue, key string, st queueState) {
	d.mu.Lock()
	r := d.refs[key]
	if r == nil { // a message of one durable queue: logMessage kept no refs
		r = &msgRefs{pending: 1}
		d.refs[key] = r
	}
	if !slices.Contains(r.stated, queue) {
		r.stated = append(r.stated, queue)
	}
	d.mu.Unlock()
	sc := getScratch()
	defer putScratch(sc)
	sc.b.Put(queueKey("s/", queue, key), st.encode())
	_ = d.log.CommitAsync(&sc.b)
}

// takeRecovered returns, and forgets, what the log holds for queue.
func (d *durableLog) takeRecovered(queue string) []*recoveredMsg {
	d.mu.Lock()
	defer d.mu.Unlock()
	list := d.recovered[queue]
	delete(d.recovered, queue)
	return list
}

// unregistered reports how many messages the log holds for each durable
// queue that this process has not registered.
func (d *durableLog) unregistered() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]int, len(d.recovered))
	for q, list := range d.recovered {
		out[q] = len(list)
	}
	return out
}

// restore enqueues the messages the log held for q, as they were: ready,
// delayed, or backing off before a retry. q is new and the caller holds the
// MQ's write lock.
func (m *MQ) restore(q *queue) {
	list := m.dur.takeRecovered(q.name)
	if len(list) == 0 {
		return
	}
	now := time.Now()
	var later []schedItem
	q.mu.Lock()
	for _, r := range list {
		s := r.msg
		msg := &Msg{ID: r.id, Exchange: r.exch, Queue: q.name, RoutingKey: s.routingKey, Headers: s.headers,
			Data: Encoded{Body: s.body, Codec: m.codec}, Attempt: r.state.attempt, Deaths: s.deaths,
			Redelivered: true, x: &msgExt{dkey: r.key}}
		if r.state.lastErr != "" {
			msg.x.lastErr = errors.New(r.state.lastErr)
		}
		ttl := s.expiration
		if q.cfg.ttl > 0 && (ttl == 0 || q.cfg.ttl < ttl) {
			ttl = q.cfg.ttl
		}
		if ttl > 0 {
			msg.x.expires = deadline(time.Unix(0, s.visibleAt), ttl)
		}
		q.accepted++
		q.entered++
		due := max(s.visibleAt, r.state.dueAt)
		if due > now.UnixNano() {
			q.scheduled++
			later = append(later, schedItem{due: time.Unix(0, due), q: q, m: msg})
			continue
		}
		q.buf.push(entry{m: msg})
	}
	expiry := q.armExpiryLocked()
	q.mu.Unlock()
	q.wakeAfter(false, expiry)
	for _, it := range later {
		m.sched.add(it.due, it.q, it.m)
	}
	m.logAttrs(slog.LevelInfo, "tinymq: durable queue recovered from the log", func(a []slog.Attr) []slog.Attr {
		return append(a, slog.String("queue", q.name), slog.Int("count", len(list)))
	})
}

// closeLog closes the log, once every worker has returned.
func (m *MQ) closeLog() {
	if m.dur == nil {
		return
	}
	if err := m.dur.log.Close(); err != nil {
		m.logAttrs(slog.LevelError, "tinymq: closing the log", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.String("err", err.Error()))
		})
	}
}
