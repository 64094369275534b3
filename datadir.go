package tinymq

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/tinymq/tinymq/internal/wal"
)

// DataDir is a read-only view of a data directory ([WithDataDir]) taken
// without an MQ: the durable queues its write-ahead log knows, their
// messages, the log's segment files and the result of a check of every
// record. It never writes to the directory, never repairs it and never takes
// its lock. Open one with [OpenDataDir]; its methods are safe for concurrent
// use, and all but Messages work from what OpenDataDir read.
type DataDir struct {
	dir    string
	log    *wal.Log
	pid    int
	inUse  bool
	queues []DataDirQueue
	msgs   map[string][]dataDirMsg // queue -> its pending messages, in delivery order
	states map[string]map[string]queueState
}

// dataDirMsg is a message pending for a queue, as recovery orders it.
type dataDirMsg struct {
	key         string
	id          uint64
	publishedAt int64
}

// DataDirQueue is a durable queue that the log of a [DataDir] knows.
type DataDirQueue struct {
	// Name is the queue's name.
	Name string
	// Depth is how many messages the log holds for the queue that it has
	// not acknowledged: what an MQ would restore into it (less those that
	// expire first).
	Depth int
	// Oldest is when the oldest of them was published; zero when Depth is 0.
	Oldest time.Time
	// Declared says that the log has the queue's declaration (DeclareQueue).
	Declared bool
	// Deleted says that the queue was deleted (DeleteQueue) and not declared
	// again: the log keeps its tombstone until the next MQ opens it.
	Deleted bool
}

// DataDirSegment is a segment file of a [DataDir]'s log.
type DataDirSegment struct {
	Name    string // file name in the directory
	Size    int64  // bytes of valid records, header included
	Records int    // records (batches) in it
}

// DataDirCheck is what [DataDir.Check] reports: OpenDataDir verified the
// checksum of every record of every segment up to the first damage.
type DataDirCheck struct {
	// Records is how many records were read and found intact.
	Records int
	// TornBytes is the size of an incomplete last write: a crash's leftover,
	// which the next MQ to open the directory cuts, or, in a directory in
	// use, the write in progress. It is not part of the view, and not damage.
	TornBytes int64
	// Damage lists each damaged stretch ("FILE at offset N (M bytes): reason")
	// and what was left out after it; empty when the log is intact. An MQ
	// refuses to open such a directory unless WithRepair is given.
	Damage []string
}

// OpenDataDir reads the data directory dir without an MQ and without
// changing it. It blocks while it reads every segment of the log once,
// checking every record, and decodes what each durable queue holds (about a
// microsecond per message; message bodies stay on disk until Messages reads
// them).
//
// A directory that another process (an MQ) holds is read anyway, on
// systems with flock (all but Windows): the log is append-only and its
// segments are opened read-only, so reading cannot disturb the holder, and
// the view is a snapshot of what the holder had written when OpenDataDir
// read it; [DataDir.InUse] says so and names the holder's process. Where the
// lock cannot be probed (Windows), OpenDataDir refuses, with an error
// wrapping [ErrLocked]: there an open file would stop the holder from
// removing a segment.
//
// A damaged log is not refused: the view is its longest valid prefix, and
// [DataDir.Check] lists the damage. OpenDataDir fails (wrapping [ErrLog])
// when dir holds no log or none of it can be read.
func OpenDataDir(dir string) (*DataDir, error) {
	pid, held, err := wal.LockHolder(dir)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, fmt.Errorf("%w: %s: cannot tell whether another process holds it on this system, so it is not read: %w", ErrLocked, dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLog, dir, err)
	}
	l, err := wal.OpenReadOnly(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrLog, dir, err)
	}
	d := &DataDir{dir: dir, log: l, pid: pid, inUse: held}
	if err := d.read(); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("%w: reading %s: %w", ErrLog, dir, err)
	}
	return d, nil
}

// read builds the queues and their message lists as durableLog.recover
// does, without writing anything: a message is pending for each queue it
// was routed to that has no a/ key for it and whose tombstone does not
// cover it.
func (d *DataDir) read() error {
	type logged struct {
		key         string
		publishedAt int64
		queues      []string
	}
	var (
		msgs   []logged
		acked  = make(map[string][]string) // message key -> queues
		tombs  = make(map[string]map[string]uint64)
		decls  = make(map[string]bool)
		dec    msgDecoder
		bad    error
		states = make(map[string]map[string]queueState)
	)
	err := d.log.Scan(func(k string, v []byte) bool {
		switch k[:min(len(k), 2)] {
		case "m/":
			var s storedMsg
			if err := dec.decode(&s, v, true); err != nil {
				bad = fmt.Errorf("message %q: %w", k, err)
				return false
			}
			msgs = append(msgs, logged{key: k, publishedAt: s.publishedAt, queues: s.queues})
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
		case "d/":
			up, err := decodeTombstone(v)
			if err != nil {
				bad = err
				return false
			}
			tombs[k[2:]] = up
		case "q/":
			if _, err := decodeQueueRecord(k[2:], v); err != nil {
				bad = err
				return false
			}
			decls[k[2:]] = true
		}
		return true
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return err
	}
	d.msgs = make(map[string][]dataDirMsg)
	for _, e := range msgs {
		ex, id, ok := parseMsgKey(e.key)
		if !ok {
			return errBadRecord
		}
		for _, q := range e.queues {
			if slices.Contains(acked[e.key], q) {
				continue
			}
			if up, ok := tombs[q][ex]; ok && id <= up {
				continue
			}
			d.msgs[q] = append(d.msgs[q], dataDirMsg{key: e.key, id: id, publishedAt: e.publishedAt})
		}
	}
	names := make(map[string]bool)
	for q := range d.msgs {
		names[q] = true
	}
	for q := range tombs {
		names[q] = true
	}
	for q := range decls {
		names[q] = true
	}
	for q := range names {
		list := d.msgs[q]
		slices.SortFunc(list, func(a, b dataDirMsg) int {
			return cmp.Or(cmp.Compare(a.publishedAt, b.publishedAt), cmp.Compare(a.id, b.id))
		})
		dq := DataDirQueue{Name: q, Depth: len(list), Declared: decls[q], Deleted: tombs[q] != nil && !decls[q]}
		if len(list) > 0 {
			dq.Oldest = time.Unix(0, list[0].publishedAt)
		}
		d.queues = append(d.queues, dq)
	}
	slices.SortFunc(d.queues, func(a, b DataDirQueue) int { return cmp.Compare(a.Name, b.Name) })
	d.states = states
	return nil
}

// Dir returns the directory's path, as given to OpenDataDir.
func (d *DataDir) Dir() string { return d.dir }

// InUse reports whether another process held the directory when
// OpenDataDir read it, and the process id that its LOCK file names (0 when
// it names none; a directory not in use may name its last holder).
func (d *DataDir) InUse() (pid int, inUse bool) { return d.pid, d.inUse }

// Queues returns the durable queues the log knows, by name: those with
// pending messages, those declared, and those deleted whose tombstone is
// still in the log. The slice is the caller's.
func (d *DataDir) Queues() []DataDirQueue { return slices.Clone(d.queues) }

// Segments returns the log's segment files, oldest first.
func (d *DataDir) Segments() []DataDirSegment {
	segs := d.log.Segments()
	out := make([]DataDirSegment, len(segs))
	for i, s := range segs {
		out[i] = DataDirSegment{Name: s.Name, Size: s.Size, Records: int(s.Records)}
	}
	return out
}

// Check returns the result of the check of every record that OpenDataDir
// made. It does not read the disk again.
func (d *DataDir) Check() DataDirCheck {
	rec := d.log.Recovery()
	c := DataDirCheck{Records: rec.Records}
	for _, cut := range rec.Cuts {
		if cut.Torn {
			c.TornBytes += cut.Bytes
			continue
		}
		c.Damage = append(c.Damage, fmt.Sprintf("%s at offset %d (%d bytes): %s", filepath.Base(cut.File), cut.Offset, cut.Bytes, cut.Reason))
	}
	return c
}

// Messages calls fn with each message pending for queue, in the order an MQ
// would deliver them after a restart (by publish time, then ID), until fn
// returns false. Each Msg has its ID, Exchange, Queue, RoutingKey, Headers,
// Deaths, the Attempt that the queue last saved for it (0 when it was
// never retried), Redelivered set, and Data an [Encoded] whose Codec is
// nil (JSONCodec's decoding; a directory written with another codec needs
// that codec to decode Body). fn may keep the Msg.
//
// Messages blocks for one read of the disk per message. It returns an error
// wrapping [ErrUnknownQueue] for a queue the log does not know, and one
// wrapping [ErrLog] when a message cannot be read or decoded; after Close,
// one wrapping ErrLog too.
func (d *DataDir) Messages(queue string, fn func(*Msg) bool) error {
	if !slices.ContainsFunc(d.queues, func(q DataDirQueue) bool { return q.Name == queue }) {
		return fmt.Errorf("%w: %q in %s", ErrUnknownQueue, queue, d.dir)
	}
	var dec msgDecoder
	for _, e := range d.msgs[queue] {
		v, ok, err := d.log.Get([]byte(e.key))
		if err == nil && !ok {
			err = errors.New("no such key")
		}
		if err != nil {
			return fmt.Errorf("%w: reading message %d: %w", ErrLog, e.id, err)
		}
		var s storedMsg
		if err := dec.decode(&s, v, false); err != nil {
			return fmt.Errorf("%w: reading message %d: %w", ErrLog, e.id, err)
		}
		ex, _, _ := parseMsgKey(e.key)
		m := &Msg{ID: e.id, Exchange: ex, Queue: queue, RoutingKey: s.routingKey, Headers: s.headers,
			Deaths: s.deaths, Data: Encoded{Body: s.body}, Redelivered: true}
		if st, ok := d.states[e.key][queue]; ok {
			m.Attempt = st.attempt
		}
		if !fn(m) {
			return nil
		}
	}
	return nil
}

// Close releases the files of the log. It is idempotent; after it, only
// Messages fails (the rest was read by OpenDataDir).
func (d *DataDir) Close() error { return d.log.Close() }
