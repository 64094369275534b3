package admin

import (
	"crypto/sha256"
	"encoding/base64"
)

// The page is static: it holds no data, so nothing in it needs escaping. Its
// script fetches api/overview (relative, so any mount prefix works) and puts
// every name into the DOM with textContent, never as HTML. The
// Content-Security-Policy allows exactly this script and this style, by hash,
// so that even an injected tag could not run.

const pageStyle = `
:root { color-scheme: light dark; --bg: #f6f7f9; --card: #fff; --fg: #1d2330; --muted: #6b7385;
  --line: #e3e6ec; --accent: #3b63d6; --bad: #c62f3c; --warn: #b7701b; --good: #1f8a4c; --bar: #cfd9f6; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #14171d; --card: #1c2029; --fg: #e4e7ee; --muted: #98a0b3; --line: #2c313d;
    --accent: #7d9cff; --bad: #ff6b78; --warn: #f0a848; --good: #4fcf86; --bar: #33406a; }
}
* { box-sizing: border-box; }
body { margin: 0; padding: 18px 22px 28px; background: var(--bg); color: var(--fg);
  font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { display: flex; align-items: baseline; gap: 14px; flex-wrap: wrap; margin-bottom: 14px; }
h1 { font-size: 20px; margin: 0; letter-spacing: -0.01em; }
h1 span { color: var(--muted); font-weight: 400; }
h2 { font-size: 14px; margin: 0 0 8px; }
h2 .count { color: var(--muted); font-weight: 400; margin-left: 4px; }
.status { font-weight: 600; padding: 1px 8px; border-radius: 999px; font-size: 12px; }
.status.ok { color: var(--good); background: color-mix(in srgb, var(--good) 12%, transparent); }
.status.bad { color: var(--bad); background: color-mix(in srgb, var(--bad) 12%, transparent); }
.muted { color: var(--muted); }
#summary { display: flex; gap: 10px; flex-wrap: wrap; margin: 0 0 14px; }
.tile { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 130px; }
.tile b { display: block; font-size: 20px; font-variant-numeric: tabular-nums; }
.tile span { color: var(--muted); font-size: 12px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; margin-bottom: 14px; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 5px 7px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; white-space: nowrap; }
th { color: var(--muted); font-weight: 500; font-size: 12px; white-space: normal; vertical-align: bottom; hyphens: manual; }
th.g, td.g { border-left: 1px solid var(--line); }
tbody tr:last-child td { border-bottom: 0; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
td.name { font-weight: 600; max-width: 280px; overflow: hidden; text-overflow: ellipsis; }
td.name .qname { overflow: hidden; text-overflow: ellipsis; }
td.name .settings { font-weight: 400; font-size: 11.5px; color: var(--muted); white-space: normal; }
td.wrap { white-space: normal; max-width: 420px; overflow-wrap: anywhere; }
td.bad { color: var(--bad); font-weight: 600; }
td.warn { color: var(--warn); }
.bar { height: 3px; background: var(--bar); border-radius: 2px; margin-top: 2px; }
.bar i { display: block; height: 3px; background: var(--accent); border-radius: 2px; }
.chip { display: inline-block; border: 1px solid var(--line); border-radius: 4px; padding: 0 5px; margin: 0 4px 2px 0; font-size: 12px; }
.key { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
.empty { color: var(--muted); padding: 6px 8px; }
.banner { border-radius: 8px; padding: 8px 12px; margin-bottom: 14px; }
.banner.bad { background: color-mix(in srgb, var(--bad) 14%, var(--card)); color: var(--bad); }
.banner.warn { background: color-mix(in srgb, var(--warn) 14%, var(--card)); color: var(--warn); }
footer { color: var(--muted); font-size: 12px; }
a { color: var(--accent); }
`

const pageScript = `
"use strict";
(function () {
  var $ = function (id) { return document.getElementById(id); };
  // el builds an element whose text is set with textContent: names are user
  // input and are never parsed as HTML.
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function num(n) { return typeof n === "number" && isFinite(n) ? n : 0; }
  function fmtInt(n) { return num(n).toLocaleString("en-US"); }
  function fmtRate(r) {
    if (r === null || r === undefined) return "\u2013";
    r = num(r);
    if (r === 0) return "0";
    if (r < 10) return r.toFixed(1);
    return Math.round(r).toLocaleString("en-US");
  }
  function fmtMs(ms) {
    ms = num(ms);
    if (ms < 1) return Math.round(ms * 1000) + "\u00b5s";
    if (ms < 1000) return (ms < 10 ? ms.toFixed(1) : Math.round(ms)) + "ms";
    return (ms / 1000).toFixed(ms < 10000 ? 2 : 0) + "s";
  }
  function fmtTime(t) {
    var d = new Date(t);
    return isNaN(d.getTime()) ? String(t || "") : d.toLocaleTimeString("en-GB");
  }
  function td(text, cls) { return el("td", cls, text); }
  // nTd and rTd make a number cell, of class hot when the number is not 0.
  function nTd(n, hot, cls) { return td(fmtInt(n), "n" + (cls ? " " + cls : "") + (hot && num(n) > 0 ? " " + hot : "")); }
  function rTd(r, hot, cls) { return td(fmtRate(r), "n" + (cls ? " " + cls : "") + (hot && num(r) > 0 ? " " + hot : "")); }
  function empty(tbody, cols, text) {
    var row = el("tr"), cell = el("td", "empty", text);
    cell.colSpan = cols;
    row.appendChild(cell);
    tbody.replaceChildren(row);
  }

  function queueSettings(q) {
    var parts = [num(q.concurrency) + (q.concurrency === 1 ? " worker" : " workers")];
    if (num(q.max_attempts) > 1) parts.push(q.max_attempts + " attempts");
    if (q.dead_letter_exchange) parts.push("DLX " + q.dead_letter_exchange + (q.dead_letter_key ? " (" + q.dead_letter_key + ")" : ""));
    if (num(q.message_ttl_ms) > 0) parts.push("TTL " + fmtMs(q.message_ttl_ms));
    if (num(q.max_len) > 0) parts.push("max " + fmtInt(q.max_len) + (q.overflow ? " " + q.overflow : ""));
    if (q.filtered) parts.push("filtered");
    return parts.join(" \u00b7 ");
  }

  function renderQueues(queues, total) {
    var tbody = $("queues").tBodies[0];
    $("queue-count").textContent = queues.length < total ? queues.length + " of " + total : String(total);
    if (!queues.length) return empty(tbody, 18, "No queues.");
    var maxDepth = 1;
    queues.forEach(function (q) { maxDepth = Math.max(maxDepth, num(q.depth)); });
    var rows = queues.map(function (q) {
      var c = q.counters || {}, r = q.rates, ct = q.consumer_time || {};
      var tr = el("tr");
      var name = el("td", "name");
      name.appendChild(el("div", "qname", q.name)).title = q.name;
      name.appendChild(el("div", "settings", queueSettings(q)));
      tr.appendChild(name);
      var depth = td(fmtInt(q.depth), "n");
      depth.title = fmtInt(q.ready) + " ready, " + fmtInt(q.scheduled) + " scheduled (delay or retry)";
      var bar = el("div", "bar"), fill = el("i");
      fill.style.width = Math.min(100, 100 * num(q.depth) / maxDepth) + "%";
      bar.appendChild(fill);
      depth.appendChild(bar);
      tr.appendChild(depth);
      tr.appendChild(nTd(q.ready));
      tr.appendChild(nTd(q.scheduled));
      tr.appendChild(nTd(q.in_flight));
      tr.appendChild(rTd(r && r.published_per_sec, "", "g"));
      tr.appendChild(rTd(r && r.delivered_per_sec));
      tr.appendChild(rTd(r && r.failed_per_sec, "bad"));
      tr.appendChild(nTd(c.accepted, "", "g"));
      tr.appendChild(nTd(c.succeeded));
      tr.appendChild(nTd(c.failed, "bad"));
      tr.appendChild(nTd(c.retried, "warn"));
      tr.appendChild(nTd(c.dead_lettered, "warn"));
      tr.appendChild(nTd(c.dropped, "bad"));
      var has = num(ct.samples) > 0, tip = fmtInt(ct.samples) + " samples, mean " + fmtMs(ct.mean_ms);
      [["p50_ms", "g"], ["p90_ms", ""], ["p99_ms", ""], ["max_ms", ""]].forEach(function (f) {
        var cell = td(has ? fmtMs(ct[f[0]]) : "\u2013", "n " + f[1]);
        cell.title = tip;
        tr.appendChild(cell);
      });
      return tr;
    });
    tbody.replaceChildren.apply(tbody, rows);
  }

  function bindingCell(bindings) {
    var cell = el("td", "wrap");
    if (!bindings || !bindings.length) { cell.appendChild(el("span", "muted", "none")); return cell; }
    bindings.forEach(function (b) {
      var chip = el("span", "chip");
      chip.appendChild(el("b", null, b.queue));
      (b.keys || []).forEach(function (k) { chip.appendChild(document.createTextNode(" ")); chip.appendChild(el("span", "key", k)); });
      (b.args || []).forEach(function (table) {
        var pairs = Object.keys(table).sort().map(function (k) { return k + "=" + table[k]; });
        chip.appendChild(document.createTextNode(" "));
        chip.appendChild(el("span", "key", "{" + pairs.join(", ") + "}"));
      });
      cell.appendChild(chip);
    });
    return cell;
  }

  function renderExchanges(exchanges, total) {
    var tbody = $("exchanges").tBodies[0];
    $("exchange-count").textContent = exchanges.length < total ? exchanges.length + " of " + total : String(total);
    if (!exchanges.length) return empty(tbody, 7, "No exchanges.");
    tbody.replaceChildren.apply(tbody, exchanges.map(function (x) {
      var tr = el("tr"), r = x.rates;
      var name = td(x.name, "name");
      name.title = x.name;
      tr.appendChild(name);
      tr.appendChild(td(x.kind));
      tr.appendChild(td(x.alternate || "\u2013", x.alternate ? "" : "muted"));
      tr.appendChild(nTd(x.published));
      tr.appendChild(rTd(r && r.published_per_sec));
      tr.appendChild(nTd(x.unroutable, "warn"));
      tr.appendChild(bindingCell(x.bindings));
      return tr;
    }));
  }

  function renderDead(dead) {
    var tbody = $("dead").tBodies[0];
    $("dead-count").textContent = String(dead.length);
    if (!dead.length) return empty(tbody, 7, "No dead letters yet.");
    tbody.replaceChildren.apply(tbody, dead.map(function (d) {
      var tr = el("tr");
      tr.appendChild(td(fmtTime(d.time), "muted"));
      tr.appendChild(td(d.queue, "name"));
      tr.appendChild(td(d.reason));
      tr.appendChild(td(d.exchange + (d.routing_key ? " / " + d.routing_key : "")));
      tr.appendChild(td("#" + num(d.message_id) + ", " + num(d.attempts) + (d.attempts === 1 ? " attempt" : " attempts"), "n"));
      tr.appendChild(td(d.last_error || "\u2013", "wrap" + (d.last_error ? "" : " muted")));
      var outcome = d.dropped ? "dropped" + (d.drop_cause ? ": " + d.drop_cause : "") : "\u2192 " + d.dead_letter_exchange;
      tr.appendChild(td(outcome, d.dropped ? "bad" : ""));
      return tr;
    }));
  }

  function render(data) {
    var queues = data.queues || [], exchanges = data.exchanges || [], dead = data.dead_letters || [];
    var published = 0, waiting = 0, inFlight = 0, failed = 0, rate = null;
    exchanges.forEach(function (x) {
      published += num(x.published);
      if (x.rates) rate = (rate || 0) + num(x.rates.published_per_sec);
    });
    queues.forEach(function (q) {
      waiting += num(q.depth); inFlight += num(q.in_flight);
      failed += num((q.counters || {}).failed);
    });
    $("total-published").textContent = fmtInt(published);
    $("total-published").setAttribute("data-value", String(published));
    $("total-rate").textContent = fmtRate(rate);
    $("total-waiting").textContent = fmtInt(waiting);
    $("total-inflight").textContent = fmtInt(inFlight);
    $("total-failed").textContent = fmtInt(failed);
    $("rate-window").textContent = data.rate_seconds ? "rates over the last " + data.rate_seconds.toFixed(1) + " s" : "rates after the next refresh";
    $("truncated").hidden = !data.truncated;
    renderQueues(queues, num(data.queue_count));
    renderExchanges(exchanges, num(data.exchange_count));
    renderDead(dead);
  }

  var delay = 1000;
  function setStatus(ok, text) {
    var s = $("status");
    s.className = "status " + (ok ? "ok" : "bad");
    s.textContent = ok ? "live" : "offline";
    $("error").hidden = ok;
    if (!ok) $("error").textContent = "Cannot load api/overview: " + text + ". Retrying.";
  }
  function schedule() { setTimeout(tick, delay); }
  function tick() {
    if (document.hidden) return schedule();
    var opts = { cache: "no-store", headers: { "Accept": "application/json" } };
    if (window.AbortSignal && AbortSignal.timeout) opts.signal = AbortSignal.timeout(Math.max(5000, 5 * delay));
    fetch("api/overview", opts).then(function (res) {
      if (!res.ok) throw new Error("HTTP " + res.status);
      return res.json();
    }).then(function (data) {
      if (num(data.refresh_ms) >= 100) delay = data.refresh_ms;
      render(data);
      setStatus(true);
      $("updated").textContent = "updated " + fmtTime(data.time);
      $("refresh").textContent = "refreshes every " + (delay / 1000) + " s";
    }).catch(function (err) {
      setStatus(false, err && err.message ? err.message : String(err));
    }).then(schedule);
  }
  tick();
})();
`

const pageBody = `<body>
<header>
  <h1>TinyMQ <span>queues</span></h1>
  <span id="status" class="status ok">loading</span>
  <span id="updated" class="muted"></span>
  <span id="rate-window" class="muted"></span>
</header>
<div id="error" class="banner bad" hidden></div>
<div id="truncated" class="banner warn" hidden>This MQ is too large for one response: some items are left out.</div>
<div id="summary">
  <div class="tile"><b id="total-published">0</b><span>messages published</span></div>
  <div class="tile"><b id="total-rate">&#8211;</b><span>published / s</span></div>
  <div class="tile"><b id="total-waiting">0</b><span>waiting in queues</span></div>
  <div class="tile"><b id="total-inflight">0</b><span>in a consumer now</span></div>
  <div class="tile"><b id="total-failed">0</b><span>failed deliveries</span></div>
</div>
<section>
  <h2>Queues <span class="count" id="queue-count"></span></h2>
  <table id="queues">
    <thead><tr>
      <th>queue</th><th class="n" title="depth: ready + scheduled">waiting</th><th class="n" title="waiting for a worker">ready</th>
      <th class="n" title="waiting for a delay or a retry backoff">sched&#173;uled</th><th class="n">in flight</th>
      <th class="n g" title="published into the queue per second">pub&#173;lished/s</th>
      <th class="n" title="consumer calls per second, retries included">deliv&#173;ered/s</th><th class="n">failed/s</th>
      <th class="n g" title="published into the queue">accepted</th><th class="n">succeeded</th>
      <th class="n" title="consumer calls that failed">failed</th><th class="n">retried</th><th class="n">dead-lettered</th>
      <th class="n">dropped</th>
      <th class="n g" title="consumer time, from a sample of the calls; upper bounds within a factor of 2">p50</th>
      <th class="n" title="consumer time">p90</th><th class="n" title="consumer time">p99</th><th class="n" title="consumer time">max</th>
    </tr></thead>
    <tbody><tr><td class="empty" colspan="18">Loading&#8230;</td></tr></tbody>
  </table>
</section>
<section>
  <h2>Exchanges <span class="count" id="exchange-count"></span></h2>
  <table id="exchanges">
    <thead><tr>
      <th>exchange</th><th>kind</th><th>alternate</th><th class="n">published</th><th class="n">published/s</th>
      <th class="n" title="publishes refused: no queue matched">unroutable</th><th>bindings (queue, keys or arguments)</th>
    </tr></thead>
    <tbody><tr><td class="empty" colspan="7">Loading&#8230;</td></tr></tbody>
  </table>
</section>
<section>
  <h2>Recent dead letters <span class="count" id="dead-count"></span></h2>
  <table id="dead">
    <thead><tr>
      <th>time</th><th>queue</th><th>reason</th><th>exchange / routing key</th><th class="n">message, attempts</th>
      <th>last error</th><th>outcome</th>
    </tr></thead>
    <tbody><tr><td class="empty" colspan="7">Loading&#8230;</td></tr></tbody>
  </table>
</section>
<footer>Read-only. <span id="refresh">refreshes every second</span> &#183; <a href="api/overview">JSON</a></footer>
`

var (
	// pageHTML is the whole page, built once.
	pageHTML = []byte(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>TinyMQ admin</title>
<link rel="icon" href="data:,">
<style>` + pageStyle + `</style>
</head>
` + pageBody + `<script>` + pageScript + `</script>
</body>
</html>
`)

	// pageCSP allows the page's own inline style and script (by hash), fetches
	// to its own origin, and nothing else.
	pageCSP = "default-src 'none'; script-src '" + cspHash(pageScript) + "'; style-src '" + cspHash(pageStyle) +
		"'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

// cspHash returns the CSP source expression for an inline element's text.
func cspHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}
