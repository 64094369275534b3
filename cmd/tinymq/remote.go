package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// maxResponse bounds what the command reads of one answer of the admin page
// (its own budgets keep a page of queues under a few MiB).
const maxResponse = 32 << 20

// remote is a client of one admin page.
type remote struct {
	base   *url.URL // the page, ending in "/"
	client *http.Client
}

func (c *cli) remote() (*remote, error) {
	if c.url == "" {
		return nil, fmt.Errorf("%w: this command needs -url, the admin page of a running MQ", errUsage)
	}
	u, err := url.Parse(c.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: -url %q: want an http:// or https:// URL", errUsage, c.url)
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	u.RawQuery, u.Fragment = "", ""
	return &remote{base: u, client: &http.Client{
		Timeout: c.timeout,
		// A redirect is not followed: a POST turned into a GET would not be
		// the action, and the token is for this page only.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// do sends a request for the path (relative to the page) and returns the
// status and the body.
func (r *remote) do(method, path string, q url.Values, token string) (int, []byte, error) {
	u := r.base.ResolveReference(&url.URL{Path: path, RawQuery: q.Encode()})
	req, err := http.NewRequest(method, u.String(), nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("X-TinyMQ-Token", token)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	if len(body) > maxResponse {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: answer larger than %d bytes", method, u.Redacted(), maxResponse)
	}
	return resp.StatusCode, body, nil
}

var tokenRe = regexp.MustCompile(`<meta name="tinymq-token" content="([^"]*)">`)

// token fetches the page and returns the CSRF token of its actions.
func (r *remote) token() (string, error) {
	status, body, err := r.do(http.MethodGet, "", nil, "")
	if err != nil {
		return "", err
	}
	if status != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d %s%s", r.base.Redacted(), status, http.StatusText(status), errorText(body))
	}
	m := tokenRe.FindSubmatch(body)
	if m == nil {
		return "", fmt.Errorf("%s has no actions token: is it a TinyMQ admin page with admin.WithActions()?", r.base.Redacted())
	}
	return html.UnescapeString(string(m[1])), nil
}

// errorText is ": " and the error field of a JSON answer, or "".
func errorText(body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return ": " + e.Error
	}
	return ""
}

// overviewQueue is what the queues command reads of a queue of
// api/overview.
type overviewQueue struct {
	Name      string `json:"name"`
	Depth     int    `json:"depth"`
	Ready     int    `json:"ready"`
	Scheduled int    `json:"scheduled"`
	InFlight  int    `json:"in_flight"`
	Consumers int    `json:"consumers"`
	Paused    bool   `json:"paused"`
	Durable   bool   `json:"durable"`
	Rates     *struct {
		Published float64 `json:"published_per_sec"`
		Delivered float64 `json:"delivered_per_sec"`
	} `json:"rates"`
}

func (c *cli) queues() error {
	r, err := c.remote()
	if err != nil {
		return err
	}
	var all []json.RawMessage
	for offset, pages := 0, 0; ; pages++ {
		if pages > 10_000 {
			return errors.New("api/overview: too many pages")
		}
		q := url.Values{"limit": {"1000"}, "offset": {strconv.Itoa(offset)}, "exchange_limit": {"1"}}
		status, body, err := r.do(http.MethodGet, "api/overview", q, "")
		if err != nil {
			return err
		}
		if status != http.StatusOK {
			return fmt.Errorf("api/overview: %d %s%s", status, http.StatusText(status), errorText(body))
		}
		var ov struct {
			Queues    []json.RawMessage `json:"queues"`
			QueuePage struct {
				NextOffset *int `json:"next_offset"`
			} `json:"queue_page"`
		}
		if err := json.Unmarshal(body, &ov); err != nil {
			return fmt.Errorf("api/overview: %w", err)
		}
		all = append(all, ov.Queues...)
		if ov.QueuePage.NextOffset == nil || *ov.QueuePage.NextOffset <= offset {
			break
		}
		offset = *ov.QueuePage.NextOffset
	}
	if c.json {
		if all == nil {
			all = []json.RawMessage{}
		}
		return json.NewEncoder(c.stdout).Encode(all)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDEPTH\tREADY\tIN FLIGHT\tCONSUMERS\tPAUSED\tPUBLISHED/S\tDELIVERED/S")
	for _, raw := range all {
		var q overviewQueue
		if err := json.Unmarshal(raw, &q); err != nil {
			return fmt.Errorf("api/overview: %w", err)
		}
		pub, del := "-", "-"
		if q.Rates != nil {
			pub, del = rate(q.Rates.Published), rate(q.Rates.Delivered)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", escape(q.Name), q.Depth, q.Ready, q.InFlight, q.Consumers, yesNo(q.Paused), pub, del)
	}
	return tw.Flush()
}

func rate(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// actionResult is the answer of an action (admin/README.md).
type actionResult struct {
	Action    string     `json:"action"`
	Queue     string     `json:"queue"`
	Count     int        `json:"count"`
	Paused    *bool      `json:"paused"`
	Error     string     `json:"error"`
	Payloads  *bool      `json:"payloads"`
	Messages  []peekView `json:"messages"`
	Truncated bool       `json:"truncated"`
}

type peekView struct {
	ID              uint64            `json:"id"`
	Exchange        string            `json:"exchange"`
	RoutingKey      string            `json:"routing_key"`
	Headers         map[string]string `json:"headers"`
	Attempt         int               `json:"attempt"`
	Redelivered     bool              `json:"redelivered"`
	Size            *int              `json:"size"`
	Type            string            `json:"type"`
	DeathCount      int               `json:"death_count"`
	Payload         *string           `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
	PayloadTrunc    bool              `json:"payload_truncated"`
	PayloadError    string            `json:"payload_error"`
}

// action runs one of the admin page's actions on queue.
func (c *cli) action(name, queue string) error {
	q := url.Values{"queue": {queue}}
	switch name {
	case "replay":
		if !c.nSet {
			return fmt.Errorf("%w: replay needs -n N, how many dead letters to move back", errUsage)
		}
		q.Set("n", strconv.Itoa(c.n))
	case "peek":
		if c.nSet {
			q.Set("n", strconv.Itoa(c.n))
		}
	case "delete":
		if c.ifUnused {
			q.Set("if_unused", "1")
		}
		if c.ifEmpty {
			q.Set("if_empty", "1")
		}
	}
	if c.nSet && name != "replay" && name != "peek" {
		return fmt.Errorf("%w: -n is for peek and replay", errUsage)
	}
	if (c.ifUnused || c.ifEmpty) && name != "delete" {
		return fmt.Errorf("%w: -if-unused and -if-empty are for delete", errUsage)
	}
	r, err := c.remote()
	if err != nil {
		return err
	}
	token, err := r.token()
	if err != nil {
		return err
	}
	status, body, err := r.do(http.MethodPost, "api/"+name, q, token)
	if err != nil {
		return err
	}
	var res actionResult
	jerr := json.Unmarshal(body, &res)
	if status != http.StatusOK {
		if c.json && jerr == nil {
			c.stdout.Write(append(bytes.TrimSpace(body), '\n'))
		}
		msg := res.Error
		if jerr != nil || msg == "" {
			msg = http.StatusText(status)
		}
		if status == http.StatusNotFound && jerr != nil {
			msg += " (is admin.WithActions() on?)"
		}
		return fmt.Errorf("%s %q: %d: %s", name, queue, status, msg)
	}
	if jerr != nil {
		return fmt.Errorf("%s %q: %w", name, queue, jerr)
	}
	if c.json {
		_, err := c.stdout.Write(append(bytes.TrimSpace(body), '\n'))
		return err
	}
	w := c.stdout
	qn := escape(res.Queue)
	switch name {
	case "purge":
		fmt.Fprintf(w, "purged %s: %d messages removed\n", qn, res.Count)
	case "delete":
		fmt.Fprintf(w, "deleted %s: %d waiting messages removed\n", qn, res.Count)
	case "replay":
		fmt.Fprintf(w, "replayed %d dead letters of %s\n", res.Count, qn)
	case "pause", "resume":
		state := "running"
		if res.Paused != nil && *res.Paused {
			state = "paused"
		}
		fmt.Fprintf(w, "%s: %s\n", qn, state)
	case "peek":
		return c.printPeek(res)
	}
	return nil
}

func (c *cli) printPeek(res actionResult) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	payloads := res.Payloads != nil && *res.Payloads
	head := "ID\tEXCHANGE\tROUTING KEY\tATTEMPT\tREDELIVERED\tSIZE\tTYPE\tDEATHS\tHEADERS"
	if payloads {
		head += "\tPAYLOAD"
	}
	fmt.Fprintln(tw, head)
	for _, m := range res.Messages {
		size := "-"
		if m.Size != nil {
			size = strconv.Itoa(*m.Size)
		}
		var hs []string
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			hs = append(hs, k+"="+m.Headers[k])
		}
		line := fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s", m.ID, escape(m.Exchange), escape(m.RoutingKey),
			m.Attempt, yesNo(m.Redelivered), size, escape(m.Type), m.DeathCount, escape(strings.Join(hs, " ")))
		if payloads {
			p := "-"
			switch {
			case m.PayloadError != "":
				p = "(" + m.PayloadError + ")"
			case m.Payload != nil:
				p = *m.Payload
				if m.PayloadEncoding == "base64" {
					p = "base64:" + p
				}
				if m.PayloadTrunc {
					p += "…"
				}
			}
			line += "\t" + escape(p)
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%d messages of %s", res.Count, escape(res.Queue))
	if res.Truncated {
		fmt.Fprint(c.stdout, " (truncated: not all fit in one answer)")
	}
	if !payloads {
		fmt.Fprint(c.stdout, " (payloads hidden: the page was not given admin.WithPayloads())")
	}
	fmt.Fprintln(c.stdout)
	return nil
}
