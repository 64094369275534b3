// Package webhook delivers TinyMQ messages to HTTP endpoints: [New] returns
// a consumer that POSTs each message as JSON, so a queue's retry policy and
// dead-lettering apply to webhooks as to any consumer. It lives apart from the
// core so that the core does not import net/http.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
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

// WithClient sets the client that posts; default [http.DefaultClient]. A nil
// client is refused with [tinymq.ErrInvalidOption].
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
// status other than 2xx. Match it with [errors.As] to treat some statuses as
// permanent, for example:
//
//	var se *webhook.StatusError
//	if errors.As(err, &se) && se.Code >= 400 && se.Code < 500 {
//		return tinymq.Permanent(err)
//	}
type StatusError struct {
	// URL is the endpoint.
	URL string
	// Code is the HTTP status code.
	Code int
	// Body is the start of the response body (at most 512 bytes).
	Body string
}

// Error says which endpoint answered which status.
func (e *StatusError) Error() string {
	return fmt.Sprintf("webhook %s: status %d: %s", e.URL, e.Code, e.Body)
}

// New returns a consumer that POSTs each message to endpoint: the body is
// msg.Data encoded as JSON (a [json.RawMessage] is sent as it is, an
// [tinymq.Encoded] as its bytes), with the Content-Type of its encoding and
// the headers X-TinyMQ-Message-Id, X-TinyMQ-Exchange, X-TinyMQ-Queue,
// X-TinyMQ-Routing-Key and X-TinyMQ-Attempt. A 2xx response is a success. Any
// other status is a failure with a [*StatusError]; a network error or a
// timeout is a failure too, so the queue's retry policy applies. A payload
// that cannot be encoded is a [tinymq.Permanent] failure.
//
// The consumer blocks for one request at most, bounded by the timeout and by
// the consumer's context (cancelled by a Shutdown deadline). New returns an
// error wrapping [tinymq.ErrInvalidOption] for an endpoint that is not an
// absolute http or https URL, or an invalid option.
func New(endpoint string, opts ...Option) (tinymq.ConsumerFunc, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: endpoint %q is not an absolute http(s) URL", tinymq.ErrInvalidOption, endpoint)
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
	return func(ctx context.Context, msg *tinymq.Msg) error {
		return post(ctx, &cfg, endpoint, msg)
	}, nil
}

func post(ctx context.Context, cfg *config, endpoint string, msg *tinymq.Msg) error {
	body, contentType, err := encode(msg.Data)
	if err != nil {
		return tinymq.Permanent(fmt.Errorf("webhook: encoding the payload: %w", err))
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return tinymq.Permanent(err)
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
		return fmt.Errorf("webhook %s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection can be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &StatusError{URL: endpoint, Code: resp.StatusCode, Body: string(bytes.TrimSpace(snippet))}
	}
	return nil
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
