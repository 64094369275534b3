package admin

import (
	"bytes"
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

// Option configures a [Handler]; Handler reads it once.
type Option interface {
	apply(*config)
}

type config struct {
	refresh    time.Duration
	rateWindow time.Duration
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

// handler serves the page and the JSON. Its only state is the sampler, which
// has its own mutex; it starts no goroutine.
type handler struct {
	mq      *tinymq.MQ
	cfg     config
	samples *sampler
}

// Handler returns an http.Handler that serves the admin page at "/" and its
// JSON at "/api/overview" for mq, read-only. Mount it under any prefix with
// [net/http.StripPrefix]. Nil options are ignored. Handler panics if mq is
// nil, as [net/http.Handle] does for a nil handler.
//
// The handler is safe for concurrent use and starts no goroutine: there is
// nothing to close. Each request to the JSON calls [tinymq.MQ.Topology],
// [tinymq.MQ.Stats] and [tinymq.MQ.RecentDeadLetters] once, which never block
// on consumers; a request blocks only as long as those calls (on a
// [tinymq.Engine], as long as the engine's Stats), and costs about one pass
// over the queues and bindings. After the MQ stops, the handler keeps serving
// its last numbers, and rates fall to zero.
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
	return &handler{mq: mq, cfg: cfg, samples: newSampler(cfg.rateWindow)}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")

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
	default:
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed: the admin handler is read-only")
		return
	}
	serve(w, r)
}

// redirectToSlash answers a request for the mount point itself ("/x/admin"
// stripped to "") with a redirect to "admin/", relative so that it works
// behind any prefix and proxy. http.Redirect would resolve it against the
// stripped path.
func (h *handler) redirectToSlash(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed: the admin handler is read-only")
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
	_, _ = w.Write(pageHTML)
}

func (h *handler) serveOverview(w http.ResponseWriter, _ *http.Request) {
	ov, err := h.overview()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	body, err := json.Marshal(ov)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encoding the overview failed")
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_, _ = w.Write(append(body, '\n'))
}

// writeError writes a small JSON error body; msg is never user input.
func writeError(w http.ResponseWriter, code int, msg string) {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(struct {
		Error string `json:"error"`
	}{msg})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}
