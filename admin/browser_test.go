//go:build linux

package admin_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
		assert.Contains(t, dom, `<button class="qname" type="button" title="`+name+`">`+name+`</button>`, "queue %s", name)
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
		screenshot(t, bin)
	}
}

// screenshot saves testdata/screenshot.png: the page over a new shop with
// actions on, after a few steps of history, with the charge queue's panel
// open.
func screenshot(t *testing.T, bin string) {
	mq := shop(t)
	path, err := filepath.Abs(filepath.Join("testdata", "screenshot.png"))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	url := serve(t, mq, admin.WithActions(), admin.WithRateWindow(time.Second))
	b := startCDP(t, bin, "--window-size=1280,1000")
	b.navigate(url)
	waitLive(b)
	b.click(`tr[data-queue="charge"] button.qname`)
	b.waitJS("the panel", `!document.getElementById("actions").hidden`)
	// Four points of the totals' history (one per 5-second step, the page
	// polling every second): the sparklines have lines.
	b.waitJSWithin("four points of history", `document.querySelector("#spark-rate svg path").getAttribute("d").split("L").length >= 4`,
		30*time.Second)
	b.eval(`window.scrollTo(0, 0)`)
	var shot struct {
		Data []byte `json:"data"`
	}
	b.call("Page.captureScreenshot", map[string]any{"format": "png"}, &shot)
	require.NoError(t, os.WriteFile(path, shot.Data, 0o644))
	assert.Greater(t, len(shot.Data), 10_000)
	t.Logf("screenshot saved to %s", path)
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
	assert.Contains(t, dom, `&lt;script&gt;document.title='pwned'&lt;/script&gt;</button>`, "the name, as text")
	assert.Contains(t, dom, `&lt;b id=injected&gt;bold&lt;/b&gt;</td>`)
	assert.Contains(t, dom, `&lt;img src=x onerror="document.title='pwned'"&gt;`)
}

func TestBrowserShowsHostilePayloadsAsText(t *testing.T) {
	bin := chromium(t)
	const (
		script = `<script>document.title='pwned'</script>`
		img    = `<img id=injected src=x onerror="document.title='pwned'">`
	)
	mq := tinymq.New()
	require.NoError(t, mq.DeclareQueue(script, img, tinymq.Fanout))
	require.NoError(t, mq.Publish(img, img+script, tinymq.WithHeaders(map[string]any{img: script})))
	t.Cleanup(mq.Stop)
	url := serve(t, mq, admin.WithActions(), admin.WithPayloads())

	b := startCDP(t, bin)
	b.navigate(url)
	waitLive(b)
	b.click(`tr[data-queue=` + jsString(script) + `] button.qname`)
	b.waitJS("the panel", `!document.getElementById("actions").hidden`)
	b.click("#act-peek")
	b.waitJS("the peeked message", `document.querySelector("#peek-table pre.payload")`)
	assert.Equal(t, img+script, b.text("#peek-table pre.payload"), "the payload, as text")
	assert.Contains(t, b.text("#peek-table tbody"), img+"=\""+script, "the headers, as text")
	assert.Equal(t, "TinyMQ admin", b.eval(`document.title`), "no injected script ran")
	assert.Equal(t, false, b.eval(`!!document.getElementById("injected")`), "no injected element")
	assert.Equal(t, 1, mq.Stats().Queues[script].Depth, "peek changed nothing")
}

// cdp drives one headless Chromium over the DevTools protocol on a pipe
// (--remote-debugging-pipe: commands on its fd 3, answers and events on
// its fd 4, each a JSON text ended by a NUL), so that a test can click and
// read the page as a user would. Only the standard library: no WebSocket.
type cdp struct {
	t       *testing.T
	w       *os.File
	msgs    chan cdpMessage
	quit    chan struct{}
	id      int
	session string
}

type cdpMessage struct {
	ID     int             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// startCDP starts Chromium with extra flags and a blank tab, attached. It is
// killed, with its helper processes, when the test ends.
func startCDP(t *testing.T, bin string, flags ...string) *cdp {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	require.NoError(t, err)
	resR, resW, err := os.Pipe()
	require.NoError(t, err)
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--remote-debugging-pipe", "--window-size=1400,1000",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-default-apps",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-domain-reliability", "--disable-client-side-phishing-detection", "--disable-breakpad",
		"--metrics-recording-only", "--no-pings", "--mute-audio", "--password-store=basic",
		"--no-proxy-server",
	}, flags...)
	cmd := exec.Command(bin, append(args, "about:blank")...)
	cmd.ExtraFiles = []*os.File{cmdR, resW} // fds 3 and 4
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	_ = cmdR.Close()
	_ = resW.Close()
	c := &cdp{t: t, w: cmdW, msgs: make(chan cdpMessage, 64), quit: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		rd := bufio.NewReader(resR)
		for {
			line, err := rd.ReadBytes(0)
			if err != nil {
				return
			}
			var m cdpMessage
			if json.Unmarshal(line[:len(line)-1], &m) != nil || m.ID == 0 {
				continue // an event
			}
			select {
			case c.msgs <- m:
			case <-c.quit:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(c.quit)
		_ = cmdW.Close()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		_ = resR.Close()
		<-read
		if t.Failed() {
			t.Logf("chromium's stderr:\n%s", tail(stderr.String()))
		}
	})

	var target struct {
		TargetID string `json:"targetId"`
	}
	c.call("Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	c.call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	c.session = attached.SessionID
	return c
}

// call sends one command (to the attached tab, once there is one) and
// decodes its result into out, within browserTimeout.
func (c *cdp) call(method string, params, out any) {
	c.t.Helper()
	c.id++
	msg := map[string]any{"id": c.id, "method": method, "params": params}
	if c.session != "" {
		msg["sessionId"] = c.session
	}
	b, err := json.Marshal(msg)
	require.NoError(c.t, err)
	_, err = c.w.Write(append(b, 0))
	require.NoError(c.t, err, method)
	deadline := time.NewTimer(browserTimeout)
	defer deadline.Stop()
	for {
		select {
		case m := <-c.msgs:
			if m.ID != c.id {
				continue
			}
			require.Nil(c.t, m.Error, "%s: %+v", method, m.Error)
			if out != nil {
				require.NoError(c.t, json.Unmarshal(m.Result, out), method)
			}
			return
		case <-deadline.C:
			c.t.Fatalf("chromium did not answer %s within %v", method, browserTimeout)
		}
	}
}

func (c *cdp) navigate(url string) {
	c.t.Helper()
	c.call("Page.navigate", map[string]any{"url": url}, nil)
}

// eval evaluates a JavaScript expression in the page (awaiting a promise)
// and returns its value.
func (c *cdp) eval(expr string) any {
	c.t.Helper()
	var res struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	c.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if res.ExceptionDetails != nil {
		c.t.Fatalf("%s: %s %s", expr, res.ExceptionDetails.Text, res.ExceptionDetails.Exception.Description)
	}
	return res.Result.Value
}

// text returns the text of the element that selector picks, or "".
func (c *cdp) text(selector string) string {
	c.t.Helper()
	s, _ := c.eval(`(function () { var e = document.querySelector(` + jsString(selector) + `);
		return e ? e.textContent : ""; })()`).(string)
	return s
}

// waitJS waits, for at most 10s, until expr is true in the page.
func (c *cdp) waitJS(what, expr string) {
	c.t.Helper()
	c.waitJSWithin(what, expr, 10*time.Second)
}

// waitJSWithin waits, for at most d, until expr is true in the page.
func (c *cdp) waitJSWithin(what, expr string, d time.Duration) {
	c.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if v, _ := c.eval(`(function () { try { return !!(` + expr + `); } catch (e) { return false; } })()`).(bool); v {
			return
		}
		select {
		case <-deadline.C:
			c.t.Fatalf("timed out waiting for %s (%s); the page says: %.2000s", what, expr,
				c.eval(`document.body ? document.body.innerText : ""`))
		case <-tick.C:
		}
	}
}

// click clicks the middle of the element that selector picks, with the
// mouse, as a user does.
func (c *cdp) click(selector string) {
	c.t.Helper()
	c.waitJS("something to click at "+selector, `(function () { var e = document.querySelector(`+jsString(selector)+`);
		return e && !e.disabled && e.offsetParent !== null; })()`)
	pos, ok := c.eval(`(function () { var e = document.querySelector(` + jsString(selector) + `);
		e.scrollIntoView({ block: "center" }); var r = e.getBoundingClientRect();
		return [r.left + r.width / 2, r.top + r.height / 2]; })()`).([]any)
	require.True(c.t, ok && len(pos) == 2, "position of %s", selector)
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		c.call("Input.dispatchMouseEvent", map[string]any{"type": typ, "x": pos[0], "y": pos[1], "button": "left",
			"clickCount": 1}, nil)
	}
}

// jsString quotes s as a JavaScript (and CSS) string literal: JSON without
// the HTML escapes, which a CSS selector would not decode.
func jsString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// depthOf is the expression of the depth that the queue table shows for
// queue.
func depthOf(queue string) string {
	return `document.querySelector('tr[data-queue=` + jsString(queue) + `] td.depth').firstChild.textContent`
}

func waitLive(b *cdp) {
	b.t.Helper()
	b.waitJS("the page is live", `document.getElementById("status").textContent === "live"`)
}

func TestBrowserPurgeDropsTheDepth(t *testing.T) {
	bin := chromium(t)
	mq := parked(t, 25)
	url := serve(t, mq, admin.WithActions())
	b := startCDP(t, bin)
	b.navigate(url)
	waitLive(b)
	b.waitJS("25 waiting in parked", depthOf("parked")+` === "25"`)

	b.click(`tr[data-queue="parked"] button.qname`)
	b.waitJS("the queue's panel with its actions", `!document.getElementById("actions").hidden`)
	b.click("#act-purge")
	b.waitJS("the purge armed", `document.getElementById("act-purge").classList.contains("armed")`)
	assert.Equal(t, "purge 25 waiting?", b.text("#act-purge"), "the first click asks")
	assert.Equal(t, 25, mq.Stats().Queues["parked"].Depth, "and purges nothing")
	b.click("#act-purge")
	b.waitJS("the purge's result", `document.getElementById("action-result").textContent === "purged 25 messages"`)
	b.waitJS("the depth drop to 0", depthOf("parked")+` === "0"`)
	assert.Equal(t, "0", b.text("#panel-depth"))
	st := mq.Stats().Queues["parked"]
	assert.Zero(t, st.Depth)
	assert.Equal(t, uint64(25), st.Purged)
}

func TestBrowserReplayBringsDeadLettersBack(t *testing.T) {
	bin := chromium(t)
	var fail atomic.Bool
	fail.Store(true)
	mq := deadLettering(t, &fail)
	for i := range 6 {
		require.NoError(t, mq.Publish("jobs", i, tinymq.WithRoutingKey("job")))
	}
	waitFor(t, "six dead letters parked", func() bool { return mq.Stats().Queues["parking"].Depth == 6 })
	url := serve(t, mq, admin.WithActions())
	b := startCDP(t, bin)
	b.navigate(url)
	waitLive(b)
	b.waitJS("six parked", depthOf("parking")+` === "6"`)
	b.waitJS("the dead letters' real total", `document.getElementById("dead-total").getAttribute("data-value") === "6"`)

	// Pause work, so that the replayed messages stay to be seen.
	b.click(`tr[data-queue="work"] button.qname`)
	b.waitJS("work's panel", `document.getElementById("panel-name").textContent === "work"`)
	b.click("#act-pause")
	b.waitJS("work paused", `!document.getElementById("act-resume").hidden`)
	assert.True(t, mq.Topology().Queues[0].Paused)
	fail.Store(false) // the bug is fixed

	b.click(`tr[data-queue="parking"] button.qname`)
	b.waitJS("parking's panel", `document.getElementById("panel-name").textContent === "parking"`)
	b.eval(`document.getElementById("replay-n").value = "6"`)
	b.click("#act-replay")
	b.waitJS("the replay's result", `document.getElementById("action-result").textContent === "replayed 6 messages"`)
	b.waitJS("the messages back in work", depthOf("work")+` === "6"`)
	b.waitJS("parking empty", depthOf("parking")+` === "0"`)
	st := mq.Stats().Queues
	assert.Equal(t, 6, st["work"].Depth)
	assert.Equal(t, uint64(6), st["parking"].Replayed)

	b.click(`tr[data-queue="work"] button.qname`)
	b.waitJS("work's panel", `document.getElementById("panel-name").textContent === "work"`)
	b.click("#act-resume")
	b.waitJS("work drained", depthOf("work")+` === "0"`)
	waitFor(t, "the replayed messages delivered", func() bool { return mq.Stats().Queues["work"].Succeeded == 6 })
}

// serveHandler serves h under /debug/tinymq/ on 127.0.0.1, recording the
// status of every POST, and returns the page's URL.
func serveHandler(t *testing.T, h http.Handler, posts chan<- int) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		if r.Method == http.MethodPost {
			select {
			case posts <- rec.code:
			default:
				t.Errorf("too many POSTs")
			}
		}
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/debug/tinymq/"
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func TestBrowserRefusesAForgedCrossSitePost(t *testing.T) {
	bin := chromium(t)
	mq := parked(t, 5)
	posts := make(chan int, 10)
	adminURL := serveHandler(t, admin.Handler(mq, admin.WithActions()), posts)
	target := adminURL + "api/purge?queue=parked"

	// Another site's page: a fetch that cannot carry the token, then a form
	// that the browser posts with the user's cookies, if there were any.
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!DOCTYPE html><title>cute cats</title>
<form method="post" action="%[1]s"><input name="queue" value="parked"></form>
<script>
fetch(%[2]s, { method: "POST", mode: "no-cors", headers: { "X-TinyMQ-Token": "guess" } })
  .catch(function () {}).then(function () { document.forms[0].submit(); });
</script>`, html.EscapeString(target), jsString(target))
	}))
	t.Cleanup(attacker.Close)
	_, port, err := net.SplitHostPort(attacker.Listener.Addr().String())
	require.NoError(t, err)

	b := startCDP(t, bin, "--host-resolver-rules=MAP attacker.test 127.0.0.1")
	b.navigate("http://attacker.test:" + port + "/")
	b.waitJS("the form's answer", `location.href.indexOf("/api/purge") > 0 && document.body &&
		document.body.textContent.indexOf("forbidden") >= 0`)
	assert.Contains(t, b.eval(`document.body.textContent`), "cross-origin", "refused for its origin")
	for range 2 {
		select {
		case code := <-posts:
			assert.Equal(t, http.StatusForbidden, code)
		case <-time.After(browserTimeout):
			t.Fatal("the forged POSTs did not arrive")
		}
	}
	assert.Equal(t, 5, mq.Stats().Queues["parked"].Depth, "nothing was purged")
	assert.Zero(t, mq.Stats().Queues["parked"].Purged)
}

func TestBrowserRefusesAForeignHost(t *testing.T) {
	bin := chromium(t)
	mq := parked(t, 5)
	url := serve(t, mq, admin.WithActions())
	_, port, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimSuffix(url, "/debug/tinymq/"), "http://"))
	require.NoError(t, err)

	// A name that the attacker re-pointed at this machine (DNS rebinding):
	// the page is its origin's, so its script could read and post freely,
	// but the Host is not one the handler answers.
	b := startCDP(t, bin, "--host-resolver-rules=MAP rebound.test 127.0.0.1")
	b.navigate("http://rebound.test:" + port + "/debug/tinymq/")
	b.waitJS("the answer", `document.readyState === "complete" && document.body &&
		document.body.textContent.indexOf("forbidden") >= 0`)
	page, _ := b.eval(`document.documentElement.outerHTML`).(string)
	assert.Contains(t, page, "does not answer to that Host")
	assert.NotContains(t, page, "tinymq-token", "no token")
	assert.NotContains(t, page, "parked", "nothing of the MQ")
	assert.Equal(t, 403.0, b.eval(`fetch("api/overview").then(function (r) { return r.status; })`), "GET refused")
	assert.Equal(t, 403.0, b.eval(`fetch("api/purge?queue=parked", { method: "POST" }).then(function (r) { return r.status; })`),
		"POST refused")
	assert.Equal(t, 5, mq.Stats().Queues["parked"].Depth, "nothing was purged")

	// The same browser at 127.0.0.1 is served.
	b.navigate(url)
	waitLive(b)
	b.waitJS("parked", depthOf("parked")+` === "5"`)
}

// The page shows a queue's job-queue settings and counts in its panel (the
// delivery timeout, rate limit, group ordering and payload type; the calls
// abandoned and the deliveries timed out) and an exchange's deduplication
// window and duplicates in the exchanges' table.
func TestBrowserShowsJobQueueSettingsAndCounters(t *testing.T) {
	bin := chromium(t)
	release := make(chan struct{})
	mq := tinymq.New()
	require.NoError(t, mq.DeclareExchange("billing", tinymq.Direct, tinymq.WithDeduplication(time.Minute)))
	// The consumer ignores its context until release is closed.
	require.NoError(t, tinymq.RegisterHandler(mq, "billing", tinymq.Direct, func(context.Context, invoice) error {
		<-release
		return nil
	}, 2, tinymq.WithQueueName("charge"), tinymq.WithBindingKey("invoice"),
		tinymq.WithDeliveryTimeout(50*time.Millisecond), tinymq.WithRateLimit(20, 3), tinymq.WithGroupOrdering(),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Hour})))
	require.NoError(t, mq.Start(context.Background()))
	t.Cleanup(func() {
		close(release)
		waitFor(t, "the abandoned call to return", func() bool { return mq.Stats().Queues["charge"].Abandoned == 0 })
		// The retry waits an hour: a Shutdown whose deadline has passed
		// drops it.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, mq.Shutdown(ctx), context.Canceled)
		mq.Stop()
	})
	for range 3 {
		require.NoError(t, mq.Publish("billing", invoice{7}, tinymq.WithRoutingKey("invoice"),
			tinymq.WithDeduplicationID("invoice-7"), tinymq.WithMessageGroup("customer-1")))
	}
	waitFor(t, "the call timed out and abandoned", func() bool {
		st := mq.Stats().Queues["charge"]
		return st.TimedOut == 1 && st.Abandoned == 1
	})
	url := serve(t, mq)

	b := startCDP(t, bin)
	b.navigate(url)
	waitLive(b)
	b.waitJS("the billing exchange", `document.querySelector('tr[data-exchange="billing"] td.dups')`)
	assert.Equal(t, "direct \u00b7 dedup 60s", b.text(`tr[data-exchange="billing"] td.kind`))
	assert.Equal(t, "2", b.text(`tr[data-exchange="billing"] td.dups`), "two publishes deduplicated")
	assert.Equal(t, "1", b.text(`tr[data-exchange="billing"] td:nth-child(4)`), "one published")

	b.click(`tr[data-queue="charge"] button.qname`)
	b.waitJS("charge's panel", `document.getElementById("panel-name").textContent === "charge" &&
		!document.getElementById("panel-body").hidden`)
	settings := b.text("#panel-settings")
	for _, want := range []string{"2 workers", "2 attempts", "timeout 50ms", "rate 20/s, burst 3", "ordered by group",
		"takes admin_test.invoice"} {
		assert.Contains(t, settings, want, "the panel's settings")
	}
	counts := b.text("#panel-counts")
	for _, want := range []string{"0 in flight, 1 abandoned", "accepted 1,", "timed out 1"} {
		assert.Contains(t, counts, want, "the panel's counts")
	}
	assert.Contains(t, b.text(`tr[data-queue="charge"] .settings`), "timeout 50ms", "the settings in the queues' table too")
}
