package tinymq

import "slices"

// Message groups ([WithGroupOrdering]).
//
// A queue with group ordering keeps, for each group that has a message out,
// a groupState in q.groups. Out means anywhere between buf and its final
// fate: in buf, in a worker's batch or its consumer, or in the scheduler
// waiting for a retry. Only one message of a group is out at a time; the
// group's later messages wait in the state's backlog, in publish order, and
// count in q.grouped. When the message out ends (it succeeded, was
// dead-lettered, dropped, removed or left in the log), groupDoneLocked moves
// the next of its backlog to the tail of buf, or frees the state when the
// backlog is empty. A retry keeps the group: the retried message is still
// out. Queues without group ordering never touch q.groups (q.cfg.groups is
// false), so their paths cost one predictable branch at most.

// groupState is a group with a message out: the messages of the group that
// wait behind it, oldest first.
type groupState struct {
	waiting fifo
	seq     uint64 // when the group got its state, for Peek's order
}

// group is the WithMessageGroup ID of e's message, or "".
func (e *entry) group() string {
	if e.m.shared {
		return "" // a grouped message is never shared (see groupMsgFor)
	}
	if e.m == restoredMark {
		return e.data.(*restored).group
	}
	return e.m.Group()
}

// holdGroupLocked decides where a grouped entry e that joins the queue goes:
// when its group has a message out, into the group's backlog (it returns
// true: e is counted in q.grouped and the caller must not push it into buf);
// otherwise e becomes the group's message out and the caller places it. An
// entry without a group returns false. q.mu is held and q.cfg.groups is set.
func (q *queue) holdGroupLocked(e entry, at int64) bool {
	g := e.group()
	if g == "" {
		return false
	}
	if st := q.groups[g]; st != nil {
		st.waiting.push(e, at)
		q.grouped++
		return true
	}
	if q.groups == nil {
		q.groups = make(map[string]*groupState)
	}
	q.groupSeq++
	q.groups[g] = &groupState{seq: q.groupSeq}
	return false
}

// groupDoneLocked ends the message out of group g: the next message of the
// group's backlog joins the tail of buf (waking a parked worker for it), or
// the group's state is freed. q.mu is held.
func (q *queue) groupDoneLocked(g string) {
	st := q.groups[g]
	if st == nil {
		return // a purge, a delete or an abort freed it
	}
	if st.waiting.n == 0 {
		delete(q.groups, g)
		return
	}
	e, at := st.waiting.popOne()
	q.grouped--
	q.buf.push(e, at)
	if q.wakeOneLocked() {
		q.cond.Signal()
	}
}

// groupEnd is groupDoneLocked for m, a message a worker handled: it reached
// its final fate in this queue. It does nothing for a message without a
// group, or in a queue without group ordering.
func (q *queue) groupEnd(m *Msg) {
	if !q.cfg.groups {
		return
	}
	g := m.Group()
	if g == "" {
		return
	}
	q.lock()
	q.groupDoneLocked(g)
	q.mu.Unlock()
}

// dropBacklogsLocked takes every message out of the groups' backlogs,
// counting each as begun, and calls fn with each (nil: none), for a purge, a
// delete, a strand or an abort. The groups' states stay: their messages out
// end as any message does. q.mu is held.
func (q *queue) dropBacklogsLocked(fn func(*entry)) {
	if q.grouped == 0 {
		return
	}
	for _, st := range q.groups {
		if fn != nil {
			st.waiting.each(func(e *entry) bool {
				fn(e)
				return true
			})
		}
		st.waiting.clear()
	}
	q.begun.Add(uint64(q.grouped))
	q.grouped = 0
}

// backlogLocked appends to out the messages of the groups' backlogs, up to
// n in all, group by group in the order the groups got their state (an
// approximation of the order a consumer would get them). q.mu is held.
func (q *queue) backlogLocked(out []entry, n int) []entry {
	if q.grouped == 0 || len(out) >= n {
		return out
	}
	sts := make([]*groupState, 0, len(q.groups))
	for _, st := range q.groups {
		if st.waiting.n > 0 {
			sts = append(sts, st)
		}
	}
	slices.SortFunc(sts, func(a, b *groupState) int {
		if a.seq < b.seq {
			return -1
		}
		return 1
	})
	for _, st := range sts {
		st.waiting.each(func(e *entry) bool {
			if len(out) == n {
				return false
			}
			out = append(out, *e)
			return true
		})
	}
	return out
}

// evictBacklogLocked takes, for DropHead, the oldest message of the groups'
// backlogs: the first waiting of the group that got its state first (the
// groups' order is an approximation of publish order across groups). It is
// counted as begun, as popLocked counts what it takes. It reports false when
// no message waits behind its group. q.mu is held.
func (q *queue) evictBacklogLocked() (entry, bool) {
	if q.grouped == 0 {
		return entry{}, false
	}
	var oldest *groupState
	for _, st := range q.groups {
		if st.waiting.n > 0 && (oldest == nil || st.seq < oldest.seq) {
			oldest = st
		}
	}
	e, _ := oldest.waiting.popOne()
	q.grouped--
	q.begun.Add(1)
	return e, true
}
