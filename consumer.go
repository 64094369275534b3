package tinymq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"time"
)

// ConsumerFunc handles one message of a queue.
//
// Returning nil acknowledges the message. Returning an error, or panicking, makes
// the delivery a failure: TinyMQ logs it with the exchange, queue and message ID
// (and the stack, for a panic, which reaches the log as a [*PanicError]) and goes
// on with the next message on the same worker.
//
// ctx is cancelled when the ctx given to [MQ.Start] is cancelled, or when
// [MQ.Shutdown]'s deadline passes; a consumer that may run long should honour it.
// The workers of one queue call the consumer concurrently, so it must be safe
// for that when the queue's concurrency is above 1.
type ConsumerFunc func(ctx context.Context, msg *Msg) error

// Handler adapts a function of one payload type into a ConsumerFunc, so that
// a queue of UserCreated events can be consumed by
// func(ctx context.Context, e UserCreated) error. A message whose Data is an
// [Encoded] (a durable queue, a broker) is decoded into a T with its codec, so
// the function gets the same T on every engine, before and after a restart.
// A nil Data is the zero T when T is an interface type. A message whose Data
// is not a T otherwise fails with a [Permanent] error wrapping [ErrPayloadType], so it is
// dead-lettered without retries. Handler(nil) returns nil, which
// RegisterQueue refuses.
func Handler[T any](fn func(ctx context.Context, v T) error) ConsumerFunc {
	if fn == nil {
		return nil
	}
	// nil is a valid value of an interface type T, such as any or error.
	nilOK := reflect.TypeFor[T]().Kind() == reflect.Interface
	return func(ctx context.Context, msg *Msg) error {
		v, ok := msg.Data.(T)
		if !ok {
			switch d := msg.Data.(type) {
			case Encoded:
				if err := d.Decode(&v); err != nil {
					return Permanent(fmt.Errorf("%w, want %v", err, reflect.TypeFor[T]()))
				}
			case nil:
				if !nilOK {
					return Permanent(fmt.Errorf("%w: got nil, want %v", ErrPayloadType, reflect.TypeFor[T]()))
				}
			default:
				return Permanent(fmt.Errorf("%w: got %T, want %v", ErrPayloadType, msg.Data, reflect.TypeFor[T]()))
			}
		}
		return fn(ctx, v)
	}
}

// HTTPOption configures an [HTTPConsumer].
type HTTPOption interface {
	applyHTTP(*httpConfig)
}

type httpConfig struct {
	client  *http.Client
	timeout time.Duration
	header  http.Header
}

type httpOptionFunc func(*httpConfig)

func (f httpOptionFunc) applyHTTP(c *httpConfig) { f(c) }

// WithHTTPClient sets the client that posts; default [http.DefaultClient].
func WithHTTPClient(c *http.Client) HTTPOption {
	return httpOptionFunc(func(cfg *httpConfig) { cfg.client = c })
}

// WithHTTPTimeout bounds each request; default 10s.
func WithHTTPTimeout(d time.Duration) HTTPOption {
	return httpOptionFunc(func(cfg *httpConfig) { cfg.timeout = d })
}

// WithHTTPHeader adds a header to every request, such as an Authorization.
func WithHTTPHeader(key, value string) HTTPOption {
	return httpOptionFunc(func(cfg *httpConfig) { cfg.header.Add(key, value) })
}

// HTTPConsumer returns a consumer that POSTs each message to endpoint, as a
// webhook: the body is msg.Data encoded as JSON (a [json.RawMessage] is sent
// as it is), with Content-Type application/json and the headers
// X-TinyMQ-Message-Id, X-TinyMQ-Exchange, X-TinyMQ-Queue, X-TinyMQ-Routing-Key
// and X-TinyMQ-Attempt. A 2xx response is a success. Any other status, a
// network error or a timeout is a failure, so the queue's retry policy
// applies; a payload that cannot be encoded is a [Permanent] failure. It
// returns an error for an endpoint that is not an absolute http or https URL,
// or an option out of range.
func HTTPConsumer(endpoint string, opts ...HTTPOption) (ConsumerFunc, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: endpoint %q is not an absolute http(s) URL", ErrInvalidOption, endpoint)
	}
	cfg := httpConfig{client: http.DefaultClient, timeout: 10 * time.Second, header: make(http.Header)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil HTTPOption", ErrInvalidOption)
		}
		o.applyHTTP(&cfg)
	}
	if cfg.client == nil || cfg.timeout <= 0 {
		return nil, fmt.Errorf("%w: nil client or timeout %v", ErrInvalidOption, cfg.timeout)
	}
	return func(ctx context.Context, msg *Msg) error {
		body, ok := msg.Data.(json.RawMessage)
		if !ok {
			var err error
			if body, err = json.Marshal(msg.Data); err != nil {
				return Permanent(fmt.Errorf("tinymq: webhook: encoding the payload: %w", err))
			}
		}
		ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
		if err != nil {
			return Permanent(err)
		}
		for k, vs := range cfg.header {
			req.Header[k] = vs
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-TinyMQ-Message-Id", strconv.FormatUint(msg.ID, 10))
		req.Header.Set("X-TinyMQ-Exchange", msg.Exchange)
		req.Header.Set("X-TinyMQ-Queue", msg.Queue)
		req.Header.Set("X-TinyMQ-Routing-Key", msg.RoutingKey)
		req.Header.Set("X-TinyMQ-Attempt", strconv.Itoa(msg.Attempt))
		resp, err := cfg.client.Do(req)
		if err != nil {
			return fmt.Errorf("tinymq: webhook %s: %w", endpoint, err)
		}
		defer resp.Body.Close()
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection can be reused
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return fmt.Errorf("tinymq: webhook %s: status %d: %s", endpoint, resp.StatusCode, bytes.TrimSpace(snippet))
		}
		return nil
	}, nil
}
