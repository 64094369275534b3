package tinymq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
	"github.com/tinymq/tinymq/internal/wal"
)

// walFaults, set only by tests, injects disk faults into every log opened.
var walFaults *wal.Faults

// idBlock is how many message IDs an exchange reserves in the log at a time.
const idBlock = 4096

// durableLog is an MQ's write-ahead log and what it knows of it.
//
// Records that must follow one another in the log in the order of the
// changes they record (a declaration, a delete's tombstone, a purge) are
// ordered with CommitAsync while d.mu is held, and a caller that must wait
// for them then calls Sync without it: the log keeps the order of
// CommitAsync calls, while a Commit may be overtaken by a later CommitAsync.
type durableLog struct {
	m     *MQ
	log   *wal.Log
	logs  *walLogger // what the log reports, to the MQ's logger
	codec Codec

	mu        sync.Mutex
	refs      map[string]*msgRefs          // message key -> the durable queues still holding it
	recovered map[string][]recoveredMsg    // queue -> its messages found on disk, not yet registered
	readyAt   map[string]int64             // queue of recovered -> the earliest time one of its messages is ready (see oldestRecovered)
	seqs      map[string]uint64            // exchange -> IDs reserved before this run
	tombs     map[string]map[string]uint64 // queue -> the d/ tombstone this run wrote for it (see deleteQueue)
	decls     map[string][]byte            // durable queue -> its q/ record in the log (see declared)
	dedups    map[string][]dedupRecord     // exchange -> its unexpired i/ records, until it is declared (see restoreDedup)

	garbage     []garbage // messages that recover found no queue holding, for collect
	garbageKeys []string  // and keys that no longer matter: tombstones, a/ and s/ keys of messages gone
	tombAcks    []string  // a/ keys that replace the tombstones for the messages that stay, for collect

	idsFailed atomic.Bool // a reservation of IDs failed: the log has failed, none is tried again
	idsWarned atomic.Bool // and that was logged (once)
}

// msgRefs is what the log knows of one live message: how many durable queues
// still hold it, and which acknowledged it already (their a/ keys go with it).
type msgRefs struct {
	pending int
	acked   []string // queues whose a/ key is in the log
	stated  []string // queues whose s/ key is in the log
}

// garbage is a message that no queue holds any more, since the queues that
// did were deleted: its key, and the queues whose a/ and s/ keys may go
// with it.
type garbage struct {
	key    string
	queues []string
}

// collect deletes the garbage that recover found, and puts the a/ keys that
// replace the tombstones, in one batch, without waiting. A collection lost
// in a crash is made again by the next recovery.
func (d *durableLog) collect() {
	if len(d.garbage) == 0 && len(d.garbageKeys) == 0 && len(d.tombAcks) == 0 {
		return
	}
	var b wal.Batch
	for _, k := range d.tombAcks {
		b.Put([]byte(k), nil)
	}
	for _, g := range d.garbage {
		b.Delete([]byte(g.key))
		for _, q := range g.queues {
			b.Delete(queueKey("a/", q, g.key))
			b.Delete(queueKey("s/", q, g.key))
		}
	}
	for _, k := range d.garbageKeys {
		b.Delete([]byte(k))
	}
	d.garbage, d.garbageKeys, d.tombAcks = nil, nil, nil
	_ = d.log.CommitAsync(&b)
}

// recoveredMsg is a message found on disk for one queue: what restore needs
// to queue it. Its routing key, headers, deaths and body stay on disk until
// it is delivered (see queue.load).
type recoveredMsg struct {
	key         string // the log index's own string
	id          uint64
	publishedAt int64
	visibleAt   int64
	expiration  time.Duration
	state       *queueState // nil unless the queue retried it
	group       string      // WithMessageGroup, or ""
}

// openLog opens the MQ's log and reads what it holds. The caller holds the
// write lock. It returns nil at once when the log is open or there is no data
// directory. A failure keeps nothing (the log closes what it opened) and is
// not remembered: the next call tries again, so that a retry succeeds once
// the cause (another process holding the directory, a directory that was
// not writable) is gone.
func (m *MQ) openLog() error {
	if m.syncEvery < 0 {
		return fmt.Errorf("%w: WithSync(%v): a sync interval cannot be negative", ErrInvalidOption, m.syncEvery)
	}
	if m.dur != nil || m.dataDir == "" {
		return nil
	}
	wl := newWalLogger(m)
	defer wl.opened() // in every case: what the log said while opening (or failing to) is logged by unlock
	l, err := wal.Open(m.dataDir, wal.Options{Sync: wal.SyncInterval(m.syncEvery), Repair: m.repairLog, Log: wl.log, Faults: walFaults})
	if err != nil {
		if errors.Is(err, wal.ErrLocked) {
			err = fmt.Errorf("%w: %w", ErrLocked, err)
		} else {
			err = fmt.Errorf("%w: opening %s: %w", ErrLog, m.dataDir, err)
		}
		return err
	}
	d := &durableLog{m: m, log: l, logs: wl, codec: m.codec, refs: make(map[string]*msgRefs),
		recovered: make(map[string][]recoveredMsg), seqs: make(map[string]uint64),
		tombs: make(map[string]map[string]uint64), decls: make(map[string][]byte)}
	if err := d.recover(); err != nil {
		_ = l.Close()
		return fmt.Errorf("%w: reading %s: %w", ErrLog, m.dataDir, err)
	}
	m.dur = d
	d.collect()
	for name, ex := range m.exchanges { // declared before the log was open: nothing published yet
		if ex.seq.Load() == 0 {
			ex.base = d.seqs[name]
			ex.seq.Store(ex.base)
		}
		d.restoreDedup(ex)
	}
	return nil
}

// recover rebuilds refs, recovered and seqs from the log.
//
// It keeps, and decodes, only what ordering and the ledger need: each
// message's times and queues. The rest stays on disk until the message is
// delivered (see queue.load), as RabbitMQ's classic queues keep a backlog on
// disk and only its index in memory. It costs about a microsecond and 150
// bytes of transient memory per message (BenchmarkRecover): the log is read
// in its own order, many values per read; a message allocates nothing but
// its queue list when it differs from the message before's, its key is the
// log index's own string, and only what is not the common case (a message of
// one queue, never acknowledged or retried) gets a refs entry or a map
// lookup. Each queue's list is sorted unless it is already in order, as it
// mostly is in the log.
//
// It also reads the declarations of durable queues (q/) and the tombstones
// of deleted ones (d/), and applies the tombstones: a message that a deleted
// queue held is not that queue's, as if the queue had acknowledged it. It
// leaves for collect what no longer matters: the messages that no queue
// holds any more, every tombstone, replaced by the a/ keys of the deleted
// queue for the messages it covers that another queue still holds (no
// message can come later for a tombstone to cover: a queue of that name
// declared after the delete gets higher IDs), and the a/ and s/ keys of
// messages that are gone (an acknowledgement ordered after the last one,
// which deleted the message, leaves one).
func (d *durableLog) recover() error {
	type logged struct {
		key         string // the log index's own string
		publishedAt int64
		visibleAt   int64
		expiration  time.Duration
		queues      []string // shared with the message before when equal
		group       string
	}
	var (
		msgs   = make([]logged, 0, d.log.Stats().LiveKeys)
		acked  = make(map[string][]string) // message key -> queues
		states = make(map[string]map[string]queueState)
		tombs  map[string]map[string]uint64 // deleted queue -> exchange -> IDs up to which its messages are not the queue's
		dec    msgDecoder
		bad    error
		now    = time.Now().UnixNano() // what i/ records expire by
	)
	err := d.log.Scan(func(k string, v []byte) bool {
		switch k[:min(len(k), 2)] {
		case "m/":
			var s storedMsg
			if err := dec.decode(&s, v, true); err != nil {
				bad = err
				return false
			}
			msgs = append(msgs, logged{key: k, publishedAt: s.publishedAt, visibleAt: s.visibleAt,
				expiration: s.expiration, queues: s.queues, group: s.group})
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
				d.seqs[k[2:]] = n
			}
		case "d/":
			up, err := decodeTombstone(v)
			if err != nil {
				bad = err
				return false
			}
			if tombs == nil {
				tombs = make(map[string]map[string]uint64)
			}
			tombs[k[2:]] = up
		case "i/":
			ex, id, ok := parseQueueKey(k)
			at, window, err := decodeDedup(v)
			if !ok || err != nil {
				bad = errBadRecord
				return false
			}
			if now-at >= int64(window) {
				d.garbageKeys = append(d.garbageKeys, k)
				break
			}
			if d.dedups == nil {
				d.dedups = make(map[string][]dedupRecord)
			}
			d.dedups[ex] = append(d.dedups[ex], dedupRecord{id: id, at: at})
		case "q/":
			if _, err := decodeQueueRecord(k[2:], v); err != nil {
				bad = err
				return false
			}
			d.decls[k[2:]] = slices.Clone(v)
		}
		return true
	})
	if err != nil {
		return err
	}
	if bad != nil {
		return bad
	}
	var tombed map[string][]string // message key -> the deleted queues whose tombstone acknowledged it
	if len(tombs) > 0 {
		// A deleted queue's messages from before its delete are not its
		// own: as if it had acknowledged them. One that no queue holds any
		// more is garbage, deleted once the log is open; one that another
		// queue holds gets the a/ key, and the tombstone goes.
		tombed = make(map[string][]string)
		for i := range msgs {
			e := &msgs[i]
			ex, id, ok := parseMsgKey(e.key)
			if !ok {
				return errBadRecord
			}
			for _, q := range e.queues {
				if up, ok := tombs[q][ex]; ok && id <= up && !slices.Contains(acked[e.key], q) {
					acked[e.key] = append(acked[e.key], q)
					tombed[e.key] = append(tombed[e.key], q)
				}
			}
		}
		for q := range tombs {
			d.garbageKeys = append(d.garbageKeys, "d/"+q)
		}
	}
	// Each queue's messages go into one slice, sized first.
	type qlist struct {
		n    int // messages, counted first
		list []recoveredMsg
	}
	lists := make(map[string]*qlist)
	var last []string      // decode shares the queue list of consecutive messages,
	var lastLists []*qlist // and so these look-ups
	listsOf := func(qs []string) []*qlist {
		if len(qs) > 0 && len(last) == len(qs) && &qs[0] == &last[0] {
			return lastLists
		}
		last, lastLists = qs, lastLists[:0]
		for _, q := range qs {
			l := lists[q]
			if l == nil {
				l = &qlist{}
				lists[q] = l
			}
			lastLists = append(lastLists, l)
		}
		return lastLists
	}
	for i := range msgs {
		e := &msgs[i]
		ak := acked[e.key]
		for j, l := range listsOf(e.queues) {
			if !slices.Contains(ak, e.queues[j]) {
				l.n++
			}
		}
	}
	for _, l := range lists {
		l.list = make([]recoveredMsg, 0, l.n)
	}
	last = nil
	seqsOf := func(exch string, id uint64) { d.seqs[exch] = max(d.seqs[exch], id) }
	var exch string // the exchange of the run of messages before, and its highest ID
	var top uint64
	var found map[string]bool // messages with a/ or s/ keys: the others' keys are garbage
	if len(acked) > 0 || len(states) > 0 {
		found = make(map[string]bool, max(len(acked), len(states)))
	}
	for i := range msgs {
		e := &msgs[i]
		k := e.key
		ex, id, ok := parseMsgKey(k)
		if !ok {
			return errBadRecord
		}
		if ex != exch || top == 0 {
			if top != 0 {
				seqsOf(exch, top)
			}
			exch, top = ex, id
		}
		top = max(top, id)
		var ak []string
		var st map[string]queueState
		if len(acked) > 0 {
			ak = acked[k]
		}
		if len(states) > 0 {
			st = states[k]
		}
		if ak != nil || st != nil {
			found[k] = true
		}
		pending := 0
		for j, l := range listsOf(e.queues) {
			if q := e.queues[j]; !slices.Contains(ak, q) {
				pending++
				r := recoveredMsg{key: k, id: id, publishedAt: e.publishedAt, visibleAt: e.visibleAt, expiration: e.expiration, group: e.group}
				if s, ok := st[q]; ok {
					r.state = &s
				}
				l.list = append(l.list, r)
			}
		}
		if pending == 0 { // every queue's is gone (see tombs)
			d.garbage = append(d.garbage, garbage{key: k, queues: e.queues})
			continue
		}
		for _, q := range tombed[k] {
			d.tombAcks = append(d.tombAcks, string(queueKey("a/", q, k)))
		}
		// A message of one queue, never acknowledged by another nor retried,
		// needs no refs entry: ack and saveState take a missing one for that.
		if pending != 1 || len(ak) > 0 || len(st) > 0 {
			r := &msgRefs{pending: pending, acked: ak}
			for q := range st {
				r.stated = append(r.stated, q)
			}
			d.refs[k] = r
		}
	}
	if top != 0 {
		seqsOf(exch, top)
	}
	for mk, qs := range acked {
		if !found[mk] {
			for _, q := range qs {
				d.garbageKeys = append(d.garbageKeys, string(queueKey("a/", q, mk)))
			}
		}
	}
	for mk, st := range states {
		if !found[mk] {
			for q := range st {
				d.garbageKeys = append(d.garbageKeys, string(queueKey("s/", q, mk)))
			}
		}
	}
	byPublished := func(a, b recoveredMsg) int {
		if c := cmpInt64(a.publishedAt, b.publishedAt); c != 0 {
			return c
		}
		return cmpInt64(int64(a.id), int64(b.id))
	}
	for q, l := range lists {
		if len(l.list) == 0 {
			continue
		}
		if !slices.IsSortedFunc(l.list, byPublished) {
			slices.SortFunc(l.list, byPublished)
		}
		d.recovered[q] = l.list
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
		if r-id >= idBlock/2 || d.idsFailed.Load() || !ex.reserveMu.TryLock() {
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

// errReserveFailed is what reserveIDs returns once a reservation failed.
var errReserveFailed = fmt.Errorf("%w: reserving message IDs: an earlier reservation failed", ErrLog)

// reserveDue reports whether reserveIDs could commit for id: false while id
// is reserved with at least half a block to spare (reservations only grow,
// so the answer stays right), and once a reservation failed (the log failed
// for good: in-memory publishes go on without one).
func (d *durableLog) reserveDue(ex *exchange, id uint64) bool {
	if d.idsFailed.Load() {
		return false
	}
	r := ex.reserved.Load()
	return id > r || r-id < idBlock/2
}

func putReserved(b *wal.Batch, ex *exchange, next uint64) {
	var buf [binary.MaxVarintLen64]byte
	b.Put([]byte("x/"+ex.name), binary.AppendUvarint(buf[:0], next))
}

// commitReserved records that ex's IDs up to next are reserved. The caller
// holds ex.reserveMu.
func (m *MQ) commitReserved(ex *exchange, next uint64) error {
	if m.dur.idsFailed.Load() {
		return errReserveFailed
	}
	var b wal.Batch
	putReserved(&b, ex, next)
	if err := m.dur.log.Commit(&b); err != nil {
		m.dur.idsFailed.Store(true)
		return fmt.Errorf("%w: reserving message IDs: %w", ErrLog, err)
	}
	ex.reserved.Store(next)
	return nil
}

// encodeData encodes a published value with the MQ's codec. Data that is
// already an Encoded (a dead letter of a durable queue) keeps its bytes. The
// codec is user code: it runs with no MQ lock held, on a goroutine of its
// own that counts as the MQ's (a Stop it calls does not wait for itself),
// joined here, so that a panic, an error or even runtime.Goexit in it becomes
// an error wrapping ErrPayloadType and never unwinds the publisher, which
// holds room in its queues. A goroutine costs about a microsecond, next to
// the fdatasync a durable publish waits for.
func (m *MQ) encodeData(c Codec, data any) ([]byte, error) {
	if e, ok := data.(Encoded); ok {
		return e.Body, nil
	}
	var b []byte
	var err error
	p, returned := m.own.Guard(func() {
		var e error
		if b, e = c.Marshal(data); e != nil {
			err = fmt.Errorf("%w: encoding: %w", ErrPayloadType, e)
		}
	})
	switch {
	case p != nil:
		text := "a value whose methods called runtime.Goexit"
		m.own.Guard(func() { text = guard.ValueText(p) })
		return nil, fmt.Errorf("%w: the codec panicked: %s", ErrPayloadType, text)
	case !returned:
		if err == nil { // Goexit in Marshal, not in the error's methods
			err = fmt.Errorf("%w: the codec called runtime.Goexit", ErrPayloadType)
		}
		return nil, err
	}
	return b, err
}

// deadSource is a durable queue's message being dead-lettered: its
// acknowledgement joins the dead letter's log record when the dead letter
// reaches a durable queue (moved), and is made on its own otherwise
// (ackUnmoved).
type deadSource struct {
	queue, key string
	moved      bool
}

// ackUnmoved acknowledges src's message unless the dead letter's record
// carried the acknowledgement. A nil src has nothing to acknowledge.
func (d *durableLog) ackUnmoved(src *deadSource) {
	if src != nil && !src.moved {
		d.ack(src.queue, src.key, nil)
	}
}

// ack records that queue is done with the message of key (acknowledged,
// dead-lettered, dropped or expired). With b, the records join b (so that a
// dead letter's move is one atomic batch); otherwise they are ordered in the
// log without waiting for a sync.
func (d *durableLog) ack(queue, key string, b *wal.Batch) {
	d.mu.Lock()
	a := d.settleLocked(queue, key)
	d.mu.Unlock()
	async := b == nil
	if async {
		sc := getScratch()
		defer putScratch(sc)
		b = &sc.b
	}
	a.put(b, queue, key)
	if async {
		_ = d.log.CommitAsync(b) // a lost acknowledgement means a redelivery
	}
}

// ackLocked is ack into b with d.mu held: for the batches that d.mu orders
// (see durableLog).
func (d *durableLog) ackLocked(queue, key string, b *wal.Batch) {
	a := d.settleLocked(queue, key)
	a.put(b, queue, key)
}

// settled is what an acknowledgement changes in the log: the message goes
// (last), with the a/ and s/ keys of acked and states; or the queue's a/ key
// is put, and its s/ key deleted if stated.
type settled struct {
	last          bool
	stated        bool
	acked, states []string
}

// settleLocked counts queue's acknowledgement of the message of key in its
// refs and returns what the log must record. d.mu is held.
func (d *durableLog) settleLocked(queue, key string) settled {
	r := d.refs[key]
	if r == nil {
		r = &msgRefs{pending: 1}
	}
	a := settled{last: r.pending <= 1, stated: slices.Contains(r.stated, queue)}
	if a.last {
		a.acked, a.states = r.acked, r.stated
		delete(d.refs, key)
	} else {
		r.pending--
		r.acked = append(r.acked, queue)
		if a.stated {
			r.stated = slices.DeleteFunc(r.stated, func(q string) bool { return q == queue })
		}
	}
	return a
}

// put adds to b what a records of queue's acknowledgement of key. Only keys
// that are in the log are deleted: a message that one queue acknowledges
// without a retry costs one Delete.
func (a *settled) put(b *wal.Batch, queue, key string) {
	if a.last {
		b.Delete([]byte(key))
		for _, q := range a.acked {
			b.Delete(queueKey("a/", q, key))
		}
		for _, q := range a.states {
			b.Delete(queueKey("s/", q, key))
		}
		return
	}
	b.Put(queueKey("a/", queue, key), nil)
	if a.stated {
		b.Delete(queueKey("s/", queue, key))
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

// ackAll records, in one batch, that queue is done with the messages of
// keys (a purge), and waits until it is durable: an fdatasync, whatever
// WithSync says. The caller holds no MQ lock. It returns an error wrapping
// ErrLog if the log did not take the batch: the messages may then come back
// after a restart.
func (d *durableLog) ackAll(queue string, keys []string) error {
	var b wal.Batch
	d.mu.Lock()
	for _, k := range keys {
		d.ackLocked(queue, k, &b)
	}
	err := d.log.CommitAsync(&b)
	d.mu.Unlock()
	return d.synced(err)
}

// synced waits for the sync of what was ordered before, unless err (of the
// CommitAsync that ordered it) is already an error; either is wrapped in
// ErrLog.
func (d *durableLog) synced(err error) error {
	if err == nil {
		err = d.log.Sync()
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrLog, err)
	}
	return nil
}

// deleteQueue records, in one batch, that the durable queue was deleted,
// and waits until that is durable (an fdatasync, whatever WithSync says). The
// batch holds:
//
//   - the queue's tombstone: no message with an ID up to upTo's for its
//     exchange is the queue's any more, so that after a crash the messages
//     that were in a consumer (or on their way into the queue) at the delete
//     do not come back either. upTo is the MQ's IDs when the queue was
//     deleted (idsUpTo, under the write lock): a queue of that name declared
//     later only gets higher ones. It is merged with the tombstone of the
//     queue's earlier delete in this run, if any, so that a queue deleted
//     twice keeps the higher IDs whichever delete's batch the log takes
//     last (recover replaces the tombstones of earlier runs by a/ keys);
//   - the removal of its declaration (q/), unless a durable queue of that
//     name has been declared since (then the record is that one's);
//   - the acknowledgements of the waiting messages that the delete removed
//     (keys), which frees them now.
//
// The caller holds no MQ lock: deleteQueue takes the read lock while it
// orders the batch, so that no queue of that name is declared meanwhile. It
// returns an error wrapping ErrLog if the log did not take the batch: the
// queue may then come back after a restart.
func (d *durableLog) deleteQueue(queue string, keys []string, upTo map[string]uint64) error {
	m := d.m
	m.mu.RLock()
	redeclared := false
	if q := m.queues[queue]; q != nil && q.cfg.durable {
		redeclared = true
	}
	var b wal.Batch
	d.mu.Lock()
	tomb := upTo
	if old := d.tombs[queue]; old != nil {
		tomb = maps.Clone(upTo)
		for ex, id := range old {
			tomb[ex] = max(tomb[ex], id)
		}
	}
	d.tombs[queue] = tomb
	b.Put(append([]byte("d/"), queue...), encodeTombstone(tomb))
	if !redeclared {
		delete(d.decls, queue)
		b.Delete(append([]byte("q/"), queue...))
	}
	for _, k := range keys {
		d.ackLocked(queue, k, &b)
	}
	err := d.log.CommitAsync(&b)
	d.mu.Unlock()
	m.mu.RUnlock()
	return d.synced(err)
}

// declared records that the durable queue is declared as val (a
// queueRecord's encoding: see logDeclared), unless the log holds that record
// already. It orders the record without waiting for it (it becomes durable
// with the next sync: at the latest that of any durable publish after it),
// so the caller may hold the MQ's write lock, and holds it in fact (see
// deleteQueue). It returns an error wrapping ErrLog if the log did not take
// it.
func (d *durableLog) declared(queue string, val []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.decls[queue]; ok && bytes.Equal(old, val) {
		return nil
	}
	d.decls[queue] = val
	var b wal.Batch
	b.Put(append([]byte("q/"), queue...), val)
	if err := d.log.CommitAsync(&b); err != nil {
		return fmt.Errorf("%w: %w", ErrLog, err)
	}
	return nil
}

// logDeclared records q's declaration in the log, as a q/ record of its
// settings and of every binding it has now (see queueRecord), when q is a
// durable queue of an MQ with a log and the record changed; otherwise it does
// nothing. The MQ calls it whenever a durable queue is created or its
// bindings change. The caller holds the write lock; the record is ordered
// without waiting for the disk (see declared). A failure is logged (held for
// unlock), not returned: the declaration itself has happened, and only a
// listing after a restart may miss it.
func (m *MQ) logDeclared(q *queue) {
	if m.dur == nil || m.engine != nil || !q.cfg.durable || q.gone {
		return
	}
	names := make([]string, 0, len(m.exchanges))
	for name := range m.exchanges {
		names = append(names, name)
	}
	slices.Sort(names)
	var specs []BindingSpec
	for _, name := range names {
		for _, s := range m.exchanges[name].bindings {
			if s.Queue == q.name {
				specs = append(specs, s)
			}
		}
	}
	rec := queueRecordOf(q.cfg, specs)
	if err := m.dur.declared(q.name, rec.encode()); err != nil {
		m.logHeld(slog.LevelError, "tinymq: the log did not take the declaration of a durable queue; a restart may not list it",
			slog.String("queue", q.name), slog.String("err", err.Error()))
	}
}

// declaredQueues returns, sorted, the durable queues whose declaration the
// log holds: found at open, or recorded since by logDeclared, and not
// deleted. Stats lists those that this process has not registered as
// Unregistered, with the messages the log holds for them (see
// unregistered), or none.
func (d *durableLog) declaredQueues() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.decls))
	for name := range d.decls {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// idsUpTo is, for every exchange that has had IDs, the highest one so far:
// declared now, deleted this run, or known to the log. The caller holds the
// write lock, so no ID is being stamped.
func (m *MQ) idsUpTo() map[string]uint64 {
	up := make(map[string]uint64, len(m.exchanges)+len(m.retiredSeqs)+len(m.dur.seqs))
	for name, n := range m.dur.seqs {
		up[name] = n
	}
	for name, r := range m.retiredSeqs {
		up[name] = max(up[name], r.seq)
	}
	for name, ex := range m.exchanges {
		up[name] = max(up[name], ex.seq.Load())
	}
	return up
}

// takeRecovered returns, and forgets, what the log holds for queue.
func (d *durableLog) takeRecovered(queue string) []recoveredMsg {
	d.mu.Lock()
	defer d.mu.Unlock()
	list := d.recovered[queue]
	delete(d.recovered, queue)
	delete(d.readyAt, queue)
	return list
}

// unregistered reports how many messages the log holds for each durable
// queue that this process has not registered.
// oldestRecovered returns, for each queue of unregistered, when the first of
// its messages was (or will be) ready: its visibility, or the end of its
// retry backoff. (The earliest of them all is the oldest ready one once it
// is past.) It is computed once per queue: the lists do not change.
func (d *durableLog) oldestRecovered(queue string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if at, ok := d.readyAt[queue]; ok {
		return at
	}
	var at int64
	for i := range d.recovered[queue] {
		r := &d.recovered[queue][i]
		ready := r.visibleAt
		if r.state != nil {
			ready = max(ready, r.state.dueAt)
		}
		if at == 0 || ready < at {
			at = ready
		}
	}
	if d.readyAt == nil {
		d.readyAt = make(map[string]int64)
	}
	d.readyAt[queue] = at
	return at
}

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
// MQ's write lock. A DropHead length limit evicts the oldest beyond it (dead-
// lettered by unlock, with reason maxlen); RejectPublish and Block keep them
// all, and refuse or hold publishes until the queue is below its limit.
//
// A message stays on disk until it is delivered: a ready one that was never
// retried is queued as a restored entry (see restored), 72 bytes with the
// queue's entry, and any other as a Msg without its value (lazyMsg); the
// worker that delivers or dead-letters it reads the rest (see queue.load).
func (m *MQ) restore(q *queue) {
	list := m.dur.takeRecovered(q.name)
	if len(list) == 0 {
		return
	}
	now := time.Now().UnixNano()
	var block []restored
	entries := func(yield func(entry, int64) bool) {
		for i := range list {
			r := &list[i]
			ttl := r.expiration
			if q.cfg.ttl > 0 && (ttl == 0 || q.cfg.ttl < ttl) {
				ttl = q.cfg.ttl
			}
			var expires int64
			if ttl > 0 {
				expires = deadline(time.Unix(0, r.visibleAt), ttl)
			}
			due := r.visibleAt
			var e entry
			if r.state != nil {
				due = max(due, r.state.dueAt)
				e = entry{m: lazyMsg(r.key, r.id, q.name, expires, r.state, r.group)}
			} else if due > now {
				e = entry{m: lazyMsg(r.key, r.id, q.name, expires, nil, r.group)}
			} else {
				if len(block) == cap(block) { // blocks, so that what is delivered is freed
					block = make([]restored, 0, min(restoredBlock, len(list)-i))
				}
				block = append(block, restored{key: r.key, expires: expires, group: r.group})
				e = entry{m: restoredMark, id: r.id, data: &block[len(block)-1]}
			}
			if !yield(e, due) {
				return
			}
		}
	}
	evicted, later := q.restore(entries, now)
	m.evicted = append(m.evicted, evicted...)
	for _, it := range later {
		m.sched.add(it)
	}
	m.logHeld(slog.LevelInfo, "tinymq: durable queue recovered from the log", slog.String("queue", q.name), slog.Int("count", len(list)))
}

// restored is what a queue holds of a message that restore queued, until a
// worker takes it: its key in the log, whose value holds the rest, and when
// it expires (UnixNano; 0: never). Its entry is {m: restoredMark, id: the
// message's ID, data: the *restored}; entry.msg makes it a lazyMsg.
type restored struct {
	key     string // the log index's own string
	expires int64
	group   string // WithMessageGroup, or ""
}

// restoredBlock is how many restored share one allocation.
const restoredBlock = 64

// restoredMark is the m of every restored entry. It is never delivered.
var restoredMark = &Msg{}

// lazyMsg is the Msg of a restored message before its value is read from the
// log: its ID, exchange (the key's), queue, attempt and last error (from st,
// if the queue retried it) and expiry, but not its routing key, headers,
// deaths or data, which queue.load reads. One allocation, as publish makes
// a Msg with its ext.
func lazyMsg(key string, id uint64, queue string, expires int64, st *queueState, group string) *Msg {
	exch, _, _ := parseMsgKey(key)
	dm := &struct {
		Msg
		x msgExt
	}{Msg: Msg{ID: id, Exchange: exch, Queue: queue, Redelivered: true}, x: msgExt{expires: expires, dkey: key, unread: true, group: group}}
	dm.Msg.x = &dm.x
	if st != nil {
		dm.Attempt = st.attempt
		if st.lastErr != "" {
			dm.x.lastErr = errors.New(st.lastErr)
		}
	}
	return &dm.Msg
}

// load reads from the log what a lazyMsg lacks, as the Msg a publish made:
// its routing key, headers, deaths and Data (an Encoded). It does nothing to
// any other Msg. It blocks for one read of the disk (a page-cache copy when
// the log was just written), so it runs with no lock held, on the goroutine
// about to deliver or dead-letter m. When the read fails (the log failed or
// was closed by a Shutdown deadline), m stays in the log unacknowledged, to
// be delivered after the next start: load counts it undelivered, logs it and
// returns false, and the caller forgets m.
func (q *queue) load(m *Msg) bool {
	if m.x == nil || !m.x.unread {
		return true
	}
	err := q.mq.dur.read(m)
	if err == nil {
		return true
	}
	q.c.undelivered.Add(1)
	if q.begun.Load()&abortBit != 0 { // the deadline closed the log: as leftOnDisk
		q.logFailure(m, err, slog.LevelWarn, "tinymq: shutdown deadline passed; the message stays in the log for the next start")
		return false
	}
	q.logFailure(m, err, slog.LevelError, "tinymq: reading a durable message from the log failed; it stays in the log for the next start")
	return false
}

// read fills the lazyMsg m from its value in the log.
func (d *durableLog) read(m *Msg) error {
	v, ok, err := d.log.Get([]byte(m.x.dkey))
	if err == nil && !ok {
		err = errors.New("no such key") // a bug: the queue has not acknowledged it
	}
	if err != nil {
		return fmt.Errorf("%w: reading message %d: %w", ErrLog, m.ID, err)
	}
	var s storedMsg
	var dec msgDecoder
	if err := dec.decode(&s, v, false); err != nil {
		return fmt.Errorf("%w: reading message %d: %w", ErrLog, m.ID, err)
	}
	m.RoutingKey, m.Headers, m.Deaths = s.routingKey, s.headers, s.deaths
	m.Data = Encoded{Body: s.body, Codec: d.codec}
	m.x.unread = false
	return nil
}

// closeLog closes the log (again: it is idempotent): when the MQ has
// stopped and every worker has returned, or at a Shutdown deadline, while
// consumers may still run (their acknowledgements are then lost, and their
// messages delivered again after a restart), so that the directory is free
// once Shutdown returns.
func (m *MQ) closeLog() {
	if m.dur == nil {
		return
	}
	if err := m.dur.log.Close(); err != nil {
		m.settleBegin()
		defer m.settling.Add(-1)
		m.logAttrs(slog.LevelError, "tinymq: closing the log", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.String("err", err.Error()))
		})
	}
}

// closeLogQuietly closes the log, and leaves its error, which a later
// closeLog gets again, to be logged there: Shutdown's own goroutine calls no
// user code.
func (m *MQ) closeLogQuietly() {
	if m.dur != nil {
		_ = m.dur.log.Close()
	}
}

// waitLogs waits, once the log is closed, until what the log reported has
// been logged, and reports the lines a slow logger made it drop.
func (m *MQ) waitLogs() {
	if m.dur == nil {
		return
	}
	if n := m.dur.logs.wait(); n > 0 {
		m.settleBegin()
		defer m.settling.Add(-1)
		m.logAttrs(slog.LevelError, "tinymq: the logger was too slow, lines of the write-ahead log were dropped", func(a []slog.Attr) []slog.Attr {
			return append(a, slog.Uint64("count", n))
		})
	}
}

// logMessage writes the message to the log when some of dst are durable, and
// gives those queues their own Msg with the encoded Data; otherwise it only
// records the ID's use. It blocks for the sync, so the caller holds no MQ
// lock.
func (m *MQ) logMessage(ex *exchange, id uint64, now time.Time, dst []*queue, msgs []*Msg, data any, pc *publishConfig, deaths []Death, dl *deadLetter) error {
	if !slices.ContainsFunc(dst, func(q *queue) bool { return q.cfg.durable }) {
		m.reserveIDsIfLogged(ex, id)
		return nil
	}
	d := m.dur // durable queues exist only once the log is open
	body := pc.encoded
	raw, inPlace := jsonBytes(d.codec, data) // encoded straight into the record: no codec, no copy
	switch {
	case body != nil:
		raw, inPlace = nil, false
	case inPlace:
		if err := m.checkEncoded(jsonBytesLen(len(raw))); err != nil {
			return err
		}
	default: // before reserveIDs, which may hold ex.reserveMu until the commit: the codec is user code
		var err error
		if body, err = m.encodeData(d.codec, data); err != nil {
			return err
		}
	}
	sc := getScratch()
	defer putScratch(sc)
	b := &sc.b
	reserved, err := m.reserveIDs(ex, id, b)
	if err != nil {
		return err
	}
	committed := false
	defer func() { reserved(committed) }()
	var kbuf [64]byte
	kb := appendMsgKey(kbuf[:0], ex.name, id)
	key := string(kb)
	var qbuf [4]string
	rec := storedMsg{publishedAt: now.UnixNano(), visibleAt: deadline(now, pc.delay), expiration: pc.ttl,
		routingKey: pc.routingKey, headers: pc.headers, deaths: deaths, body: body, queues: qbuf[:0], group: pc.group}
	for i, q := range dst {
		if q.cfg.durable {
			rec.queues = append(rec.queues, q.name)
			// A durable queue's Msg is its own, made by publish for this
			// publish (durable queues never share their exchange's
			// prototype), so it is filled in place.
			msgs[i].ext().dkey = key
		}
	}
	var inBatch []byte
	inBatch, sc.val = rec.putIn(b, key, sc.val, raw)
	if inBatch != nil {
		body = inBatch
	}
	if inPlace { // body is in b's bytes, which the consumers keep: b is not reused
		defer func() { sc.b = wal.Batch{} }()
	}
	var enc any = Encoded{Body: body, Codec: d.codec} // one allocation, however many durable queues share it
	for i, q := range dst {
		if q.cfg.durable {
			msgs[i].Data = enc
		}
	}
	if pc.dedupID != "" && ex.dedup != nil { // the ID is accepted with the message, or neither is
		putDedup(b, ex.name, pc.dedupID, rec.publishedAt, ex.dedup.window)
	}
	if dl != nil && dl.src != nil { // the move to a durable queue is one record
		d.ack(dl.src.queue, dl.src.key, b)
		dl.src.moved = true
	}
	// Refs count the durable queues still holding a message. A message of
	// one durable queue needs none until it saves a retry state (see
	// saveState): ack takes a missing entry for a last one. That keeps the
	// common publish off d.mu.
	shared := len(rec.queues) > 1
	if shared {
		d.mu.Lock()
		d.refs[key] = &msgRefs{pending: len(rec.queues)}
		d.mu.Unlock()
	}
	if err := d.log.Commit(b); err != nil {
		if shared {
			d.mu.Lock()
			delete(d.refs, key)
			d.mu.Unlock()
		}
		return fmt.Errorf("%w: %w", ErrLog, err)
	}
	committed = true
	pc.dedupLogged = pc.dedupID != "" && ex.dedup != nil
	return nil
}

// scratch is a batch and a buffer for writing a log record: Commit and
// CommitAsync copy the batch, so a publish or an acknowledgement can reuse
// one from scratchPool instead of allocating its own.
type scratch struct {
	b   wal.Batch
	val []byte
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// maxScratch is the largest buffer scratchPool keeps.
const maxScratch = 64 << 10

func getScratch() *scratch {
	sc := scratchPool.Get().(*scratch)
	sc.b.Reset()
	sc.val = sc.val[:0]
	return sc
}

func putScratch(sc *scratch) {
	if cap(sc.val) > maxScratch || sc.b.Size() > 2*maxScratch {
		return // do not keep the memory of one large message
	}
	scratchPool.Put(sc)
}
