package tinymq

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tinymq/tinymq/internal/guard"
	"github.com/tinymq/tinymq/internal/wal"
)

// maxDedupIDs is how many IDs an exchange with WithDeduplication remembers
// at most (accepted ones; publishes of an ID still under way come on top, one
// per publisher): past it the oldest is forgotten before its window ends.
const maxDedupIDs = 1 << 16

// maxDedupIDLen is the longest ID WithDeduplicationID takes, in bytes.
const maxDedupIDLen = 255

// dedupFlush is how many forgotten IDs that the log holds wait before one
// batch deletes their records (a recovery deletes the expired ones anyway).
const dedupFlush = 256

// dedupTable is the memory of an exchange with WithDeduplication: the IDs it
// accepted within the window, oldest first, and those whose first publish is
// under way. Its lock is a leaf: nothing else is taken, and no user code
// runs, while it is held.
type dedupTable struct {
	window time.Duration

	mu    sync.Mutex
	ids   map[string]*dedupEntry
	ring  []*dedupEntry // accepted entries in acceptance order, from head, n of them
	head  int
	n     int
	drops []string // forgotten IDs whose i/ record is in the log, for flush
}

// dedupEntry is one ID: accepted at at (UnixNano), or, while done is open,
// claimed by the publish that is routing it.
type dedupEntry struct {
	id     string
	at     int64
	logged bool          // its i/ record is in the log
	done   chan struct{} // closed once the claiming publish returned
	ok     bool          // it returned nil (set before done is closed)
	owner  uint64        // the claiming publish's goroutine (guard.Goid), once it runs user code; 0 before
}

func newDedupTable(window time.Duration) *dedupTable {
	return &dedupTable{window: window, ids: make(map[string]*dedupEntry)}
}

// claim looks id up at now. It returns dup when id was accepted within the
// window; else, when another publish of id is under way, the channel that
// closes when it returns, and that publish's goroutine (guard.Goid) if it has
// begun running user code (0 otherwise: it cannot be the caller's own
// goroutine, which is here and not in its user code); else a new entry that
// the caller now owns and must settle.
func (t *dedupTable) claim(id string, now time.Time) (e *dedupEntry, wait <-chan struct{}, owner uint64, dup bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now.UnixNano())
	if o := t.ids[id]; o != nil {
		if o.done != nil {
			return nil, o.done, o.owner, false
		}
		return nil, nil, 0, true
	}
	e = &dedupEntry{id: id, done: make(chan struct{})}
	t.ids[id] = e
	return e, nil, 0, false
}

// own records that e's claiming publish, on goroutine g, is about to run
// user code (a filter, a codec, a logger), which may publish e's ID again
// from g: see publishOnce.
func (t *dedupTable) own(e *dedupEntry, g uint64) {
	t.mu.Lock()
	if e.done != nil {
		e.owner = g
	}
	t.mu.Unlock()
}

// dedupClaim is a publish's claim of its deduplication ID, which it carries
// in its records (see records.userCode).
type dedupClaim struct {
	t     *dedupTable
	e     *dedupEntry
	owned bool // own was called
}

// settle records the outcome of e's publish: accepted at now (and recorded
// in the log, when logged) or not, and wakes the publishes of the same ID
// that wait. It returns the IDs of log records to delete, when enough of them
// are due.
func (t *dedupTable) settle(e *dedupEntry, ok, logged bool, now time.Time) (drops []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := e.done
	if ok {
		e.at, e.logged, e.ok, e.done = now.UnixNano(), logged, true, nil
		t.pushLocked(e)
	} else if t.ids[e.id] == e {
		delete(t.ids, e.id)
	}
	close(done)
	if len(t.drops) >= dedupFlush {
		drops, t.drops = t.drops, nil
	}
	return drops
}

// restore remembers id, accepted at at and recorded in the log, when it was
// found in the log at a restart. Entries are restored oldest first.
func (t *dedupTable) restore(id string, at int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ids[id] != nil {
		return
	}
	e := &dedupEntry{id: id, at: at, logged: true, ok: true}
	t.ids[id] = e
	t.pushLocked(e)
}

// pushLocked appends an accepted entry, forgetting the oldest past
// maxDedupIDs. The ring grows by doubling up to that bound and never
// shrinks: its memory is what the busiest window needed.
func (t *dedupTable) pushLocked(e *dedupEntry) {
	if t.n == maxDedupIDs {
		t.forgetLocked()
	}
	if t.n == len(t.ring) {
		grown := make([]*dedupEntry, min(max(2*len(t.ring), 16), maxDedupIDs))
		for i := range t.n {
			grown[i] = t.ring[(t.head+i)%len(t.ring)]
		}
		t.ring, t.head = grown, 0
	}
	t.ring[(t.head+t.n)%len(t.ring)] = e
	t.n++
}

// expireLocked forgets the entries accepted a window or more before now.
func (t *dedupTable) expireLocked(now int64) {
	for t.n > 0 && now-t.ring[t.head].at >= int64(t.window) {
		t.forgetLocked()
	}
}

// forgetLocked forgets the oldest accepted entry.
func (t *dedupTable) forgetLocked() {
	e := t.ring[t.head]
	t.ring[t.head] = nil
	t.head = (t.head + 1) % len(t.ring)
	t.n--
	if t.ids[e.id] == e {
		delete(t.ids, e.id)
	}
	if e.logged {
		t.drops = append(t.drops, e.id)
	}
}

// publishOnce is PublishContext for a publish with WithDeduplicationID: at
// most one publish of an ID is routed within the exchange's window. A
// publish of an ID that another publish is routing waits for that one: when
// it is accepted, this one returns nil as a duplicate; when it failed, this
// one is routed in its turn (a retry must be able to succeed where the first
// attempt failed). A publish of an ID from inside that ID's own publish (a
// filter, a codec or a logger publishing it again) cannot wait for itself:
// it returns ErrInvalidOption at once. Telling that apart needs the
// goroutine's ID (guard.Goid, a microsecond or more), so a publish takes it
// only when it runs user code (records.userCode), and a publish that waits
// only when the one it waits for did.
func (m *MQ) publishOnce(ctx context.Context, exchange string, r *records) error {
	m.mu.RLock()
	ex := m.exchanges[exchange]
	m.mu.RUnlock()
	if ex == nil {
		if exchange == "" {
			return fmt.Errorf("%w: exchange name", ErrEmptyName)
		}
		return fmt.Errorf("%w: %q", ErrUnknownExchange, exchange)
	}
	t := ex.dedup
	if t == nil {
		return fmt.Errorf("%w: WithDeduplicationID to exchange %q, which has no WithDeduplication", ErrInvalidOption, exchange)
	}
	id := r.pc.dedupID
	for {
		e, wait, owner, dup := t.claim(id, time.Now())
		if dup {
			ex.duplicates.Add(1)
			return nil
		}
		if wait != nil {
			if owner != 0 && owner == guard.Goid() {
				return fmt.Errorf("%w: WithDeduplicationID %q from inside its own publish (a filter, a codec or a logger), which it would wait for forever", ErrInvalidOption, id)
			}
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return fmt.Errorf("tinymq: waiting for the publish of deduplication ID %q: %w", id, ctx.Err())
			}
		}
		r.dedup = &dedupClaim{t: t, e: e}
		return m.publishClaimed(ctx, ex, r, e)
	}
}

// publishClaimed routes r, whose ID e claims, and settles the claim. A filter
// or a codec that calls runtime.Goexit ends the publisher's goroutine inside
// publishRecords: the claim is then settled as failed on the way out, so
// that the publishes of the same ID that wait for it go on.
func (m *MQ) publishClaimed(ctx context.Context, ex *exchange, r *records, e *dedupEntry) error {
	t := ex.dedup
	returned := false
	defer func() {
		if !returned {
			t.settle(e, false, false, time.Now())
		}
	}()
	err := m.publishRecords(ctx, ex.name, r)
	returned = true
	if drops := t.settle(e, err == nil, r.pc.dedupLogged, time.Now()); drops != nil {
		m.dropDedupRecords(ex.name, drops)
	}
	return err
}

// userCode is called by a publish before it runs user code that may publish
// again on its goroutine: see publishOnce. It costs nothing for a publish
// without a deduplication ID, and a guard.Goid once for one with.
func (r *records) userCode() {
	if c := r.dedup; c != nil && !c.owned {
		c.owned = true
		c.t.own(c.e, guard.Goid())
	}
}

// dropDedupRecords deletes the i/ records of forgotten IDs, without waiting:
// a record a crash keeps is deleted by the next recovery, once expired.
func (m *MQ) dropDedupRecords(exchange string, ids []string) {
	m.mu.RLock()
	d := m.dur
	m.mu.RUnlock()
	if d == nil {
		return
	}
	var b wal.Batch
	for _, id := range ids {
		b.Delete(dedupKey(exchange, id))
	}
	_ = d.log.CommitAsync(&b) // closed after Stop: the next recovery deletes them
}

// dedupKey is the i/ key of id of exchange.
func dedupKey(exchange, id string) []byte { return queueKey("i/", exchange, id) }

// putDedup adds to b the i/ record of an ID accepted at at, with the window
// in force, which recovery needs to tell when the record has expired.
func putDedup(b *wal.Batch, exchange, id string, at int64, window time.Duration) {
	var buf [1 + 2*binary.MaxVarintLen64]byte
	v := append(buf[:0], recordVersion)
	v = binary.AppendVarint(v, at)
	v = binary.AppendVarint(v, int64(window))
	b.Put(dedupKey(exchange, id), v)
}

// dedupRecord is an i/ record found at a restart.
type dedupRecord struct {
	id string
	at int64
}

// decodeDedup decodes an i/ value.
func decodeDedup(v []byte) (at int64, window time.Duration, err error) {
	r := &reader{b: v}
	if r.byte() != recordVersion {
		return 0, 0, errBadRecord
	}
	at, window = r.varint(), time.Duration(r.varint())
	if r.err != nil || len(r.b) != 0 {
		return 0, 0, errBadRecord
	}
	return at, window, nil
}

// forgetDedup deletes the i/ records of ex, which DeleteExchange deleted:
// the exchange declared next under its name starts with no ID, after a
// restart too. The batch is queued, not waited for (the caller holds the
// MQ's write lock); a crash before it is written leaves records that the
// recovery after it deletes once their window ended.
func (d *durableLog) forgetDedup(ex *exchange) {
	var b wal.Batch
	for _, r := range d.dedups[ex.name] { // recorded before this run, and not declared with dedup since
		b.Delete(dedupKey(ex.name, r.id))
	}
	delete(d.dedups, ex.name)
	if t := ex.dedup; t != nil {
		t.mu.Lock()
		for id, e := range t.ids {
			if e.logged {
				b.Delete(dedupKey(ex.name, id))
			}
		}
		for _, id := range t.drops {
			b.Delete(dedupKey(ex.name, id))
		}
		t.drops = nil
		t.mu.Unlock()
	}
	if b.Len() > 0 {
		_ = d.log.CommitAsync(&b) // a failed log: the next recovery deletes them once expired
	}
}

// restoreDedup gives a newly declared exchange with WithDeduplication the
// IDs the log recorded for it. The caller holds the write lock.
func (d *durableLog) restoreDedup(ex *exchange) {
	recs := d.dedups[ex.name]
	if ex.dedup == nil || len(recs) == 0 {
		return
	}
	slices.SortFunc(recs, func(a, b dedupRecord) int { return cmpInt64(a.at, b.at) })
	for _, r := range recs {
		ex.dedup.restore(r.id, r.at)
	}
	delete(d.dedups, ex.name)
	ex.dedup.mu.Lock()
	ex.dedup.expireLocked(time.Now().UnixNano())
	ex.dedup.mu.Unlock()
}
