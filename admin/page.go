package admin

import (
	"crypto/sha256"
	"encoding/base64"
	"html"
)

// The page is static but for the actions' token in a meta tag: it holds no
// data, so nothing in it needs escaping. Its script fetches api/overview
// (relative, so any mount prefix works) and puts every name into the DOM
// with textContent, never as HTML; the sparklines are SVG elements it
// builds. The Content-Security-Policy allows exactly this script and this
// style, by hash, so that even an injected tag could not run.

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
h3 { font-size: 13px; margin: 10px 0 6px; }
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
tr.sel td { background: color-mix(in srgb, var(--accent) 8%, transparent); }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
td.name { font-weight: 600; max-width: 280px; overflow: hidden; text-overflow: ellipsis; }
td.name .qname { overflow: hidden; text-overflow: ellipsis; }
td.name .settings { font-weight: 400; font-size: 11.5px; color: var(--muted); white-space: normal; }
button.qname { font: inherit; font-weight: 600; color: var(--accent); background: none; border: 0; padding: 0; cursor: pointer;
  max-width: 270px; overflow: hidden; text-overflow: ellipsis; text-align: left; display: block; }
td.wrap { white-space: normal; max-width: 420px; overflow-wrap: anywhere; }
td.bad { color: var(--bad); font-weight: 600; }
td.warn { color: var(--warn); }
.bar { height: 3px; background: var(--bar); border-radius: 2px; margin-top: 2px; }
.bar i { display: block; height: 3px; background: var(--accent); border-radius: 2px; }
.chip { display: inline-block; border: 1px solid var(--line); border-radius: 4px; padding: 0 5px; margin: 0 4px 2px 0; font-size: 12px; }
.chip.paused { color: var(--warn); border-color: var(--warn); }
.key { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
.empty { color: var(--muted); padding: 6px 8px; }
.banner { border-radius: 8px; padding: 8px 12px; margin-bottom: 14px; }
.banner.bad { background: color-mix(in srgb, var(--bad) 14%, var(--card)); color: var(--bad); }
.banner.warn { background: color-mix(in srgb, var(--warn) 14%, var(--card)); color: var(--warn); }
.toolbar { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 0 0 8px; }
.toolbar input, .toolbar select, .actions input { font: inherit; padding: 2px 6px; border: 1px solid var(--line); border-radius: 4px;
  background: var(--bg); color: var(--fg); }
.toolbar input[type=search] { width: 200px; }
button.b { font: inherit; padding: 2px 10px; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); cursor: pointer; }
button.b:disabled { opacity: 0.45; cursor: default; }
button.b.danger { color: var(--bad); border-color: color-mix(in srgb, var(--bad) 45%, var(--line)); }
button.b.armed { background: var(--bad); color: #fff; }
svg.spark { display: block; margin-top: 2px; overflow: visible; }
svg.spark path { fill: none; stroke: var(--accent); stroke-width: 1.2; }
svg.spark.depth path { stroke: var(--warn); }
svg.spark circle { fill: var(--accent); }
svg.spark.depth circle { fill: var(--warn); }
#panel .head { display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
#panel .charts { display: flex; gap: 22px; flex-wrap: wrap; margin: 8px 0; }
#panel .charts div span { color: var(--muted); font-size: 12px; }
.actions { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 8px 0; }
.actions input[type=number] { width: 70px; }
.actions label { color: var(--muted); font-size: 12px; }
#action-result { margin: 6px 0; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; white-space: pre-wrap; overflow-wrap: anywhere; }
#action-result.bad { color: var(--bad); }
#action-result.ok { color: var(--good); }
pre.payload { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere; max-width: 520px; max-height: 160px; overflow: auto; font-size: 12px; }
footer { color: var(--muted); font-size: 12px; }
a { color: var(--accent); }
`

const pageScript = `
"use strict";
(function () {
  var $ = function (id) { return document.getElementById(id); };
  var SVG = "http://www.w3.org/2000/svg";
  var tokenMeta = document.querySelector('meta[name="tinymq-token"]');
  var token = tokenMeta ? tokenMeta.getAttribute("content") : "";
  var PAGE = 50;
  var state = { offset: 0, sort: "", filter: "", xOffset: 0, xFilter: "", selected: "", actions: false, payloads: false };
  var last = null;

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

  // spark draws values (numbers, or null for no data) as an SVG line, the
  // newest point as a dot; the title says what it shows.
  // from is the first step of the history that has data: the charts start
  // there, so that a young history uses their whole width.
  var from = 0, stepSec = 5;
  function spark(values, w, h, cls, label, fmt) {
    values = Array.isArray(values) ? values.slice(Math.min(from, Math.max(0, values.length - 2))) : [];
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark " + cls);
    svg.setAttribute("width", w);
    svg.setAttribute("height", h);
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    var top = 0, lastV = null, lastX = 0, lastY = 0, d = "", pen = false, n = values.length;
    values.forEach(function (v) { if (typeof v === "number" && isFinite(v)) top = Math.max(top, v); });
    values.forEach(function (v, i) {
      if (typeof v !== "number" || !isFinite(v)) { pen = false; return; }
      var x = n > 1 ? 1 + i * (w - 2) / (n - 1) : w / 2;
      var y = h - 1 - (top > 0 ? v / top * (h - 2) : 0);
      d += (pen ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
      pen = true; lastV = v; lastX = x; lastY = y;
    });
    var path = document.createElementNS(SVG, "path");
    path.setAttribute("d", d || "M0 " + (h - 1));
    svg.appendChild(path);
    if (lastV !== null) {
      var dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", lastX.toFixed(1)); dot.setAttribute("cy", lastY.toFixed(1)); dot.setAttribute("r", "1.6");
      svg.appendChild(dot);
    }
    var title = document.createElementNS(SVG, "title");
    var secs = n * stepSec;
    title.textContent = label + " over the last " + (secs < 120 ? secs + " s" : Math.round(secs / 60) + " min") + ": now " +
      (lastV === null ? "\u2013" : fmt(lastV)) + ", peak " + fmt(top);
    svg.appendChild(title);
    return svg;
  }

  function queueSettings(q) {
    var parts = [num(q.concurrency) + (q.concurrency === 1 ? " worker" : " workers")];
    if (num(q.consumers) !== 1) parts.push(num(q.consumers) + " consumers");
    if (num(q.max_attempts) > 1) parts.push(q.max_attempts + " attempts");
    if (q.dead_letter_exchange) parts.push("DLX " + q.dead_letter_exchange + (q.dead_letter_key ? " (" + q.dead_letter_key + ")" : ""));
    if (num(q.message_ttl_ms) > 0) parts.push("TTL " + fmtMs(q.message_ttl_ms));
    if (num(q.max_len) > 0) parts.push("max " + fmtInt(q.max_len) + (q.overflow ? " " + q.overflow : ""));
    if (num(q.expiry_ms) > 0) parts.push("expires after " + fmtMs(q.expiry_ms) + " unused");
    if (q.durable) parts.push("durable");
    if (q.filtered) parts.push("filtered");
    if (num(q.delivery_timeout_ms) > 0) parts.push("timeout " + fmtMs(q.delivery_timeout_ms));
    if (num(q.rate_limit_per_sec) > 0) {
      parts.push("rate " + num(q.rate_limit_per_sec).toLocaleString("en-US", { maximumFractionDigits: 3 }) + "/s, burst " + fmtInt(q.rate_burst));
    }
    if (q.group_ordering) parts.push("ordered by group");
    if (q.payload_type) parts.push("takes " + q.payload_type);
    return parts.join(" \u00b7 ");
  }

  function pager(prefix, page, shown) {
    var start = num(page.offset), total = num(page.matched);
    $(prefix + "-range").textContent = total === 0 ? "none" :
      (start + 1).toLocaleString("en-US") + "\u2013" + (start + shown).toLocaleString("en-US") + " of " + fmtInt(total) +
      (page.filter ? " matching \u201c" + page.filter + "\u201d" : "");
    $(prefix + "-prev").disabled = start === 0;
    $(prefix + "-next").disabled = page.next_offset === null || page.next_offset === undefined;
  }

  function renderQueues(data) {
    var queues = data.queues || [], page = data.queue_page || {};
    var tbody = $("queues").tBodies[0];
    $("queue-count").textContent = fmtInt(data.queue_count);
    pager("queue", page, queues.length);
    if (!queues.length) return empty(tbody, 18, num(data.queue_count) ? "No queue matches." : "No queues.");
    var maxDepth = 1;
    queues.forEach(function (q) { maxDepth = Math.max(maxDepth, num(q.depth)); });
    var rows = queues.map(function (q) {
      var c = q.counters || {}, r = q.rates, ct = q.consumer_time || {}, hist = q.history || {};
      var tr = el("tr", q.name === state.selected ? "sel" : "");
      tr.setAttribute("data-queue", q.name);
      var name = el("td", "name");
      var pick = el("button", "qname", q.name);
      pick.type = "button";
      pick.title = q.name;
      pick.addEventListener("click", function () { select(q.name); });
      name.appendChild(pick);
      var settings = el("div", "settings", queueSettings(q));
      if (q.paused) settings.prepend(el("span", "chip paused", "paused"));
      name.appendChild(settings);
      tr.appendChild(name);
      var depth = td(fmtInt(q.depth), "n depth");
      depth.title = fmtInt(q.ready) + " ready, " + fmtInt(q.scheduled) + " scheduled (delay or retry)";
      var bar = el("div", "bar"), fill = el("i");
      fill.style.width = Math.min(100, 100 * num(q.depth) / maxDepth) + "%";
      bar.appendChild(fill);
      depth.appendChild(bar);
      depth.appendChild(spark(hist.depth, 64, 16, "depth", "waiting", fmtInt));
      tr.appendChild(depth);
      tr.appendChild(nTd(q.ready));
      tr.appendChild(nTd(q.scheduled));
      tr.appendChild(nTd(q.in_flight));
      var pub = rTd(r && r.published_per_sec, "", "g");
      pub.appendChild(spark(hist.published_per_sec, 64, 16, "rate", "published/s", fmtRate));
      tr.appendChild(pub);
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

  function bindingCell(x) {
    var cell = el("td", "wrap"), bindings = x.bindings || [];
    if (!bindings.length && !num(x.binding_count)) { cell.appendChild(el("span", "muted", "none")); return cell; }
    bindings.forEach(function (b) {
      var chip = el("span", "chip");
      chip.appendChild(el("b", null, b.queue));
      (b.keys || []).forEach(function (k) { chip.appendChild(document.createTextNode(" ")); chip.appendChild(el("span", "key", k)); });
      (b.args || []).forEach(function (table) {
        var pairs = Object.keys(table).sort().map(function (k) { return k + "=" + table[k]; });
        chip.appendChild(document.createTextNode(" "));
        chip.appendChild(el("span", "key", "{" + pairs.join(", ") + "}"));
      });
      if (b.truncated) chip.appendChild(el("span", "muted", " \u2026"));
      cell.appendChild(chip);
    });
    var more = num(x.binding_count) - bindings.length;
    if (more > 0) {
      var a = el("a", null, "+" + fmtInt(more) + " more");
      a.href = "api/bindings?exchange=" + encodeURIComponent(x.name);
      cell.appendChild(a);
    }
    return cell;
  }

  function renderExchanges(data) {
    var exchanges = data.exchanges || [], page = data.exchange_page || {};
    var tbody = $("exchanges").tBodies[0];
    $("exchange-count").textContent = fmtInt(data.exchange_count);
    pager("exchange", page, exchanges.length);
    if (!exchanges.length) return empty(tbody, 8, num(data.exchange_count) ? "No exchange matches." : "No exchanges.");
    tbody.replaceChildren.apply(tbody, exchanges.map(function (x) {
      var tr = el("tr"), r = x.rates, dedup = num(x.deduplication_window_ms) > 0;
      tr.setAttribute("data-exchange", x.name);
      var name = td(x.name, "name");
      name.title = x.name;
      tr.appendChild(name);
      tr.appendChild(td(x.kind + (dedup ? " \u00b7 dedup " + fmtMs(x.deduplication_window_ms) : ""), "kind"));
      tr.appendChild(td(x.alternate || "\u2013", x.alternate ? "" : "muted"));
      tr.appendChild(nTd(x.published));
      tr.appendChild(rTd(r && r.published_per_sec));
      tr.appendChild(nTd(x.unroutable, "warn"));
      var dups = dedup || num(x.duplicates) > 0 ? nTd(x.duplicates, "", "dups") : td("\u2013", "n dups muted");
      dups.title = dedup ? "publishes deduplicated within " + fmtMs(x.deduplication_window_ms) : "no WithDeduplication";
      tr.appendChild(dups);
      tr.appendChild(bindingCell(x));
      return tr;
    }));
  }

  function renderGroups(data) {
    var sum = data.dead_letter_totals || {}, groups = data.dead_letter_groups || [];
    $("dead-total").textContent = fmtInt(sum.total);
    $("dead-total").setAttribute("data-value", String(num(sum.total)));
    $("dead-summary").textContent = num(sum.total) ? fmtInt(sum.dead_lettered) + " dead-lettered, " + fmtInt(sum.dropped) +
      " dropped, in " + fmtInt(sum.queues) + (sum.queues === 1 ? " queue" : " queues") : "";
    var tbody = $("groups").tBodies[0];
    if (!groups.length) return empty(tbody, 8, "No dead letters.");
    var rows = [];
    groups.forEach(function (g) {
      (g.reasons || []).forEach(function (r, i) {
        var tr = el("tr");
        if (i === 0) {
          var name = td(g.deleted ? "(deleted queues)" : g.queue, "name" + (g.deleted ? " muted" : ""));
          name.rowSpan = g.reasons.length;
          tr.appendChild(name);
          var tot = nTd(g.total, "warn");
          tot.rowSpan = g.reasons.length;
          tot.title = fmtInt(g.dead_lettered) + " dead-lettered, " + fmtInt(g.dropped) + " dropped";
          tr.appendChild(tot);
        }
        tr.appendChild(td(r.reason));
        tr.appendChild(nTd(r.total));
        tr.appendChild(nTd(r.recent));
        tr.appendChild(td(r.last_time ? fmtTime(r.last_time) : "\u2013", "muted"));
        tr.appendChild(td(r.last_error || "\u2013", "wrap" + (r.last_error ? "" : " muted")));
        tr.appendChild(td(r.last_outcome || "\u2013", "wrap" + (r.last_outcome && r.last_outcome.indexOf("dropped") === 0 ? " bad" : "")));
        rows.push(tr);
      });
    });
    tbody.replaceChildren.apply(tbody, rows);
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

  // The panel of the selected queue: its charts, and its actions.
  function select(name) {
    state.selected = name;
    $("peek").hidden = true;
    setResult("", "");
    disarm();
    refreshNow();
  }
  function renderPanel(data) {
    var panel = $("panel"), q = data.selected;
    if (!state.selected) { panel.hidden = true; return; }
    panel.hidden = false;
    $("panel-name").textContent = state.selected;
    $("panel-gone").hidden = !!q;
    $("panel-body").hidden = !q;
    if (!q) return;
    var hist = q.history || {}, c = q.counters || {};
    $("panel-settings").textContent = queueSettings(q) + (q.paused ? " \u00b7 paused" : "");
    $("panel-depth").textContent = fmtInt(q.depth);
    $("panel-depth").setAttribute("data-value", String(num(q.depth)));
    $("panel-counts").textContent = fmtInt(q.ready) + " ready, " + fmtInt(q.scheduled) + " scheduled, " +
      fmtInt(q.in_flight) + " in flight, " + fmtInt(q.abandoned) + " abandoned" +
      (num(q.oldest_age_ms) > 0 ? " \u00b7 oldest waited " + fmtMs(q.oldest_age_ms) : "") +
      " \u00b7 accepted " + fmtInt(c.accepted) + ", succeeded " + fmtInt(c.succeeded) +
      ", dead-lettered " + fmtInt(c.dead_lettered) + ", dropped " + fmtInt(c.dropped) + ", purged " + fmtInt(c.purged) +
      ", replayed " + fmtInt(c.replayed) + ", undelivered " + fmtInt(c.undelivered) + ", timed out " + fmtInt(c.timed_out);
    $("chart-depth").replaceChildren(spark(hist.depth, 240, 40, "depth", "depth", fmtInt));
    $("chart-pub").replaceChildren(spark(hist.published_per_sec, 240, 40, "rate", "published/s", fmtRate));
    $("chart-deliv").replaceChildren(spark(hist.delivered_per_sec, 240, 40, "rate", "delivered/s", fmtRate));
    $("actions").hidden = !state.actions;
    $("act-pause").hidden = !!q.paused;
    $("act-resume").hidden = !q.paused;
  }

  function setResult(text, cls) {
    var r = $("action-result");
    r.textContent = text;
    r.className = cls || "";
  }

  // act POSTs one action with the page's token and reports its JSON.
  function act(name, params) {
    params.queue = state.selected;
    var url = "api/" + name + "?" + new URLSearchParams(params).toString();
    setResult(name + "\u2026", "");
    return fetch(url, { method: "POST", cache: "no-store", headers: { "X-TinyMQ-Token": token, "Accept": "application/json" } })
      .then(function (res) {
        return res.json().then(function (body) { return { status: res.status, ok: res.ok, body: body || {} }; });
      }).then(function (r) {
        var b = r.body, what = describe(name, b);
        if (r.ok) setResult(what, "ok");
        else setResult("HTTP " + r.status + ": " + (b.error || "failed") + (num(b.count) ? " (" + what + ")" : ""), "bad");
        if (name === "peek" && r.ok) renderPeek(b);
        refreshNow();
        return r;
      }).catch(function (err) {
        setResult("failed: " + (err && err.message ? err.message : String(err)), "bad");
      });
  }
  function describe(name, b) {
    var n = fmtInt(b.count), m = num(b.count) === 1 ? " message" : " messages";
    switch (name) {
    case "purge": return "purged " + n + m;
    case "delete": return "deleted the queue and " + n + " waiting" + m;
    case "pause": return "paused";
    case "resume": return "resumed";
    case "replay": return "replayed " + n + m;
    case "peek": return "peeked at " + n + m + (b.truncated ? " (more did not fit)" : "");
    }
    return name;
  }
  function renderPeek(b) {
    var box = $("peek"), msgs = b.messages || [], tbody = $("peek-table").tBodies[0];
    box.hidden = false;
    $("peek-note").textContent = b.payloads ? "" : "Payloads are hidden (admin.WithPayloads shows them).";
    if (!msgs.length) return empty(tbody, 8, "Nothing waits at the head of the queue.");
    tbody.replaceChildren.apply(tbody, msgs.map(function (m) {
      var tr = el("tr");
      tr.appendChild(td("#" + num(m.id), "n"));
      tr.appendChild(td(m.exchange + (m.routing_key ? " / " + m.routing_key : "")));
      tr.appendChild(td(num(m.attempt) + (m.redelivered ? " (redelivered)" : ""), "n"));
      tr.appendChild(td(m.size === null || m.size === undefined ? m.type : fmtInt(m.size) + " B " + m.type, "n"));
      var hdrs = m.headers || {}, keys = Object.keys(hdrs).sort();
      tr.appendChild(td(keys.length ? keys.map(function (k) { return k + "=" + hdrs[k]; }).join(", ") : "\u2013", "wrap key"));
      var deaths = (m.deaths || []).map(function (d) {
        return d.reason + " in " + d.queue + " \u00d7" + num(d.count) + (d.last_error ? ": " + d.last_error : "");
      });
      tr.appendChild(td(deaths.length ? deaths.join("; ") : "\u2013", "wrap"));
      var cell = el("td", "wrap");
      if (b.payloads) {
        if (m.payload_error) cell.appendChild(el("span", "bad", m.payload_error));
        else if (m.payload !== undefined && m.payload !== null) {
          cell.appendChild(el("pre", "payload", m.payload));
          if (m.payload_encoding !== "text" || m.payload_truncated) {
            cell.appendChild(el("span", "muted", (m.payload_encoding || "") + (m.payload_truncated ? ", cut" : "")));
          }
        } else cell.appendChild(el("span", "muted", "nil"));
      } else cell.appendChild(el("span", "muted", "hidden"));
      tr.appendChild(cell);
      return tr;
    }));
  }

  // Purge and delete ask twice: the first click arms the button.
  var armed = null, armTimer = 0;
  function disarm() {
    if (armed) { armed.classList.remove("armed"); armed.textContent = armed.getAttribute("data-label"); }
    armed = null;
    clearTimeout(armTimer);
  }
  function twoStep(id, confirmText, run) {
    var b = $(id);
    b.setAttribute("data-label", b.textContent);
    b.addEventListener("click", function () {
      if (armed !== b) {
        disarm();
        armed = b;
        b.classList.add("armed");
        b.textContent = confirmText();
        armTimer = setTimeout(disarm, 5000);
        return;
      }
      disarm();
      run();
    });
  }
  function nOf(id) { return String(Math.max(1, Math.floor(num(Number($(id).value))) || 1)); }
  function wire() {
    $("act-pause").addEventListener("click", function () { act("pause", {}); });
    $("act-resume").addEventListener("click", function () { act("resume", {}); });
    twoStep("act-purge", function () { return "purge " + $("panel-depth").textContent + " waiting?"; }, function () { act("purge", {}); });
    twoStep("act-delete", function () { return "delete the queue?"; }, function () {
      var p = {};
      if ($("if-unused").checked) p.if_unused = "1";
      if ($("if-empty").checked) p.if_empty = "1";
      act("delete", p);
    });
    $("act-replay").addEventListener("click", function () { act("replay", { n: nOf("replay-n") }); });
    $("act-peek").addEventListener("click", function () { act("peek", { n: nOf("peek-n") }); });
    $("panel-close").addEventListener("click", function () { state.selected = ""; $("panel").hidden = true; refreshNow(); });

    var typing = 0;
    $("queue-filter").addEventListener("input", function () {
      clearTimeout(typing);
      typing = setTimeout(function () { state.filter = $("queue-filter").value; state.offset = 0; refreshNow(); }, 250);
    });
    $("exchange-filter").addEventListener("input", function () {
      clearTimeout(typing);
      typing = setTimeout(function () { state.xFilter = $("exchange-filter").value; state.xOffset = 0; refreshNow(); }, 250);
    });
    $("queue-sort").addEventListener("change", function () { state.sort = $("queue-sort").value; state.offset = 0; refreshNow(); });
    $("queue-prev").addEventListener("click", function () { state.offset = Math.max(0, state.offset - PAGE); refreshNow(); });
    $("queue-next").addEventListener("click", function () {
      var p = last && last.queue_page;
      if (p && p.next_offset !== null && p.next_offset !== undefined) { state.offset = p.next_offset; refreshNow(); }
    });
    $("exchange-prev").addEventListener("click", function () { state.xOffset = Math.max(0, state.xOffset - PAGE); refreshNow(); });
    $("exchange-next").addEventListener("click", function () {
      var p = last && last.exchange_page;
      if (p && p.next_offset !== null && p.next_offset !== undefined) { state.xOffset = p.next_offset; refreshNow(); }
    });
  }

  function render(data) {
    last = data;
    var t = data.totals || {}, h = data.history || {};
    if (num(h.step_ms) > 0) stepSec = h.step_ms / 1000;
    from = 0;
    var d = Array.isArray(h.depth) ? h.depth : [];
    while (from < d.length && (d[from] === null || d[from] === undefined)) from++;
    state.actions = !!(data.actions && data.actions.enabled) && token !== "";
    state.payloads = !!(data.actions && data.actions.payloads);
    $("total-published").textContent = fmtInt(t.published);
    $("total-published").setAttribute("data-value", String(num(t.published)));
    $("total-rate").textContent = fmtRate(t.published_per_sec);
    $("spark-rate").replaceChildren(spark(h.published_per_sec, 120, 22, "rate", "published/s", fmtRate));
    $("total-waiting").textContent = fmtInt(t.depth);
    $("spark-depth").replaceChildren(spark(h.depth, 120, 22, "depth", "waiting", fmtInt));
    $("total-inflight").textContent = fmtInt(t.in_flight);
    $("total-failed").textContent = fmtInt(t.failed);
    $("total-dead").textContent = fmtInt((data.dead_letter_totals || {}).total);
    $("rate-window").textContent = data.rate_seconds ? "rates over the last " + data.rate_seconds.toFixed(1) + " s" : "rates after the next refresh";
    $("truncated").hidden = !data.truncated;
    $("mode").textContent = state.actions ? "Actions are on" + (state.payloads ? ", payloads shown" : "") + "." : "Read-only.";
    renderQueues(data);
    renderExchanges(data);
    renderPanel(data);
    renderGroups(data);
    renderDead(data.dead_letters || []);
  }

  var delay = 1000, timer = 0, busy = false, again = false;
  function setStatus(ok, text) {
    var s = $("status");
    s.className = "status " + (ok ? "ok" : "bad");
    s.textContent = ok ? "live" : "offline";
    $("error").hidden = ok;
    if (!ok) $("error").textContent = "Cannot load api/overview: " + text + ". Retrying.";
  }
  function query() {
    var p = { limit: PAGE, offset: state.offset, exchange_limit: PAGE, exchange_offset: state.xOffset };
    if (state.sort) p.sort = state.sort;
    if (state.filter) p.filter = state.filter;
    if (state.xFilter) p.exchange_filter = state.xFilter;
    if (state.selected) p.queue = state.selected;
    return new URLSearchParams(p).toString();
  }
  function schedule() { clearTimeout(timer); timer = setTimeout(tick, delay); }
  function refreshNow() {
    if (busy) { again = true; return; }
    clearTimeout(timer);
    tick();
  }
  function tick() {
    if (document.hidden) return schedule();
    busy = true;
    var opts = { cache: "no-store", headers: { "Accept": "application/json" } };
    if (window.AbortSignal && AbortSignal.timeout) opts.signal = AbortSignal.timeout(Math.max(5000, 5 * delay));
    fetch("api/overview?" + query(), opts).then(function (res) {
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
    }).then(function () {
      busy = false;
      if (again) { again = false; clearTimeout(timer); tick(); return; }
      schedule();
    });
  }
  wire();
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
<div id="truncated" class="banner warn" hidden>A list did not fit in one response: page on for the rest.</div>
<div id="summary">
  <div class="tile"><b id="total-published">0</b><span>messages published</span></div>
  <div class="tile"><b id="total-rate">&#8211;</b><span>published / s</span><div id="spark-rate"></div></div>
  <div class="tile"><b id="total-waiting">0</b><span>waiting in queues</span><div id="spark-depth"></div></div>
  <div class="tile"><b id="total-inflight">0</b><span>in a consumer now</span></div>
  <div class="tile"><b id="total-failed">0</b><span>failed deliveries</span></div>
  <div class="tile"><b id="total-dead">0</b><span>dead letters</span></div>
</div>
<section>
  <h2>Queues <span class="count" id="queue-count"></span></h2>
  <div class="toolbar">
    <input id="queue-filter" type="search" placeholder="filter by name" aria-label="filter queues by name">
    <select id="queue-sort" aria-label="sort queues">
      <option value="">registration order</option><option value="name">name</option>
      <option value="depth">most waiting</option><option value="rate">busiest (published/s)</option>
    </select>
    <button id="queue-prev" class="b" type="button">&#8249; prev</button>
    <span id="queue-range" class="muted"></span>
    <button id="queue-next" class="b" type="button">next &#8250;</button>
  </div>
  <table id="queues">
    <thead><tr>
      <th>queue</th><th class="n" title="depth: ready + scheduled; its line: the last minutes">waiting</th>
      <th class="n" title="waiting for a worker">ready</th>
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
<section id="panel" hidden>
  <div class="head">
    <h2>Queue <span id="panel-name"></span></h2>
    <span id="panel-settings" class="muted"></span>
    <button id="panel-close" class="b" type="button">close</button>
  </div>
  <div id="panel-gone" class="muted" hidden>This queue no longer exists.</div>
  <div id="panel-body">
    <div><b id="panel-depth">0</b> waiting &#183; <span id="panel-counts" class="muted"></span></div>
    <div class="charts">
      <div><span>waiting</span><div id="chart-depth"></div></div>
      <div><span>published / s</span><div id="chart-pub"></div></div>
      <div><span>delivered / s</span><div id="chart-deliv"></div></div>
    </div>
    <div id="actions" class="actions" hidden>
      <button id="act-pause" class="b" type="button">pause</button>
      <button id="act-resume" class="b" type="button">resume</button>
      <button id="act-purge" class="b danger" type="button">purge</button>
      <button id="act-delete" class="b danger" type="button">delete queue</button>
      <label><input id="if-unused" type="checkbox"> if unused</label>
      <label><input id="if-empty" type="checkbox"> if empty</label>
      <span>&#183;</span>
      <input id="replay-n" type="number" min="1" max="10000" value="10" aria-label="how many to replay">
      <button id="act-replay" class="b" type="button">replay dead letters</button>
      <input id="peek-n" type="number" min="1" max="100" value="10" aria-label="how many to peek at">
      <button id="act-peek" class="b" type="button">peek</button>
    </div>
    <div id="action-result"></div>
    <div id="peek" hidden>
      <h3>Head of the queue <span id="peek-note" class="muted"></span></h3>
      <table id="peek-table">
        <thead><tr><th class="n">message</th><th>exchange / routing key</th><th class="n">attempt</th><th class="n">size</th>
          <th>headers</th><th>deaths</th><th>payload</th></tr></thead>
        <tbody></tbody>
      </table>
    </div>
  </div>
</section>
<section>
  <h2>Exchanges <span class="count" id="exchange-count"></span></h2>
  <div class="toolbar">
    <input id="exchange-filter" type="search" placeholder="filter by name" aria-label="filter exchanges by name">
    <button id="exchange-prev" class="b" type="button">&#8249; prev</button>
    <span id="exchange-range" class="muted"></span>
    <button id="exchange-next" class="b" type="button">next &#8250;</button>
  </div>
  <table id="exchanges">
    <thead><tr>
      <th>exchange</th><th>kind</th><th>alternate</th><th class="n">published</th><th class="n">published/s</th>
      <th class="n" title="publishes refused: no queue matched">unroutable</th>
      <th class="n" title="publishes that WithDeduplication found accepted already: nil returned, nothing routed">dup&#173;licates</th>
      <th>bindings (queue, keys or arguments)</th>
    </tr></thead>
    <tbody><tr><td class="empty" colspan="8">Loading&#8230;</td></tr></tbody>
  </table>
</section>
<section>
  <h2>Dead letters <span class="count" id="dead-total"></span> <span class="count" id="dead-summary"></span></h2>
  <table id="groups">
    <thead><tr>
      <th>queue</th><th class="n">total</th><th>reason</th><th class="n" title="the queue's count of this reason">count</th>
      <th class="n" title="among the recent dead letters below">recent</th><th>last</th><th>last error</th><th>last outcome</th>
    </tr></thead>
    <tbody><tr><td class="empty" colspan="8">Loading&#8230;</td></tr></tbody>
  </table>
  <h3>Most recent <span class="count" id="dead-count"></span></h3>
  <table id="dead">
    <thead><tr>
      <th>time</th><th>queue</th><th>reason</th><th>exchange / routing key</th><th class="n">message, attempts</th>
      <th>last error</th><th>outcome</th>
    </tr></thead>
    <tbody><tr><td class="empty" colspan="7">Loading&#8230;</td></tr></tbody>
  </table>
</section>
<footer><span id="mode">Read-only.</span> <span id="refresh">refreshes every second</span> &#183; <a href="api/overview">JSON</a> &#183; <a href="healthz">health</a></footer>
`

// buildPage returns the whole page, with the actions' token ("" without
// actions) in a meta tag.
func buildPage(token string) []byte {
	meta := ""
	if token != "" {
		meta = `<meta name="tinymq-token" content="` + html.EscapeString(token) + `">` + "\n"
	}
	return []byte(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
` + meta + `<title>TinyMQ admin</title>
<link rel="icon" href="data:,">
<style>` + pageStyle + `</style>
</head>
` + pageBody + `<script>` + pageScript + `</script>
</body>
</html>
`)
}

// pageCSP allows the page's own inline style and script (by hash), fetches
// to its own origin, and nothing else.
var pageCSP = "default-src 'none'; script-src '" + cspHash(pageScript) + "'; style-src '" + cspHash(pageStyle) +
	"'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// cspHash returns the CSP source expression for an inline element's text.
func cspHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}
