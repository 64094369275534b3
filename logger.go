package tinymq

import (
	"context"
	"log/slog"
	"sync"
)

// defaultLogger is the logger of an MQ without [WithLogger]: warnings and
// errors go to [slog.Default] (so that a newcomer sees a message that was
// dropped or left undelivered), anything below is dropped.
var defaultLogger = slog.New(warnHandler{})

// warnHandler passes warnings and errors to h, or, when h is nil, to the
// handler of slog.Default at the time of each line (so that a later
// slog.SetDefault is followed), and drops the rest.
type warnHandler struct{ h slog.Handler }

func (w warnHandler) handler() slog.Handler {
	if w.h != nil {
		return w.h
	}
	return slog.Default().Handler()
}

func (w warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.handler().Enabled(ctx, l)
}

func (w warnHandler) Handle(ctx context.Context, r slog.Record) error {
	return w.handler().Handle(ctx, r)
}

func (w warnHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnHandler{w.handler().WithAttrs(attrs)}
}

func (w warnHandler) WithGroup(name string) slog.Handler {
	return warnHandler{w.handler().WithGroup(name)}
}

// quiet reports whether the MQ's logger drops every line at level without
// running user code: it discards, or it is the default and level is below a
// warning.
func (m *MQ) quiet(level slog.Level) bool {
	if m.log == defaultLogger {
		return level < slog.LevelWarn
	}
	return m.log.Handler() == slog.DiscardHandler
}

// logAttrs logs msg at level with the attributes attrs adds to the slice it
// is given; attrs is not called when the level is disabled. The logger is
// user code, so it runs through own.Guard: a panic in it is recovered and
// forgotten, a runtime.Goexit ends only the guard's goroutine, never a
// worker, the scheduler or the drain in the middle of their bookkeeping, and
// a logger that calls Stop does not wait for itself. The caller holds no MQ
// lock (under the write lock, use logHeld). Logging happens only on
// failures, so the goroutine (about a microsecond) is off the delivery path;
// a logger that discards costs nothing, nor does the default for a level it
// drops.
func (m *MQ) logAttrs(level slog.Level, msg string, attrs func([]slog.Attr) []slog.Attr) {
	if m.quiet(level) {
		return
	}
	m.own.Guard(func() {
		ctx := context.Background()
		if !m.log.Enabled(ctx, level) {
			return
		}
		m.log.LogAttrs(ctx, level, msg, attrs(make([]slog.Attr, 0, 8))...)
	})
}

// heldLog is a line to log once the write lock is released: loggers are
// user code, which never runs under an MQ lock (it may call back into the
// MQ).
type heldLog struct {
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// logHeld has unlock log msg with attrs. The caller holds the write lock.
func (m *MQ) logHeld(level slog.Level, msg string, attrs ...slog.Attr) {
	if m.quiet(level) {
		return
	}
	m.held = append(m.held, heldLog{level: level, msg: msg, attrs: attrs})
}

// unlock increases the topology's version (see TopologyVersion), releases
// the write lock, then logs what logHeld held and dead-letters what restore
// evicted (a dead letter is a publish: it needs the read lock).
func (m *MQ) unlock() {
	held, evicted := m.held, m.evicted
	m.held, m.evicted = nil, nil
	m.topologyClock().Add(1)
	m.mu.Unlock()
	for _, l := range held {
		m.logAttrs(l.level, l.msg, func(a []slog.Attr) []slog.Attr { return append(a, l.attrs...) })
	}
	settleEvicted(evicted)
}

// maxWalLogs bounds the log lines of the write-ahead log that wait for a
// slow logger at once; past it, lines are dropped (and counted).
const maxWalLogs = 16

// walLogger is the log's Options.Log for one open log. The log never calls
// user code itself: while wal.Open runs (under the MQ's write lock) its lines
// are held, for unlock to log; afterwards each line is logged on a goroutine
// of its own through guard, which the log's writer does not wait for, so
// that a logger that panics, blocks or calls back into the MQ never stops
// the writer. Those goroutines are the MQ's: drain and finishNew join them
// (see waitLogs).
type walLogger struct {
	m *MQ

	mu      sync.Mutex
	opening bool      // wal.Open has not returned: hold the lines
	held    []heldLog // the lines logged while opening
	pending int       // lines being logged now
	dropped uint64    // lines dropped because maxWalLogs were pending
	idle    *sync.Cond
}

func newWalLogger(m *MQ) *walLogger {
	w := &walLogger{m: m, opening: true}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// log is called by the log's goroutines and by wal.Open; it never blocks on
// the logger.
func (w *walLogger) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if w.m.quiet(level) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.opening {
		w.held = append(w.held, heldLog{level: level, msg: msg, attrs: attrs})
		return
	}
	if w.pending >= maxWalLogs {
		w.dropped++
		return
	}
	w.pending++
	w.m.settleBegin() // the MQ's goroutine in user code: see MQ.settling
	go func() {
		w.m.logAttrs(level, msg, func(a []slog.Attr) []slog.Attr { return append(a, attrs...) })
		w.m.settling.Add(-1)
		w.mu.Lock()
		w.pending--
		if w.pending == 0 {
			w.idle.Broadcast()
		}
		w.mu.Unlock()
	}()
}

// opened ends the holding: the held lines go to m.held, which unlock logs.
// The caller holds the MQ's write lock.
func (w *walLogger) opened() {
	w.mu.Lock()
	w.opening = false
	held := w.held
	w.held = nil
	w.mu.Unlock()
	w.m.held = append(w.m.held, held...)
}

// wait returns once no line is being logged, and how many were dropped.
func (w *walLogger) wait() (dropped uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.pending > 0 {
		w.idle.Wait()
	}
	return w.dropped
}
