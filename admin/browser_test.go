//go:build linux

package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

// The browser tests load the page in Debian's headless Chromium, which
// admin/install-chromium.sh installs. Without it they fail when CI is set,
// and are skipped otherwise. Every Chromium run is bounded by browserTimeout
// and runs in its own process group, which is killed when the time is up.

const browserTimeout = 20 * time.Second

// chromium returns the path of the chromium binary, or ends the test.
func chromium(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chromium is not installed (%v): run admin/install-chromium.sh before the tests", err)
		}
		t.Skipf("chromium is not installed (%v): run admin/install-chromium.sh to run the browser tests", err)
	}
	return bin
}

// runChromium runs headless Chromium on url with extra flags and returns
// its standard output.
func runChromium(t *testing.T, bin, url string, flags ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), browserTimeout)
	defer cancel()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(),
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-default-apps",
		// Keep Chromium off the network but for the test server.
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-domain-reliability", "--disable-client-side-phishing-detection", "--disable-breakpad",
		"--metrics-recording-only", "--no-pings", "--mute-audio", "--password-store=basic",
		"--hide-scrollbars",
		// Let the page's timers run: it fetches the JSON at load and then
		// every refresh.
		"--virtual-time-budget=2000",
	}, flags...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The whole group: Chromium's own helper processes too.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("chromium did not finish within %v and was killed; stderr:\n%s", browserTimeout, tail(stderr.String()))
	}
	require.NoError(t, err, "chromium failed; stderr:\n%s", tail(stderr.String()))
	t.Logf("chromium %s took %v", strings.Join(flags, " "), time.Since(start).Round(time.Millisecond))
	return stdout.Bytes()
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

// shop is an MQ with a few exchanges and queues, one of which fails and
// dead-letters, and a publisher that keeps publishing slowly (every 5ms, at
// most 4000 rounds) until the test ends.
func shop(t *testing.T) *tinymq.MQ {
	t.Helper()
	mq := tinymq.New()
	work := func(d time.Duration) tinymq.ConsumerFunc {
		return func(ctx context.Context, _ *tinymq.Msg) error {
			tm := time.NewTimer(d)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-ctx.Done():
			}
			return nil
		}
	}
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Topic, work(time.Millisecond), 2,
		tinymq.WithQueueName("billing"), tinymq.WithBindingKey("order.*.created")))
	require.NoError(t, mq.RegisterQueue("orders", tinymq.Topic, work(3*time.Millisecond), 1,
		tinymq.WithQueueName("shipping"), tinymq.WithBindingKey("order.#")))
	require.NoError(t, mq.RegisterQueue("payments.dead", tinymq.Fanout, work(0), 1,
		tinymq.WithQueueName("payments-dead")))
	require.NoError(t, mq.RegisterQueue("payments", tinymq.Fanout, func(_ context.Context, msg *tinymq.Msg) error {
		if id := msg.Data.(int); id%5 == 0 {
			return fmt.Errorf("order %d: card declined", id)
		}
		return nil
	}, 2, tinymq.WithQueueName("charge"), tinymq.WithDeadLetter("payments.dead", ""),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 3, InitialBackoff: 20 * time.Millisecond})))
	require.NoError(t, mq.DeclareExchange("notifications", tinymq.Headers, tinymq.WithAlternateExchange("unrouted")))
	require.NoError(t, mq.RegisterQueue("unrouted", tinymq.Fanout, work(0), 1, tinymq.WithQueueName("unrouted-log")))
	require.NoError(t, mq.RegisterQueue("notifications", tinymq.Headers, work(2*time.Millisecond), 1,
		tinymq.WithQueueName("email"), tinymq.WithBindingArgs(map[string]any{"x-match": "any", "channel": "email"})))
	require.NoError(t, mq.Start(context.Background()))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for id := 1; id <= 4000; id++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			key, channel := "order.eu.created", "email"
			if id%3 == 0 {
				key = "order.eu.shipped"
			}
			if id%4 == 0 {
				channel = "sms"
			}
			for _, err := range []error{
				mq.Publish("orders", id, tinymq.WithRoutingKey(key)),
				mq.Publish("payments", id),
				mq.Publish("notifications", id, tinymq.WithHeaders(map[string]any{"channel": channel})),
			} {
				if err != nil && !errors.Is(err, tinymq.ErrStopped) {
					t.Errorf("publish: %v", err)
				}
			}
		}
	})
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		mq.Stop()
	})
	return mq
}

// serve serves the admin handler for mq under /debug/tinymq/ on 127.0.0.1
// and returns the page's URL.
func serve(t *testing.T, mq *tinymq.MQ, opts ...admin.Option) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", admin.Handler(mq, opts...)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/debug/tinymq/"
}

// primeRates requests the JSON until it has rates, so that the page shows
// them from its first load.
func primeRates(t *testing.T, url string) {
	t.Helper()
	waitFor(t, "rates in the JSON", func() bool {
		res, err := http.Get(url + "api/overview")
		require.NoError(t, err)
		defer res.Body.Close()
		var ov Overview
		require.NoError(t, json.NewDecoder(res.Body).Decode(&ov))
		return ov.RateSeconds != nil
	})
}

var publishedRE = regexp.MustCompile(`id="total-published" data-value="(\d+)"`)

func TestBrowserShowsLiveQueues(t *testing.T) {
	bin := chromium(t)
	mq := shop(t)
	url := serve(t, mq, admin.WithRateWindow(time.Second))
	primeRates(t, url)

	dom := string(runChromium(t, bin, url, "--dump-dom"))
	assert.Contains(t, dom, `<span id="status" class="status ok">live</span>`, "the JSON loaded")
	for _, name := range []string{"billing", "shipping", "charge", "payments-dead", "unrouted-log", "email"} {
		assert.Contains(t, dom, `<div class="qname" title="`+name+`">`+name+`</div>`, "queue %s", name)
	}
	for _, name := range []string{"orders", "payments", "notifications", "payments.dead", "unrouted"} {
		assert.Contains(t, dom, `<td class="name" title="`+name+`">`+name+`</td>`, "exchange %s", name)
	}
	assert.Contains(t, dom, "card declined", "recent dead letters")
	assert.Contains(t, dom, "rates over the last")
	assert.NotContains(t, dom, `id="total-rate">–<`, "a rate is shown")

	m := publishedRE.FindStringSubmatch(dom)
	require.NotNil(t, m, "total published in the DOM")
	first, err := strconv.ParseUint(m[1], 10, 64)
	require.NoError(t, err)
	require.Positive(t, first)

	waitFor(t, "more messages published", func() bool {
		return mq.Stats().Exchanges["orders"].Published*3 > first+3
	})
	dom = string(runChromium(t, bin, url, "--dump-dom"))
	m = publishedRE.FindStringSubmatch(dom)
	require.NotNil(t, m, "total published in the DOM")
	second, err := strconv.ParseUint(m[1], 10, 64)
	require.NoError(t, err)
	assert.Greater(t, second, first, "the numbers move between two loads")

	if os.Getenv("TINYMQ_SCREENSHOT") != "" {
		path, err := filepath.Abs(filepath.Join("testdata", "screenshot.png"))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		runChromium(t, bin, url, "--screenshot="+path, "--window-size=1280,900")
		info, err := os.Stat(path)
		require.NoError(t, err)
		assert.Greater(t, info.Size(), int64(10_000))
		t.Logf("screenshot saved to %s", path)
	}
}

func TestBrowserEscapesHostileNames(t *testing.T) {
	bin := chromium(t)
	const (
		script = `<script>document.title='pwned'</script>`
		img    = `<img src=x onerror="document.title='pwned'">`
		tag    = `<b id=injected>bold</b>`
	)
	mq := tinymq.New()
	require.NoError(t, mq.RegisterQueue(tag, tinymq.Direct, nop, 1, tinymq.WithQueueName(script),
		tinymq.WithBindingKey(img)))
	require.NoError(t, mq.RegisterQueue(tag, tinymq.Direct, func(context.Context, *tinymq.Msg) error {
		return errors.New(img)
	}, 1, tinymq.WithQueueName(img), tinymq.WithBindingKey(tag)))
	require.NoError(t, mq.Start(context.Background()))
	require.NoError(t, mq.Publish(tag, 1, tinymq.WithRoutingKey(tag)))
	mq.Stop() // the failure is now a recent dead letter
	url := serve(t, mq)

	dom := string(runChromium(t, bin, url, "--dump-dom"))
	assert.Contains(t, dom, `<span id="status" class="status ok">live</span>`, "the JSON loaded")
	assert.Contains(t, dom, "<title>TinyMQ admin</title>", "no injected script ran")
	assert.NotContains(t, dom, "pwned</title>")
	assert.NotContains(t, dom, `id="injected"`, "no injected element")
	assert.Contains(t, dom, `&lt;script&gt;document.title='pwned'&lt;/script&gt;</div>`, "the name, as text")
	assert.Contains(t, dom, `&lt;b id=injected&gt;bold&lt;/b&gt;</td>`)
	assert.Contains(t, dom, `&lt;img src=x onerror="document.title='pwned'"&gt;`)
}
