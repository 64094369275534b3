package admin

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/internal/guard"
)

// The actions: each is a POST to api/<action>?queue=NAME (and n= for replay
// and peek), answered with an actionResult. The order of the checks is the
// security model: Host (ServeHTTP, every request), method, origin, token,
// arguments, the application's AuthorizeFunc, and only then the MQ.

// tokenHeader carries the handler's CSRF token on every action.
const tokenHeader = "X-TinyMQ-Token"

// Bounds on the n of replay and peek, and on what one peek returns.
const (
	defaultPeek     = 10
	maxPeek         = 100
	maxReplay       = 10_000
	maxPayloadBytes = 4096    // of one message's payload, shown
	maxPeekBytes    = 1 << 20 // of one peek's messages
	maxDeathsShown  = 16
)

type action struct {
	name string
	run  func(h *handler, r *http.Request, q string, n int) (int, actionResult, error)
	// needsN: the action takes n; defN is its default when n is absent (0:
	// n is required) and maxN its largest value.
	needsN     bool
	defN, maxN int
}

var actionRoutes = map[string]action{
	"/api/purge":  {name: "purge", run: (*handler).purge},
	"/api/delete": {name: "delete", run: (*handler).deleteQueue},
	"/api/pause":  {name: "pause", run: (*handler).pause},
	"/api/resume": {name: "resume", run: (*handler).resume},
	"/api/replay": {name: "replay", run: (*handler).replay, needsN: true, maxN: maxReplay},
	"/api/peek":   {name: "peek", run: (*handler).peek, needsN: true, defN: defaultPeek, maxN: maxPeek},
}

// actionResult is the JSON of an action's answer; the README documents it.
type actionResult struct {
	Action string `json:"action"`
	Queue  string `json:"queue"`
	// Count is how many messages the action removed (purge, delete), moved
	// (replay) or shows (peek); 0 for pause and resume.
	Count    int        `json:"count"`
	Paused   *bool      `json:"paused,omitempty"`
	Error    string     `json:"error,omitempty"`
	Payloads *bool      `json:"payloads,omitempty"`
	Messages *[]msgView `json:"messages,omitempty"` // peek only: [] when nothing waits
	// Truncated says that a peek's messages did not all fit.
	Truncated bool `json:"truncated,omitempty"`
}

// serveAction checks an action's request and runs it.
func (h *handler) serveAction(w http.ResponseWriter, r *http.Request, act action) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed: actions are POSTs")
		return
	}
	// A cross-site form or fetch: refused by what the browser says of the
	// request's origin, before the token is even looked at.
	if err := h.origin.Check(r); err != nil {
		writeError(w, http.StatusForbidden, "forbidden: cross-origin request")
		return
	}
	if sfs := r.Header.Get("Sec-Fetch-Site"); sfs != "" && sfs != "same-origin" {
		writeError(w, http.StatusForbidden, "forbidden: not a same-origin request (Sec-Fetch-Site: "+clip(sfs)+")")
		return
	}
	got := r.Header.Get(tokenHeader)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(h.token)) != 1 {
		writeError(w, http.StatusForbidden, "forbidden: missing or wrong "+tokenHeader+" header (the page's token)")
		return
	}
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad query: "+err.Error())
		return
	}
	queue := query.Get("queue")
	if queue == "" {
		writeError(w, http.StatusBadRequest, "bad request: the queue parameter is required")
		return
	}
	n := 0
	if act.needsN {
		if n, err = intParam(query, "n", act.defN, 1, act.maxN); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	if msg, refused, panicked := h.authorized(r, act.name, queue); panicked {
		writeError(w, http.StatusInternalServerError, "the authorization hook panicked")
		return
	} else if refused {
		writeError(w, http.StatusForbidden, msg)
		return
	}

	res := actionResult{Action: act.name, Queue: clip(queue)}
	var (
		count int
		aerr  error
	)
	func() {
		// An engine is user code: a panic in it fails this request only.
		defer func() {
			if recover() != nil {
				aerr = errActionPanicked
			}
		}()
		count, res, aerr = act.run(h, r, queue, n)
		res.Action, res.Queue = act.name, clip(queue)
	}()
	res.Count = count
	code := http.StatusOK
	if aerr != nil {
		code = statusOf(aerr)
		res.Error = clipN(errText(aerr), maxErrorBytes)
	}
	writeJSON(w, code, res)
}

// errActionPanicked is an action's error when the MQ (its engine) panicked.
var errActionPanicked = errors.New("admin: the MQ panicked during the action")

// authorized runs the application's AuthorizeFunc, if any, and says whether
// it refused (with its message) or panicked.
func (h *handler) authorized(r *http.Request, action, queue string) (msg string, refused, panicked bool) {
	if h.cfg.authorize == nil {
		return "", false, false
	}
	defer func() {
		if recover() != nil {
			msg, refused, panicked = "", true, true
		}
	}()
	err := h.cfg.authorize(r, action, queue)
	if err == nil {
		return "", false, false
	}
	return errText(err), true, false
}

// errText is err's text; err is user code (a typed nil, a panicking
// Error), so guard.ErrorText calls it under a recover.
func errText(err error) string {
	return guard.ErrorText(err)
}

// statusOf maps an MQ error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errActionPanicked):
		return http.StatusInternalServerError
	case errors.Is(err, tinymq.ErrUnknownQueue):
		return http.StatusNotFound
	case errors.Is(err, tinymq.ErrStopped):
		return http.StatusServiceUnavailable
	case errors.Is(err, tinymq.ErrUnsupported):
		return http.StatusNotImplemented
	case errors.Is(err, tinymq.ErrInvalidOption):
		return http.StatusBadRequest
	case errors.Is(err, tinymq.ErrLog):
		return http.StatusInternalServerError
	case errors.Is(err, tinymq.ErrInUse), errors.Is(err, tinymq.ErrNotEmpty), errors.Is(err, tinymq.ErrNoDeath),
		errors.Is(err, tinymq.ErrUnknownExchange), errors.Is(err, tinymq.ErrNoRoute),
		errors.Is(err, tinymq.ErrQueueFull), errors.Is(err, tinymq.ErrTooLarge):
		// The request was fine; the state of the MQ refused it.
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// intParam reads an integer parameter in [lo, hi]; def is its value when it
// is absent, and a def below lo makes it required.
func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	s := q.Get(name)
	if s == "" {
		if def < lo {
			return 0, fmt.Errorf("bad request: the %s parameter is required (%d to %d)", name, lo, hi)
		}
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("bad request: %s must be an integer from %d to %d", name, lo, hi)
	}
	return v, nil
}

func (h *handler) purge(_ *http.Request, q string, _ int) (int, actionResult, error) {
	n, err := h.mq.PurgeQueue(q)
	return n, actionResult{}, err
}

func (h *handler) deleteQueue(r *http.Request, q string, _ int) (int, actionResult, error) {
	var opts []tinymq.DeleteOption
	query := r.URL.Query()
	if flag(query.Get("if_unused")) {
		opts = append(opts, tinymq.IfUnused())
	}
	if flag(query.Get("if_empty")) {
		opts = append(opts, tinymq.IfEmpty())
	}
	n, err := h.mq.DeleteQueue(q, opts...)
	return n, actionResult{}, err
}

// flag reads a boolean parameter: "1", "true", "on" or "yes".
func flag(s string) bool {
	switch s {
	case "1", "true", "on", "yes":
		return true
	}
	return false
}

func (h *handler) pause(_ *http.Request, q string, _ int) (int, actionResult, error) {
	if err := h.mq.PauseQueue(q); err != nil {
		return 0, actionResult{}, err
	}
	return 0, actionResult{Paused: ptr(true)}, nil
}

func (h *handler) resume(_ *http.Request, q string, _ int) (int, actionResult, error) {
	if err := h.mq.ResumeQueue(q); err != nil {
		return 0, actionResult{}, err
	}
	return 0, actionResult{Paused: ptr(false)}, nil
}

func (h *handler) replay(_ *http.Request, q string, n int) (int, actionResult, error) {
	moved, err := h.mq.ReplayDeadLetters(q, n)
	return moved, actionResult{}, err
}

func (h *handler) peek(_ *http.Request, q string, n int) (int, actionResult, error) {
	msgs, err := h.mq.Peek(q, n)
	payloads := h.cfg.payloads
	res := actionResult{Payloads: &payloads}
	if err != nil {
		return 0, res, err
	}
	views := []msgView{}
	budget := maxPeekBytes
	for _, m := range msgs {
		v := viewMsg(m, payloads)
		b, err := json.Marshal(v)
		if err != nil || len(b) > budget {
			res.Truncated = true
			break
		}
		budget -= len(b) + 1
		views = append(views, v)
	}
	res.Messages = &views
	return len(views), res, nil
}

// msgView is one peeked message: its metadata, and its payload only with
// WithPayloads.
type msgView struct {
	ID          uint64            `json:"id"`
	Exchange    string            `json:"exchange"`
	RoutingKey  string            `json:"routing_key"`
	Headers     map[string]string `json:"headers"`
	Attempt     int               `json:"attempt"`
	Redelivered bool              `json:"redelivered"`
	// Size is the payload's length in bytes when it is known without
	// encoding it (a []byte, a string, a json.RawMessage, an Encoded), as
	// tinymq.WithMaxMessageSize measures it; null otherwise.
	Size       *int        `json:"size"`
	Type       string      `json:"type"`
	Deaths     []deathView `json:"deaths"`
	DeathCount int         `json:"death_count"`
	// Payload is the payload as text ("text": UTF-8, or "json": its
	// encoding/json encoding) or base64 ("base64": bytes that are not
	// UTF-8), cut to maxPayloadBytes; absent without WithPayloads.
	Payload          *string `json:"payload,omitempty"`
	PayloadEncoding  string  `json:"payload_encoding,omitempty"`
	PayloadTruncated bool    `json:"payload_truncated,omitempty"`
	PayloadError     string  `json:"payload_error,omitempty"`
}

type deathView struct {
	Reason     string `json:"reason"`
	Queue      string `json:"queue"`
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	Count      int    `json:"count"`
	Attempts   int    `json:"attempts"`
	Time       string `json:"time"`
	LastError  string `json:"last_error"`
}

func viewMsg(m *tinymq.Msg, payloads bool) msgView {
	v := msgView{ID: m.ID, Exchange: clip(m.Exchange), RoutingKey: clip(m.RoutingKey), Attempt: m.Attempt,
		Redelivered: m.Redelivered, Headers: map[string]string{}, Deaths: []deathView{}, DeathCount: len(m.Deaths),
		Type: typeName(m.Data)}
	if n, ok := dataSize(m.Data); ok {
		v.Size = &n
	}
	keys := slices.Sorted(maps.Keys(m.Headers))
	for i, k := range keys {
		if i == maxArgEntries {
			v.Headers["…"] = fmt.Sprintf("%d more", len(keys)-maxArgEntries)
			break
		}
		v.Headers[clip(k)] = formatValue(m.Headers[k])
	}
	for i, d := range m.Deaths {
		if i == maxDeathsShown {
			break
		}
		v.Deaths = append(v.Deaths, deathView{Reason: clip(string(d.Reason)), Queue: clip(d.Queue),
			Exchange: clip(d.Exchange), RoutingKey: clip(d.RoutingKey), Count: d.Count, Attempts: d.Attempts,
			Time: formatTime(d.Time), LastError: clip(d.LastError)})
	}
	if payloads {
		v.Payload, v.PayloadEncoding, v.PayloadTruncated, v.PayloadError = payloadOf(m.Data)
	}
	return v
}

// typeName names the payload's Go type without calling any of its methods.
func typeName(v any) string {
	if v == nil {
		return "nil"
	}
	return clip(fmt.Sprintf("%T", v))
}

// dataSize is the size of data when it is known without encoding it, as the
// core's WithMaxMessageSize measures it.
func dataSize(data any) (int, bool) {
	switch v := data.(type) {
	case []byte:
		return len(v), true
	case string:
		return len(v), true
	case json.RawMessage:
		return len(v), true
	case tinymq.Encoded:
		return len(v.Body), true
	}
	return 0, false
}

// payloadOf renders a payload for peek, cut to maxPayloadBytes. Data of
// another type is encoded with encoding/json, which may call its
// MarshalJSON: user code, run under a recover.
func payloadOf(data any) (text *string, encoding string, cut bool, errMsg string) {
	var b []byte
	encoding = "text"
	switch v := data.(type) {
	case nil:
		return nil, "", false, ""
	case string:
		b = []byte(v)
	case []byte:
		b = v
	case json.RawMessage:
		b = v
	case tinymq.Encoded:
		b = v.Body
	default:
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panicked: %s", guard.ValueText(r))
				}
			}()
			b, err = json.Marshal(v)
		}()
		if err != nil {
			return nil, "", false, clip("cannot encode the payload as JSON: " + errText(err))
		}
		encoding = "json"
	}
	if !utf8.Valid(b) {
		if len(b) > maxPayloadBytes*3/4 {
			b, cut = b[:maxPayloadBytes*3/4], true
		}
		s := base64.StdEncoding.EncodeToString(b)
		return &s, "base64", cut, ""
	}
	s := string(b)
	if len(s) > maxPayloadBytes {
		s, cut = clipN(s, maxPayloadBytes), true
	}
	return &s, encoding, cut, ""
}
