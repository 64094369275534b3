// Package admin serves a live, read-only view of a TinyMQ: its exchanges and
// bindings, its queues with their depth, counters, rates and consumer-time
// percentiles, and the latest dead letters.
//
// [Handler] returns an [net/http.Handler] that serves one HTML page (no
// external assets) and the JSON it polls. Mount it the way net/http/pprof is
// mounted, under any prefix; every link in the page is relative:
//
//	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", admin.Handler(mq)))
//
// # Routes
//
// Relative to where the handler is mounted:
//
//   - GET / — the HTML page; it fetches api/overview every second (see
//     [WithRefresh]) and redraws itself.
//   - GET /api/overview — the JSON: exchanges (kind, alternate, bindings,
//     published and unroutable counts and rates), queues (configuration, depth,
//     ready, scheduled, in flight, every counter of [tinymq.QueueStats], rates,
//     consumer-time percentiles) and the recent dead letters.
//
// Any other path is 404 Not Found; any method but GET and HEAD is 405 Method
// Not Allowed. There are no actions: nothing in this package changes the MQ
// (the README says why).
//
// # Rates
//
// Rates (messages per second) are computed from [tinymq.MQ.Stats] snapshots
// taken when api/overview is requested: the handler keeps at most 17
// snapshots with their times and divides the change in each counter since the
// newest snapshot at least [WithRateWindow] old (else the oldest kept) by the
// time between them. The handler starts no goroutine, so there is nothing to
// close; rates are null until a second request comes, and they describe the
// time between requests when requests are rarer than the window.
//
// # Security
//
// The handler has no authentication of its own: mount it behind yours. Queue
// and exchange names, keys, headers and error texts are treated as hostile:
// the JSON escapes them, the page inserts them as text only (never as HTML)
// and is served with a Content-Security-Policy that allows its own inline
// script and style and nothing else. Every string is cut to 256 bytes and a
// response to at most 1 MiB; what does not fit is left out and the JSON says
// "truncated": true.
package admin
