package webhook_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/webhook"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type UserCreated struct {
	ID    int
	Email string
}

// logRecords returns a logger and a function that decodes what it logged.
func logRecords() (*slog.Logger, func(t *testing.T) []map[string]any) {
	var mu sync.Mutex
	var buf bytes.Buffer
	h := slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, nil)
	return slog.New(h), func(t *testing.T) []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		var out []map[string]any
		dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
		for dec.More() {
			var rec map[string]any
			require.NoError(t, dec.Decode(&rec))
			out = append(out, rec)
		}
		return out
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// endpoint is a test endpoint whose answer the test sets per request.
type endpoint struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	answer   func(n int, w http.ResponseWriter, r *http.Request)
}

func (h *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.requests = append(h.requests, r)
	h.bodies = append(h.bodies, string(body))
	n := len(h.requests)
	h.mu.Unlock()
	h.answer(n, w, r)
}

func TestNew(t *testing.T) {
	hook := &endpoint{answer: func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			http.Error(w, "try later", http.StatusServiceUnavailable)
		case 2:
			<-r.Context().Done() // hangs until the consumer's timeout
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	}}
	srv := httptest.NewServer(hook)
	defer srv.Close()

	consume, err := webhook.New(srv.URL+"/hook", webhook.WithTimeout(200*time.Millisecond),
		webhook.WithHeader("Authorization", "Bearer s3cret"))
	require.NoError(t, err)
	log, records := logRecords()
	m := tinymq.New(tinymq.WithLogger(log))
	require.NoError(t, m.RegisterQueue("users", tinymq.Topic, consume, 1, tinymq.WithQueueName("webhook"),
		tinymq.WithBindingKey("user.*"), tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("users", UserCreated{ID: 7, Email: "a@b.c"}, tinymq.WithRoutingKey("user.created")))
	m.Stop()

	st := m.Stats().Queues["webhook"]
	assert.Equal(t, uint64(1), st.Succeeded, "503, then a timeout, then 202")
	assert.Equal(t, uint64(2), st.Retried)
	require.Len(t, hook.requests, 3)
	r := hook.requests[2]
	assert.Equal(t, http.MethodPost, r.Method)
	assert.Equal(t, "/hook", r.URL.Path)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	assert.Equal(t, "Bearer s3cret", r.Header.Get("Authorization"))
	assert.Equal(t, "1", r.Header.Get("X-TinyMQ-Message-Id"))
	assert.Equal(t, "users", r.Header.Get("X-TinyMQ-Exchange"))
	assert.Equal(t, "webhook", r.Header.Get("X-TinyMQ-Queue"))
	assert.Equal(t, "user.created", r.Header.Get("X-TinyMQ-Routing-Key"))
	assert.Equal(t, "3", r.Header.Get("X-TinyMQ-Attempt"))
	var body UserCreated
	require.NoError(t, json.Unmarshal([]byte(hook.bodies[2]), &body))
	assert.Equal(t, UserCreated{ID: 7, Email: "a@b.c"}, body)

	recs := records(t)
	require.Len(t, recs, 2)
	assert.Contains(t, recs[0]["err"], "status 503: try later")
	assert.Equal(t, "info", strings.ToLower(recs[0]["level"].(string)), "a retry is routine: logged at info")
	assert.Contains(t, recs[1]["err"], "deadline exceeded")
}

func TestRawJSONAndBadPayloads(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL)
	require.NoError(t, err)
	require.NoError(t, consume(context.Background(), &tinymq.Msg{Data: json.RawMessage(`{"a":1}`)}))
	err = consume(context.Background(), &tinymq.Msg{Data: make(chan int)})
	assert.ErrorIs(t, err, tinymq.ErrPermanent, "a payload that cannot be encoded will never succeed")
	assert.Equal(t, []string{`{"a":1}`}, got)

	for _, bad := range []string{"", "ftp://x/y", "/relative", "http://", "::"} {
		_, err := webhook.New(bad)
		assert.ErrorIs(t, err, tinymq.ErrInvalidOption, "endpoint %q", bad)
	}
	_, err = webhook.New(srv.URL, webhook.WithTimeout(0))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	_, err = webhook.New(srv.URL, webhook.WithClient(nil))
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
	assert.False(t, errors.Is(err, tinymq.ErrPermanent))
}

func TestStatusErrorAndHeaders(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such user", http.StatusNotFound)
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL)
	require.NoError(t, err)
	err = consume(context.Background(), &tinymq.Msg{Data: 1})
	var se *webhook.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, http.StatusNotFound, se.Code)
	assert.Equal(t, "no such user", se.Body)
	assert.False(t, errors.Is(err, tinymq.ErrPermanent), "the caller decides what is permanent")

	for _, h := range []struct{ name, value string }{
		{"", "x"}, {"Bad Name", "x"}, {"X-Evil\r\n", "x"}, {"X-Ok", "a\r\nX-Injected: 1"}, {"X-Ok", "nul\x00"},
	} {
		t.Run(h.name+"="+h.value, func(t *testing.T) {
			_, err := webhook.New(srv.URL, webhook.WithHeader(h.name, h.value))
			assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
		})
	}
	_, err = webhook.New(srv.URL, webhook.WithHeader("X-Ok", "tab\tis fine"))
	assert.NoError(t, err)
	_, err = webhook.New(srv.URL, nil)
	assert.ErrorIs(t, err, tinymq.ErrInvalidOption)
}

func TestEncodedPayloadIsSentAsItsBytes(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Header.Get("Content-Type") + " " + string(b)
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL)
	require.NoError(t, err)
	require.NoError(t, consume(context.Background(), &tinymq.Msg{Data: tinymq.Encoded{Body: []byte(`{"ID":1}`)}}))
	assert.Equal(t, `application/json {"ID":1}`, <-got)
}

// TestWebhookRedirectIsNeverASuccess answers the POST with each redirect
// status (and the 3xx statuses Go's client never follows), pointing at an
// endpoint that would answer 200: the consumer must not follow it, and must
// fail with a StatusError that names the status and the Location, whatever
// the client's own CheckRedirect says.
func TestWebhookRedirectIsNeverASuccess(t *testing.T) {
	final := &endpoint{answer: func(int, http.ResponseWriter, *http.Request) {}}
	finalSrv := httptest.NewServer(final)
	defer finalSrv.Close()
	tlsSrv := httptest.NewTLSServer(final)
	defer tlsSrv.Close()

	follow := func(*http.Request, []*http.Request) error { return nil } // a client that follows anything
	for _, tc := range []struct {
		name   string
		code   int
		target string
		client *http.Client
	}{
		{"301", http.StatusMovedPermanently, finalSrv.URL + "/final", nil},
		{"302", http.StatusFound, finalSrv.URL + "/final", nil},
		{"303", http.StatusSeeOther, finalSrv.URL + "/final", nil},
		{"307", http.StatusTemporaryRedirect, finalSrv.URL + "/final", nil},
		{"308", http.StatusPermanentRedirect, finalSrv.URL + "/final", nil},
		{"http to https", http.StatusMovedPermanently, tlsSrv.URL + "/final", tlsSrv.Client()},
		{"client that follows", http.StatusFound, finalSrv.URL + "/final", &http.Client{CheckRedirect: follow}},
		{"relative Location", http.StatusFound, "/final", nil},
		// Statuses Go's client never follows are failures all the same.
		{"300", http.StatusMultipleChoices, finalSrv.URL + "/final", nil},
		{"304", http.StatusNotModified, finalSrv.URL + "/final", nil},
		{"305", http.StatusUseProxy, finalSrv.URL + "/final", nil},
		{"399, unassigned", 399, finalSrv.URL + "/final", nil},
		{"307 to a client that follows", http.StatusTemporaryRedirect, finalSrv.URL + "/final", &http.Client{CheckRedirect: follow}},
		{"308 to a client that follows", http.StatusPermanentRedirect, finalSrv.URL + "/final", &http.Client{CheckRedirect: follow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/final" {
					final.ServeHTTP(w, r)
					return
				}
				http.Redirect(w, r, tc.target, tc.code)
			}))
			defer srv.Close()
			var opts []webhook.Option
			if tc.client != nil {
				opts = append(opts, webhook.WithClient(tc.client))
			}
			consume, err := webhook.New(srv.URL+"/hook", opts...)
			require.NoError(t, err)
			err = consume(context.Background(), &tinymq.Msg{Data: UserCreated{ID: 1}})
			require.Error(t, err, "a redirect is a failure")
			var se *webhook.StatusError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, tc.code, se.Code)
			wantLoc := tc.target
			if strings.HasPrefix(wantLoc, "/") {
				wantLoc = srv.URL + wantLoc
			}
			assert.Equal(t, wantLoc, se.Location)
			assert.Contains(t, err.Error(), fmt.Sprintf("status %d", tc.code))
			assert.Contains(t, err.Error(), wantLoc)
			assert.False(t, errors.Is(err, tinymq.ErrPermanent), "the queue's retry policy decides")
			final.mu.Lock()
			defer final.mu.Unlock()
			assert.Empty(t, final.requests, "the redirect was followed")
		})
	}
}

// followingTransport is a RoundTripper that follows a redirect itself, as
// some middleware does, with a GET and no body.
type followingTransport struct{}

func (followingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || resp.StatusCode/100 != 3 {
		return resp, err
	}
	loc, err := resp.Location()
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	get, err := http.NewRequestWithContext(req.Context(), http.MethodGet, loc.String(), nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultTransport.RoundTrip(get)
}

// TestWebhookRedirectFollowedByTheTransportIsNotASuccess gives the consumer a
// client whose transport follows a redirect with a GET: the 200 it answers
// is for another request than the POST, so the delivery must fail.
func TestWebhookRedirectFollowedByTheTransportIsNotASuccess(t *testing.T) {
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Method + " " + r.URL.Path
		if r.URL.Path == "/hook" {
			http.Redirect(w, r, "/final?token=t0ken-value", http.StatusFound)
		}
	}))
	defer srv.Close()
	consume, err := webhook.New(srv.URL+"/hook", webhook.WithClient(&http.Client{Transport: followingTransport{}}))
	require.NoError(t, err)
	err = consume(context.Background(), &tinymq.Msg{Data: 1})
	require.Error(t, err, "a 200 to a GET elsewhere is not a delivery")
	assert.Contains(t, err.Error(), "GET "+srv.URL+"/final?token=xxxxx")
	assert.NotContains(t, err.Error(), "t0ken-value")
	assert.Equal(t, "POST /hook", <-got)
	assert.Equal(t, "GET /final", <-got)
}

// replayTransport answers every request 200, with resp.Request a GET of the
// same URL: an answer to another request than the POST.
type replayTransport struct{}

func (replayTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	get, err := http.NewRequestWithContext(req.Context(), http.MethodGet, req.URL.String(), nil)
	if err != nil {
		return nil, err
	}
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Body: io.NopCloser(strings.NewReader("ok")),
		Header: http.Header{}, Request: get, ProtoMajor: 1, ProtoMinor: 1}, nil
}

// TestWebhookResponseToAnotherRequestIsNotASuccess gives the consumer a
// transport whose 200 answers a GET of the endpoint itself: the URL is the
// endpoint's, the method is not the POST, so it is not a delivery.
func TestWebhookResponseToAnotherRequestIsNotASuccess(t *testing.T) {
	consume, err := webhook.New("http://127.0.0.1:1/hook", webhook.WithClient(&http.Client{Transport: replayTransport{}}))
	require.NoError(t, err)
	err = consume(context.Background(), &tinymq.Msg{Data: 1})
	require.Error(t, err, "a 200 answering a GET (not the POST to the endpoint) is not a delivery")
	assert.Contains(t, err.Error(), "GET http://127.0.0.1:1/hook")
}

// TestWebhookErrorsNeverShowTheEndpointPassword fails deliveries in every way
// (a status, one whose body echoes the request, redirects carrying the
// secrets, a refused connection, a timeout) to an endpoint with a password
// and query tokens: none may appear in the returned error however formatted,
// its chain, a StatusError's fields, the MQ's log, a dead letter or
// RecentDeadLetters.
func TestWebhookErrorsNeverShowTheEndpointPassword(t *testing.T) {
	const password, token, token2 = "s3cret-pw/x", "t0ken-value", "second-query-secret"
	secrets := []string{password, url.PathEscape(password), url.QueryEscape(password), token, token2}
	noSecret := func(t *testing.T, what, text string) {
		t.Helper()
		for _, s := range secrets {
			assert.NotContains(t, text, s, what)
		}
	}
	withSecrets := func(base string) string {
		u, err := url.Parse(base)
		require.NoError(t, err)
		u.User = url.UserPassword("user", password)
		u.Path = "/hook"
		u.RawQuery = "token=" + token + "&x=" + token2 + "&plain"
		return u.String()
	}

	release := make(chan struct{}) // ends a hanging request, should its context not
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server sees the client go
		switch r.URL.Query().Get("case") {
		case "hang":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case "redirect":
			http.Redirect(w, r, withSecrets("http://"+r.Host)+"&case=elsewhere", http.StatusFound)
		case "redirect elsewhere":
			elsewhere := &url.URL{Scheme: "http", User: url.UserPassword("user", password), Host: "example.invalid", Path: "/x",
				RawQuery: "token=" + token}
			http.Redirect(w, r, elsewhere.String(), http.StatusTemporaryRedirect)
		case "unparseable redirect": // net/http quotes the Location it cannot parse
			w.Header().Set("Location", "http://user:"+password+"/x@example.invalid/x?token="+token+"%zz")
			w.WriteHeader(http.StatusFound)
		case "echo": // everything the request carried, secrets included
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "bad: %s %s auth=%s q=%s", r.Method, r.URL, r.Header.Get("Authorization"), r.URL.RawQuery)
		default:
			http.Error(w, "broken", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	defer close(release)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedURL := "http://" + closed.Addr().String()
	require.NoError(t, closed.Close())

	for _, tc := range []struct {
		name, endpoint string
		want           string // in the error text
	}{
		{"status", withSecrets(srv.URL), "status 500: broken"},
		{"redirect", withSecrets(srv.URL) + "&case=redirect", "status 302"},
		{"redirect to another host", withSecrets(srv.URL) + "&case=redirect+elsewhere", "status 307"},
		{"redirect to a Location that does not parse", withSecrets(srv.URL) + "&case=unparseable+redirect", "Location"},
		{"status whose body echoes the request", withSecrets(srv.URL) + "&case=echo", "status 500: bad: POST"},
		{"connection refused", withSecrets(closedURL), "connection refused"},
		{"timeout", withSecrets(srv.URL) + "&case=hang", "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			consume, err := webhook.New(tc.endpoint, webhook.WithTimeout(100*time.Millisecond))
			require.NoError(t, err)
			err = consume(context.Background(), &tinymq.Msg{Data: 1})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "user:xxxxx@", "the error still names the endpoint")
			noSecret(t, "error", err.Error())
			noSecret(t, "error formatted with %+v and %#v", fmt.Sprintf("%+v %#v", err, err))
			for e := err; e != nil; e = errors.Unwrap(e) {
				noSecret(t, fmt.Sprintf("wrapped %T", e), e.Error())
			}
			var ue *url.Error
			if errors.As(err, &ue) {
				noSecret(t, "url.Error.URL", ue.URL)
			}
			var se *webhook.StatusError
			if errors.As(err, &se) {
				noSecret(t, "StatusError.URL", se.URL)
				noSecret(t, "StatusError.Location", se.Location)
				noSecret(t, "StatusError.Body", se.Body)
				assert.Contains(t, se.URL, "user:xxxxx@")
			}
			if tc.name == "timeout" {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}
		})
	}

	t.Run("invalid endpoint", func(t *testing.T) {
		for _, bad := range []string{
			"ftp://user:" + url.PathEscape(password) + "@host/?token=" + token,
			"http://user:" + url.PathEscape(password) + "@/?token=" + token,
			"http://user:" + password + "@host:port/?token=" + token,
			"http://user:" + password + "/?token=" + token,
		} {
			_, err := webhook.New(bad)
			require.ErrorIs(t, err, tinymq.ErrInvalidOption, bad)
			noSecret(t, "New's error", err.Error())
		}
	})

	t.Run("log and dead letter", func(t *testing.T) {
		consume, err := webhook.New(withSecrets(srv.URL))
		require.NoError(t, err)
		log, records := logRecords()
		m := tinymq.New(tinymq.WithLogger(log))
		require.NoError(t, m.RegisterQueue("users", tinymq.Fanout, consume, 1, tinymq.WithQueueName("hook"),
			tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
			tinymq.WithDeadLetter("users.dead", "")))
		deaths := make(chan []tinymq.Death, 1)
		require.NoError(t, m.RegisterQueue("users.dead", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
			deaths <- msg.Deaths
			return nil
		}, 1, tinymq.WithQueueName("dead")))
		require.NoError(t, m.Start(context.Background()))
		require.NoError(t, m.Publish("users", 1))
		var got []tinymq.Death
		select {
		case got = <-deaths:
		case <-time.After(10 * time.Second):
			t.Fatal("no dead letter")
		}
		m.Stop()
		require.Len(t, got, 1)
		assert.Contains(t, got[0].LastError, "status 500")
		noSecret(t, "dead letter", got[0].LastError)
		recent := m.RecentDeadLetters()
		require.NotEmpty(t, recent)
		for _, dl := range recent {
			noSecret(t, "RecentDeadLetters", fmt.Sprintf("%+v", dl))
		}
		recs := records(t)
		require.NotEmpty(t, recs)
		for _, rec := range recs {
			b, err := json.Marshal(rec)
			require.NoError(t, err)
			noSecret(t, "log record", string(b))
		}
	})
}

// The endpoint's userinfo travels as an Authorization: Basic header, which an
// endpoint may echo in its answer: its base64 is a secret too.
func TestWebhookErrorsNeverShowTheBasicAuthHeader(t *testing.T) {
	const pass = "hunter2pass"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, "denied; you sent Authorization: %s", r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	consume, err := webhook.New("http://admin:" + pass + "@" + u.Host + "/hook")
	require.NoError(t, err)
	err = consume(context.Background(), &tinymq.Msg{Data: 1})
	require.Error(t, err)
	encoded := base64.StdEncoding.EncodeToString([]byte("admin:" + pass))
	assert.NotContains(t, err.Error(), encoded)
	var se *webhook.StatusError
	require.ErrorAs(t, err, &se)
	assert.NotContains(t, se.Body, encoded)
	assert.Contains(t, se.Body, "Basic xxxxx", "the echo is still shown, the credential hidden")
}

// An endpoint's secrets in other forms: a password that needs escaping (the
// URL holds a form other than its bytes), a username that is a token with no
// password, an escaped query value and a repeated query parameter, all echoed
// back by the endpoint in both forms.
func TestWebhookErrorsNeverShowAUsernameTokenOrEscapedSecrets(t *testing.T) {
	const rawPass = "p@ss/w rd!#secret"
	const userToken = "ghp_usertoken99"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pw, _ := r.BasicAuth()
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, "user=%s pass=%s uri=%s", user, pw, r.RequestURI)
	}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		endpoint string
		secrets  []string
	}{
		{"escaped password", "http://" + url.UserPassword("bob", rawPass).String() + "@" + u.Host + "/h",
			[]string{rawPass, url.PathEscape(rawPass), url.QueryEscape(rawPass)}},
		{"username token", "http://" + userToken + "@" + u.Host + "/h", []string{userToken}},
		{"escaped query value", "http://" + u.Host + "/h?k=" + url.QueryEscape(rawPass), []string{rawPass, url.QueryEscape(rawPass)}},
		{"repeated query parameter", "http://" + u.Host + "/h?api_key=" + userToken + "&api_key=" + userToken + "x", []string{userToken}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			consume, err := webhook.New(tc.endpoint)
			require.NoError(t, err)
			err = consume(context.Background(), &tinymq.Msg{Data: 1})
			require.Error(t, err)
			var se *webhook.StatusError
			require.ErrorAs(t, err, &se)
			text := strings.Join([]string{err.Error(), se.URL, se.Location, se.Body}, "\n")
			for _, s := range tc.secrets {
				assert.NotContains(t, text, s, "secret form %q shown in:\n%s", s, text)
			}
		})
	}
}
