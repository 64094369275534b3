package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/tinymq/tinymq"
)

// openDir opens dir read-only and, when another process holds it, says so
// on stderr (the report says it too).
func (c *cli) openDir(dir string) (*tinymq.DataDir, error) {
	d, err := tinymq.OpenDataDir(dir)
	if err != nil {
		return nil, err
	}
	if pid, inUse := d.InUse(); inUse {
		fmt.Fprintf(c.stderr, "tinymq: note: %s is in use by %s: showing a snapshot of what it had written\n", escape(dir), holder(pid))
	}
	return d, nil
}

func holder(pid int) string {
	if pid > 0 {
		return fmt.Sprintf("process %d", pid)
	}
	return "another process"
}

type inspectJSON struct {
	Dir      string        `json:"dir"`
	InUse    bool          `json:"in_use"`
	PID      int           `json:"pid,omitempty"`
	Queues   []queueJSON   `json:"queues"`
	Segments []segmentJSON `json:"segments"`
	Bytes    int64         `json:"bytes"`
	Check    checkJSON     `json:"check"`
}

type queueJSON struct {
	Name             string     `json:"name"`
	Depth            int        `json:"depth"`
	Oldest           *time.Time `json:"oldest"`
	OldestAgeSeconds *float64   `json:"oldest_age_seconds"`
	Declared         bool       `json:"declared"`
	Deleted          bool       `json:"deleted"`
}

type segmentJSON struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Records int    `json:"records"`
}

type checkJSON struct {
	OK        bool     `json:"ok"`
	Records   int      `json:"records"`
	TornBytes int64    `json:"torn_bytes"`
	Damage    []string `json:"damage"`
}

// errDamaged is inspect's failure when the check found damage.
var errDamaged = errors.New("the log is damaged (see check); an MQ refuses it unless WithRepair is given")

func (c *cli) inspect(dir string) error {
	d, err := c.openDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	now := time.Now()
	pid, inUse := d.InUse()
	out := inspectJSON{Dir: dir, InUse: inUse, Queues: []queueJSON{}, Segments: []segmentJSON{}}
	if inUse {
		out.PID = pid
	}
	for _, q := range d.Queues() {
		j := queueJSON{Name: q.Name, Depth: q.Depth, Declared: q.Declared, Deleted: q.Deleted}
		if !q.Oldest.IsZero() {
			t, age := q.Oldest, now.Sub(q.Oldest).Seconds()
			j.Oldest, j.OldestAgeSeconds = &t, &age
		}
		out.Queues = append(out.Queues, j)
	}
	for _, s := range d.Segments() {
		out.Segments = append(out.Segments, segmentJSON(s))
		out.Bytes += s.Size
	}
	ck := d.Check()
	out.Check = checkJSON{OK: len(ck.Damage) == 0, Records: ck.Records, TornBytes: ck.TornBytes, Damage: ck.Damage}
	if out.Check.Damage == nil {
		out.Check.Damage = []string{}
	}
	if c.json {
		if err := json.NewEncoder(c.stdout).Encode(out); err != nil {
			return err
		}
	} else {
		c.printInspect(out, now)
	}
	if !out.Check.OK {
		return errDamaged
	}
	return nil
}

func (c *cli) printInspect(out inspectJSON, now time.Time) {
	w := c.stdout
	fmt.Fprintf(w, "data directory: %s\n", escape(out.Dir))
	if out.InUse {
		fmt.Fprintf(w, "in use:         yes, by %s (read anyway, read-only: a snapshot)\n", holder(out.PID))
	} else {
		fmt.Fprintf(w, "in use:         no\n")
	}
	fmt.Fprintf(w, "\ndurable queues: %d\n", len(out.Queues))
	if len(out.Queues) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDEPTH\tOLDEST\tSTATE")
		for _, q := range out.Queues {
			age := "-"
			if q.Oldest != nil {
				age = now.Sub(*q.Oldest).Round(time.Second).String()
			}
			state := "-"
			switch {
			case q.Deleted:
				state = "deleted"
			case q.Declared:
				state = "declared"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", escape(q.Name), q.Depth, age, state)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nsegments: %d, %s\n", len(out.Segments), size(out.Bytes))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tRECORDS")
	for _, s := range out.Segments {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", escape(s.Name), size(s.Size), s.Records)
	}
	tw.Flush()
	fmt.Fprintln(w)
	ck := out.Check
	if ck.OK {
		fmt.Fprintf(w, "check: ok: %d records, every CRC valid\n", ck.Records)
	} else {
		fmt.Fprintf(w, "check: DAMAGED: %d records valid before the damage\n", ck.Records)
		for _, d := range ck.Damage {
			fmt.Fprintf(w, "  %s\n", escape(d))
		}
	}
	if ck.TornBytes > 0 {
		what := "a crash's leftover, which the next MQ to open the directory cuts"
		if out.InUse {
			what = "most likely the write in progress"
		}
		fmt.Fprintf(w, "       an incomplete last write of %d bytes is left out: %s\n", ck.TornBytes, what)
	}
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// dumpMsg is one line of dump.
type dumpMsg struct {
	ID          uint64          `json:"id"`
	Exchange    string          `json:"exchange"`
	RoutingKey  string          `json:"routing_key"`
	Headers     json.RawMessage `json:"headers"`
	Attempt     int             `json:"attempt"`
	Deaths      []dumpDeath     `json:"deaths"`
	Body        json.RawMessage `json:"body,omitempty"`
	BodyBase64  *string         `json:"body_base64,omitempty"`
	Redelivered bool            `json:"redelivered"`
}

type dumpDeath struct {
	Reason     string    `json:"reason"`
	Exchange   string    `json:"exchange"`
	Queue      string    `json:"queue"`
	RoutingKey string    `json:"routing_key"`
	Attempts   int       `json:"attempts"`
	Count      int       `json:"count"`
	MessageID  uint64    `json:"message_id"`
	LastError  string    `json:"last_error"`
	Time       time.Time `json:"time"`
}

func (c *cli) dump(dir, queue string) error {
	d, err := c.openDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	enc := json.NewEncoder(c.stdout)
	var werr error
	err = d.Messages(queue, func(m *tinymq.Msg) bool {
		out := dumpMsg{ID: m.ID, Exchange: m.Exchange, RoutingKey: m.RoutingKey, Headers: headersJSON(m.Headers),
			Attempt: m.Attempt, Deaths: []dumpDeath{}, Redelivered: m.Redelivered}
		for _, dt := range m.Deaths {
			out.Deaths = append(out.Deaths, dumpDeath{Reason: string(dt.Reason), Exchange: dt.Exchange, Queue: dt.Queue,
				RoutingKey: dt.RoutingKey, Attempts: dt.Attempts, Count: dt.Count, MessageID: dt.MessageID,
				LastError: dt.LastError, Time: dt.Time})
		}
		var body []byte
		if e, ok := m.Data.(tinymq.Encoded); ok {
			body = e.Body
		}
		if len(body) > 0 && json.Valid(body) {
			out.Body = body
		} else {
			s := base64.StdEncoding.EncodeToString(body)
			out.BodyBase64 = &s
		}
		werr = enc.Encode(out)
		return werr == nil
	})
	if err == nil {
		err = werr
	}
	return err
}

// headersJSON is the JSON of a message's headers; a value that encoding/json
// cannot encode (a NaN) is shown as its %v text.
func headersJSON(h map[string]any) json.RawMessage {
	if h == nil {
		return json.RawMessage("{}")
	}
	if b, err := json.Marshal(h); err == nil {
		return b
	}
	out := make(map[string]any, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if _, err := json.Marshal(h[k]); err != nil {
			out[k] = fmt.Sprintf("%v", h[k])
		} else {
			out[k] = h[k]
		}
	}
	b, _ := json.Marshal(out)
	return b
}
