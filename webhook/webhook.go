// Package webhook delivers TinyMQ messages to HTTP endpoints: [New] returns
// a consumer that POSTs each message as JSON, so a queue's retry policy and
// dead-lettering apply to webhooks as to any consumer. It lives apart from the
// core so that the core does not import net/http.
//
// # Redirects
//
// A delivery is a POST of the message to the endpoint answered with a 2xx,
// and nothing else. The consumer never follows a redirect: a 3xx answer is a
// failed delivery with a [*StatusError] that names the status and the
// Location, retried or dead-lettered by the queue's policy like a 5xx. Go's
// http.Client would follow a 301, 302 or 303 with a GET without the body, so
// the endpoint's 200 would count a message as delivered that nobody received;
// even a 307 or 308, which keep the method and body, would send the message
// (and its headers) to a URL nobody configured. Dedicated webhook senders
// (Chargebee, Hookdeck's Outpost) refuse redirects likewise. Configure the
// endpoint's final URL, https included.
//
// # Secrets in the endpoint
//
// An endpoint may carry secrets: a password (http://user:pass@host/hook) or a
// token in the query (?token=...). No error of the consumer shows them, so
// that they reach neither the MQ's log nor dead letters: errors write the
// endpoint as [url.URL.Redacted] does, with the value of every query
// parameter (and a username given without a password, often a token) also
// replaced by xxxxx. The same goes for the text of net/http's errors, which
// quote the URL (a [*url.Error] in the chain carries the redacted URL), for
// [StatusError]'s fields, and for the start of the response body that a
// StatusError quotes, where an endpoint may also echo the Authorization:
// Basic header that net/http makes of the userinfo (its base64 is hidden
// too). A secret of 6 bytes or more is replaced wherever it
// appears in that text; a shorter one only where the URL or its userinfo
// appears, lest every "1" in an address be replaced.
package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tinymq/tinymq"
)

// Option configures a consumer made by [New].
type Option interface {
	apply(*config) error
}

type config struct {
	client  *http.Client
	timeout time.Duration
	header  http.Header
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// WithClient sets the client that posts; default [http.DefaultClient]. New
// takes a copy of *c whose CheckRedirect refuses every redirect, so that c's
// own CheckRedirect is never called (see the package documentation, and
// changes made to *c after New are not seen); c's Transport, Jar and Timeout
// are used as they are. A transport that follows a redirect itself does not
// turn it into a delivery either: an answer to any request but the POST to
// the endpoint is a failure. A nil client is refused with
// [tinymq.ErrInvalidOption].
func WithClient(c *http.Client) Option {
	return optionFunc(func(cfg *config) error {
		if c == nil {
			return fmt.Errorf("%w: nil http.Client", tinymq.ErrInvalidOption)
		}
		cfg.client = c
		return nil
	})
}

// WithTimeout bounds each request; default 10s. A timeout of 0 or less is
// refused with [tinymq.ErrInvalidOption].
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(cfg *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: timeout %v", tinymq.ErrInvalidOption, d)
		}
		cfg.timeout = d
		return nil
	})
}

// WithHeader adds a header to every request, such as an Authorization. A name
// that is not an HTTP token, or a value with a control character (such as CR
// or LF), is refused with [tinymq.ErrInvalidOption], so that a bad header
// fails at New rather than in every delivery.
func WithHeader(name, value string) Option {
	return optionFunc(func(cfg *config) error {
		if !validName(name) {
			return fmt.Errorf("%w: header name %q", tinymq.ErrInvalidOption, name)
		}
		if !validValue(value) {
			return fmt.Errorf("%w: header %s has a control character in its value", tinymq.ErrInvalidOption, name)
		}
		cfg.header.Add(name, value)
		return nil
	})
}

// validName reports whether s is an HTTP token (RFC 9110, section 5.6.2).
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether s has no control character but horizontal tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// StatusError is the error of a delivery that the endpoint answered with a
// status other than 2xx, a redirect included (which the consumer does not
// follow). Match it with [errors.As] to treat some statuses as permanent, for
// example:
//
//	var se *webhook.StatusError
//	if errors.As(err, &se) && se.Code >= 400 && se.Code < 500 {
//		return tinymq.Permanent(err)
//	}
type StatusError struct {
	// URL is the endpoint, its secrets replaced by xxxxx (see the package
	// documentation).
	URL string
	// Code is the HTTP status code.
	Code int
	// Location is the absolute URL of the Location header of a 3xx answer,
	// its secrets replaced by xxxxx, or "".
	Location string
	// Body is the start of the response body (at most 512 bytes), with the
	// endpoint's secrets replaced by xxxxx.
	Body string
}

// Error says which endpoint answered which status, and where a redirect
// pointed.
func (e *StatusError) Error() string {
	s := fmt.Sprintf("webhook %s: status %d", e.URL, e.Code)
	if e.Location != "" {
		s += " (a redirect to " + e.Location + ", not followed)"
	}
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// deliveryError is a failed delivery's error whose text has the endpoint's
// secrets removed; it unwraps to the error that failed, so that errors.Is
// still finds, say, [context.DeadlineExceeded].
type deliveryError struct {
	text string
	err  error
}

func (e *deliveryError) Error() string { return e.text }
func (e *deliveryError) Unwrap() error { return e.err }

// New returns a consumer that POSTs each message to endpoint: the body is
// msg.Data encoded as JSON (a [json.RawMessage] is sent as it is, an
// [tinymq.Encoded] as its bytes), with the Content-Type of its encoding and
// the headers X-TinyMQ-Message-Id, X-TinyMQ-Exchange, X-TinyMQ-Queue,
// X-TinyMQ-Routing-Key and X-TinyMQ-Attempt. A 2xx response to that POST is
// a success. Any other status, a 3xx included, is a failure with a
// [*StatusError]: redirects are not followed (see the package documentation).
// A network error or a timeout is a failure too, so the queue's retry policy
// applies. A payload that cannot be encoded is a [tinymq.Permanent] failure.
// No error shows the endpoint's password or query values.
//
// The consumer blocks for one request at most, bounded by the timeout and by
// the consumer's context (cancelled by a Shutdown deadline). New returns an
// error wrapping [tinymq.ErrInvalidOption] for an endpoint that is not an
// absolute http or https URL, or an invalid option.
func New(endpoint string, opts ...Option) (tinymq.ConsumerFunc, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		// The parser's error quotes the text, which may hold a password.
		return nil, fmt.Errorf("%w: endpoint is not a URL (its text is left out: it may hold a secret)", tinymq.ErrInvalidOption)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: endpoint %q is not an absolute http(s) URL", tinymq.ErrInvalidOption, redactURL(u))
	}
	cfg := config{client: http.DefaultClient, timeout: 10 * time.Second, header: make(http.Header)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil webhook.Option", tinymq.ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	client := *cfg.client
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	cfg.client = &client
	t := newTarget(endpoint, u)
	return func(ctx context.Context, msg *tinymq.Msg) error {
		return post(ctx, &cfg, t, msg)
	}, nil
}

func post(ctx context.Context, cfg *config, t *target, msg *tinymq.Msg) error {
	body, contentType, err := encode(msg.Data)
	if err != nil {
		return tinymq.Permanent(fmt.Errorf("webhook: encoding the payload: %w", err))
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.endpoint, bytes.NewReader(body))
	if err != nil {
		return tinymq.Permanent(t.failure(err))
	}
	for k, vs := range cfg.header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-TinyMQ-Message-Id", strconv.FormatUint(msg.ID, 10))
	req.Header.Set("X-TinyMQ-Exchange", msg.Exchange)
	req.Header.Set("X-TinyMQ-Queue", msg.Queue)
	req.Header.Set("X-TinyMQ-Routing-Key", msg.RoutingKey)
	req.Header.Set("X-TinyMQ-Attempt", strconv.Itoa(msg.Attempt))
	resp, err := cfg.client.Do(req)
	if err != nil {
		return t.failure(err)
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection can be reused
	if fr := resp.Request; fr != nil && (fr.Method != http.MethodPost || fr.URL == nil || fr.URL.String() != req.URL.String()) {
		// The client refuses redirects, but a transport may follow one itself.
		to := "another request"
		if fr.URL != nil {
			to = fr.Method + " " + redactURL(fr.URL)
		}
		return &deliveryError{text: fmt.Sprintf("webhook %s: the client answered status %d to %s, not to the POST: it followed a redirect, and a redirect is never a delivery",
			t.shown, resp.StatusCode, t.hide.Replace(to))}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		se := &StatusError{URL: t.shown, Code: resp.StatusCode, Body: t.hide.Replace(string(bytes.TrimSpace(snippet)))}
		if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
			if loc, err := resp.Location(); err == nil {
				se.Location = t.hide.Replace(redactURL(loc))
			} else if raw := resp.Header.Get("Location"); raw != "" {
				se.Location = t.hide.Replace(raw) + " (not a URL)"
			}
		}
		return se
	}
	return nil
}

// target is an endpoint and what hides its secrets in an error.
type target struct {
	endpoint string            // as given to New: what the request is sent to
	shown    string            // endpoint with its secrets replaced by xxxxx
	hide     *strings.Replacer // replaces endpoint and its secrets, in any form, in a text
}

// redacted replaces a secret.
const redacted = "xxxxx"

// minSecret is the length from which a secret is replaced wherever it
// appears in an error text; a shorter one is replaced only within the
// endpoint's URL and userinfo, since replacing every "1" or "ab" would garble
// the text (and a secret that short protects little).
const minSecret = 6

func newTarget(endpoint string, u *url.URL) *target {
	t := &target{endpoint: endpoint, shown: redactURL(u)}
	pairs := []string{endpoint, t.shown, u.String(), t.shown}
	var secrets []string
	if u.User != nil {
		name := u.User.Username()
		pass, hasPass := u.User.Password()
		// net/http sends the userinfo as an Authorization: Basic header,
		// which an endpoint may echo back in its answer.
		basic := []byte(name + ":" + pass)
		secrets = append(secrets, base64.StdEncoding.EncodeToString(basic), base64.RawStdEncoding.EncodeToString(basic))
		if hasPass {
			// The userinfo, escaped (as in a URL) and not.
			pairs = append(pairs, u.User.String()+"@", url.UserPassword(name, redacted).String()+"@",
				name+":"+pass+"@", name+":"+redacted+"@")
			secrets = append(secrets, pass, url.PathEscape(pass), url.QueryEscape(pass))
		} else {
			pairs = append(pairs, u.User.String()+"@", redacted+"@", name+"@", redacted+"@")
			secrets = append(secrets, name, url.PathEscape(name))
		}
	}
	if u.RawQuery != "" {
		pairs = append(pairs, "?"+u.RawQuery, "?"+redactQuery(u.RawQuery))
		for _, kv := range strings.Split(u.RawQuery, "&") {
			v := kv
			if _, val, ok := strings.Cut(kv, "="); ok {
				v = val
			}
			secrets = append(secrets, v)
			if uv, err := url.QueryUnescape(v); err == nil {
				secrets = append(secrets, uv)
			}
		}
	}
	// Longer first: at one position the Replacer takes the first match.
	slices.SortFunc(secrets, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	for _, s := range slices.Compact(secrets) {
		if len(s) >= minSecret {
			pairs = append(pairs, s, redacted)
		}
	}
	t.hide = strings.NewReplacer(pairs...)
	return t
}

// failure returns err, the error of a request to t that got no answer, with
// t's secrets removed from its text and from the URL of a [*url.Error].
func (t *target) failure(err error) error {
	if ue, ok := err.(*url.Error); ok {
		err = &url.Error{Op: ue.Op, URL: t.shown, Err: t.scrub(ue.Err)}
	} else {
		err = t.scrub(err)
	}
	return &deliveryError{text: "webhook " + t.shown + ": " + t.hide.Replace(err.Error()), err: err}
}

// scrub returns err, or, when its text shows one of t's secrets (net/http
// quotes a Location it cannot parse, for one), an error with that text
// redacted that matches what err matches ([errors.Is], and Timeout) without
// unwrapping to it: nothing in the chain shows a secret.
func (t *target) scrub(err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	if hidden := t.hide.Replace(text); hidden != text {
		return &scrubbedError{text: hidden, cause: err}
	}
	return err
}

// scrubbedError is an error whose text held a secret (see target.scrub).
type scrubbedError struct {
	text  string
	cause error // never unwrapped: its text shows the secret
}

func (e *scrubbedError) Error() string { return e.text }

// Is reports whether the hidden error matches target.
func (e *scrubbedError) Is(target error) bool { return errors.Is(e.cause, target) }

// Timeout reports whether the hidden error was a timeout.
func (e *scrubbedError) Timeout() bool {
	var te interface{ Timeout() bool }
	return errors.As(e.cause, &te) && te.Timeout()
}

// redactURL returns u as text with its secrets replaced by xxxxx: the
// password (as [url.URL.Redacted] does), a username that has no password
// (often a token), and the value of each query parameter.
func redactURL(u *url.URL) string {
	r := *u
	if r.User != nil {
		if _, ok := r.User.Password(); !ok {
			r.User = url.User(redacted)
		}
	}
	if r.RawQuery != "" {
		r.RawQuery = redactQuery(r.RawQuery)
	}
	return r.Redacted()
}

// redactQuery replaces the value of each parameter of a raw query, and each
// parameter that has no value, by xxxxx.
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, kv := range parts {
		if k, _, ok := strings.Cut(kv, "="); ok {
			parts[i] = k + "=" + redacted
		} else if kv != "" {
			parts[i] = redacted
		}
	}
	return strings.Join(parts, "&")
}

// encode returns the request body for data and its content type.
func encode(data any) ([]byte, string, error) {
	switch d := data.(type) {
	case json.RawMessage:
		return d, "application/json", nil
	case tinymq.Encoded:
		ct := "application/json"
		if d.Codec != nil {
			ct = d.Codec.ContentType()
		}
		return d.Body, ct, nil
	}
	b, err := json.Marshal(data)
	return b, "application/json", err
}
