package admin

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/tinymq/tinymq"
)

const (
	// defaultRefresh is how often the page fetches the JSON by default.
	defaultRefresh = time.Second
	// minRefresh is the shortest refresh interval the page accepts.
	minRefresh = 100 * time.Millisecond
	// defaultRateWindow is the interval rates are averaged over by default.
	defaultRateWindow = 10 * time.Second
	// minRateWindow is the shortest rate window accepted.
	minRateWindow = time.Second
)

// defaultHosts are the Host header values (without port) that a handler
// answers by default: the loopback names.
var defaultHosts = []string{"localhost", "127.0.0.1", "::1"}

// Option configures a [Handler]; Handler reads it once.
type Option interface {
	apply(*config)
}

type config struct {
	refresh    time.Duration
	rateWindow time.Duration
	actions    bool
	payloads   bool
	hosts      []hostPattern // nil: defaultHosts
	anyHost    bool
	authorize  AuthorizeFunc
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithRefresh sets how often the page fetches fresh numbers: default one
// second. Zero or less means the default; values below 100ms are raised to
// 100ms.
func WithRefresh(d time.Duration) Option {
	return optionFunc(func(c *config) {
		switch {
		case d <= 0:
			c.refresh = defaultRefresh
		case d < minRefresh:
			c.refresh = minRefresh
		default:
			c.refresh = d
		}
	})
}

// WithRateWindow sets the interval that rates are averaged over: default ten
// seconds. Zero or less means the default; values below one second are
// raised to one second.
func WithRateWindow(d time.Duration) Option {
	return optionFunc(func(c *config) {
		switch {
		case d <= 0:
			c.rateWindow = defaultRateWindow
		case d < minRateWindow:
			c.rateWindow = minRateWindow
		default:
			c.rateWindow = d
		}
	})
}

// WithActions turns on the operators' actions: purge a queue, delete it,
// pause and resume it, replay its dead letters and peek at its head (see
// the package documentation's Actions section for the routes). Without it
// the handler is read-only, and the action routes are 404 Not Found. Each
// action is a POST that must carry the handler's token and come from the
// handler's own origin; [WithAuthorize] decides who may do what. Peek shows
// the messages' metadata only, unless [WithPayloads] is given too. An action
// blocks as long as its MQ call does (a durable queue's log record, a
// replay's publishes); after Stop every action but peek answers 503.
func WithActions() Option {
	return optionFunc(func(c *config) { c.actions = true })
}

// WithPayloads makes peek (see [WithActions]) show the messages' payloads
// as well as their metadata. It is a separate choice because payloads often
// hold personal data that the people allowed to purge a queue need not
// see. Without WithActions it does nothing.
func WithPayloads() Option {
	return optionFunc(func(c *config) { c.payloads = true })
}

// WithAllowedHosts sets the Host header values that the handler answers;
// every other request, GET included, is refused with 403 Forbidden, so that
// a page of another site whose name was re-pointed at this address (DNS
// rebinding) can neither read the page nor act through it. A host without a
// port ("localhost", "mq.example.com", "::1" or "[::1]") allows it with any
// port; one with a port ("mq.example.com:8443") allows that port only.
// Names are compared without regard to case. "*" allows any host: use it
// only behind a proxy that checks the Host itself. The default (also for a
// call with no hosts) is the loopback names: localhost, 127.0.0.1 and
// [::1], with any port. Each call replaces the list of the one before.
func WithAllowedHosts(hosts ...string) Option {
	return optionFunc(func(c *config) {
		c.hosts, c.anyHost = nil, false
		for _, h := range hosts {
			if strings.TrimSpace(h) == "*" {
				c.anyHost = true
				continue
			}
			if p, ok := parseHostPattern(h); ok {
				c.hosts = append(c.hosts, p)
			}
		}
	})
}

// AuthorizeFunc decides whether the request r may do action on queue:
// action is one of "purge", "delete", "pause", "resume", "replay" and
// "peek". A nil error allows it; any other error refuses it with 403
// Forbidden and the error's text as the JSON's "error". It runs on the
// request's goroutine, after the handler's own checks (Host, origin, token,
// arguments) passed and before the MQ is touched; a panic in it fails the
// request with 500 and does not reach the caller. It must be safe for
// concurrent use.
type AuthorizeFunc func(r *http.Request, action, queue string) error

// WithAuthorize has fn decide, per request, whether an action (see
// [WithActions]) may be done. Without it every action that passes the
// handler's own checks is done: the handler has no notion of users, so
// mount it behind your authentication. A nil fn means none.
func WithAuthorize(fn AuthorizeFunc) Option {
	return optionFunc(func(c *config) { c.authorize = fn })
}

// handler serves the page, the JSON and the actions. Its state is the
// sampler and the history, each with its own mutex; it starts no goroutine.
type handler struct {
	mq      *tinymq.MQ
	cfg     config
	samples *sampler
	history *history
	token   string // the actions' CSRF token; "" without WithActions
	page    []byte
	origin  *http.CrossOriginProtection
}

// Handler returns an http.Handler that serves the admin page for mq at "/",
// its JSON at "/api/overview", the bindings of an exchange at
// "/api/bindings", readiness at "/healthz" and, with [WithActions], the
// actions under "/api/" (the package documentation lists the routes).
// Mount it under any prefix with [net/http.StripPrefix]. Nil options are
// ignored. Handler panics if mq is nil, as [net/http.Handle] does for a nil
// handler.
//
// The handler is safe for concurrent use and starts no goroutine: there is
// nothing to close. It answers only requests whose Host is allowed (see
// [WithAllowedHosts]). Each request to the JSON calls [tinymq.MQ.Topology],
// [tinymq.MQ.Stats] and [tinymq.MQ.RecentDeadLetters] once, which never
// block on consumers; a request blocks only as long as those calls (on a
// [tinymq.Engine], as long as the engine's Stats), and costs about one pass
// over the queues and bindings, and a sort of the queues when asked to
// sort. An action blocks as long as its MQ call does (a durable queue's log
// record). After the MQ stops, the handler keeps serving its last numbers,
// rates fall to zero, the actions that change the MQ return 503, and
// /healthz says 503.
func Handler(mq *tinymq.MQ, opts ...Option) http.Handler {
	if mq == nil {
		panic("admin: Handler called with a nil *tinymq.MQ")
	}
	cfg := config{refresh: defaultRefresh, rateWindow: defaultRateWindow}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.hosts == nil && !cfg.anyHost {
		for _, h := range defaultHosts {
			p, _ := parseHostPattern(h)
			cfg.hosts = append(cfg.hosts, p)
		}
	}
	h := &handler{mq: mq, cfg: cfg, samples: newSampler(cfg.rateWindow), history: newHistory(),
		origin: http.NewCrossOriginProtection()}
	if cfg.actions {
		var b [32]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		h.token = base64.RawURLEncoding.EncodeToString(b[:])
	}
	h.page = buildPage(h.token)
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")

	// Every request, GETs too: a rebound name must not read the page.
	if !h.hostAllowed(r.Host) {
		writeError(w, http.StatusForbidden,
			"forbidden: this handler does not answer to that Host (see admin.WithAllowedHosts)")
		return
	}

	if act, ok := actionRoutes[r.URL.Path]; ok && h.cfg.actions {
		h.serveAction(w, r, act)
		return
	}
	var serve func(http.ResponseWriter, *http.Request)
	switch r.URL.Path {
	case "":
		// Mounted with StripPrefix and asked for the prefix without its
		// trailing slash: the page's relative links need that slash.
		h.redirectToSlash(w, r)
		return
	case "/":
		serve = h.servePage
	case "/api/overview":
		serve = h.serveOverview
	case "/api/bindings":
		serve = h.serveBindings
	case "/healthz":
		serve = h.serveHealth
	default:
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed: only GET and HEAD here")
		return
	}
	serve(w, r)
}

// hostPattern is one entry of the Host allow-list.
type hostPattern struct {
	name string // lower case, without brackets
	port string // "": any
}

// parseHostPattern parses a Host allow-list entry; ok is false for an empty
// one.
func parseHostPattern(s string) (hostPattern, bool) {
	name, port := splitHost(strings.ToLower(strings.TrimSpace(s)))
	return hostPattern{name: name, port: port}, name != ""
}

// splitHost splits a Host header value into its name (without the brackets
// of an IPv6 literal) and its port, which may be "". It does not validate
// either: a value that no pattern names is refused anyway.
func splitHost(h string) (name, port string) {
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return h, ""
		}
		name, rest := h[1:end], h[end+1:]
		if p, ok := strings.CutPrefix(rest, ":"); ok {
			return name, p
		}
		if rest != "" {
			return h, "" // garbage after the brackets: matches nothing sensible
		}
		return name, ""
	}
	if strings.Count(h, ":") == 1 {
		name, port, _ = strings.Cut(h, ":")
		return name, port
	}
	return h, "" // a name, or an IPv6 literal without brackets (in a pattern)
}

// hostAllowed reports whether a request with this Host header is answered.
func (h *handler) hostAllowed(host string) bool {
	if h.cfg.anyHost {
		return true
	}
	name, port := splitHost(strings.ToLower(host))
	if name == "" {
		return false
	}
	for _, p := range h.cfg.hosts {
		if p.name == name && (p.port == "" || p.port == port) {
			return true
		}
	}
	return false
}

// redirectToSlash answers a request for the mount point itself ("/x/admin"
// stripped to "") with a redirect to "admin/", relative so that it works
// behind any prefix and proxy. http.Redirect would resolve it against the
// stripped path.
func (h *handler) redirectToSlash(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed: only GET and HEAD here")
		return
	}
	orig := r.URL.EscapedPath()
	if u := r.RequestURI; u != "" && !strings.Contains(u, "://") {
		orig, _, _ = strings.Cut(u, "?")
	}
	last := path.Base(orig)
	if last == "/" || last == "." || last == "" || strings.ContainsAny(last, `\:`) {
		// Nothing sensible to point at: serve the page's location explicitly.
		writeError(w, http.StatusNotFound, "not found: request the mount point with a trailing slash")
		return
	}
	w.Header().Set("Location", "./"+last+"/")
	w.WriteHeader(http.StatusMovedPermanently)
}

func (h *handler) servePage(w http.ResponseWriter, _ *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Content-Security-Policy", pageCSP)
	_, _ = w.Write(h.page)
}

func (h *handler) serveOverview(w http.ResponseWriter, r *http.Request) {
	p, err := parseOverviewParams(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ov, err := h.overview(p)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, ov)
}

// writeJSON writes v as the JSON body of a response with code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encoding the response failed")
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

// writeError writes a small JSON error body. msg is escaped by encoding/json
// and cut to maxErrorBytes.
func writeError(w http.ResponseWriter, code int, msg string) {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(struct {
		Error string `json:"error"`
	}{clipN(msg, maxErrorBytes)})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}
