// Package admin serves a live view of a TinyMQ: its exchanges and bindings,
// its queues with their depth, counters, rates, consumer-time percentiles and
// sparklines of the last minutes, and its dead letters grouped by queue and
// reason; and, when asked to, the operators' actions: purge, delete, pause,
// resume, replay dead letters and peek.
//
// [Handler] returns an [net/http.Handler] that serves one HTML page (no
// external assets) and the JSON it polls. Mount it the way net/http/pprof is
// mounted, under any prefix; every link in the page is relative:
//
//	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", admin.Handler(mq)))
//
// It is read-only unless [WithActions] is given:
//
//	admin.Handler(mq, admin.WithActions(), admin.WithAuthorize(mayOperate))
//
// # Routes
//
// Relative to where the handler is mounted:
//
//   - GET / — the HTML page; it fetches api/overview every second (see
//     [WithRefresh]) and redraws itself.
//   - GET /api/overview — the JSON: totals, one page of queues
//     (configuration, the job-queue settings of [tinymq.QueueInfo] among it,
//     depth, ready, scheduled, in flight, abandoned, every counter of
//     [tinymq.QueueStats], rates, consumer-time percentiles, history), one
//     page of exchanges (kind, alternate, deduplication window, the first
//     bindings, published, unroutable and duplicate counts, rates), the dead
//     letters' totals and groups, and
//     the recent dead letters. Parameters: limit and offset (queues, 100 and
//     0 by default, at most 1000), sort (name, depth or rate; registration
//     order when absent), order (asc or desc), filter (a substring of the
//     name, without regard to case), exchange_limit, exchange_offset,
//     exchange_filter, and queue (a queue to describe as "selected").
//   - GET /api/bindings?exchange=NAME — every binding of one exchange,
//     paged with offset and limit.
//   - GET /healthz — readiness: 200 while [tinymq.MQ.Health] is nil (started,
//     not stopping, its log healthy), else 503, with a small JSON body.
//   - POST /api/purge, /api/delete, /api/pause, /api/resume, /api/replay,
//     /api/peek, each with ?queue=NAME — the actions, with [WithActions]
//     only (404 Not Found without it). replay takes n (1 to 10,000,
//     required), peek n (1 to 100, default 10), delete if_unused=1 and
//     if_empty=1. Each answers with JSON: the action, the queue, the count
//     of messages removed, moved or shown, and the error's text if any.
//
// Any other path is 404 Not Found; a method the route does not take is 405
// Method Not Allowed.
//
// # Actions
//
// Each action calls one method of the MQ: [tinymq.MQ.PurgeQueue],
// [tinymq.MQ.DeleteQueue] (with [tinymq.IfUnused], [tinymq.IfEmpty]),
// [tinymq.MQ.PauseQueue], [tinymq.MQ.ResumeQueue],
// [tinymq.MQ.ReplayDeadLetters] and [tinymq.MQ.Peek], and blocks as long as
// it does. The MQ's errors map to HTTP statuses: an unknown queue is 404,
// [tinymq.ErrInUse], [tinymq.ErrNotEmpty] and [tinymq.ErrNoDeath] (and a
// replay that the destination refused) are 409 Conflict, [tinymq.ErrStopped]
// is 503, [tinymq.ErrUnsupported] (an engine) is 501, bad arguments are 400,
// and anything else (a log that failed) is 500; a replay or a durable purge
// that failed part way reports the count it did as well. After Stop every
// action but peek returns 503; peek shows what Stop left.
//
// Peek shows each message's metadata: ID, exchange and routing key, headers,
// attempt, death records and size. Its payload is shown only with
// [WithPayloads] as well, because payloads often hold personal data.
//
// # Security
//
// The handler has no authentication of its own: mount it behind yours, or on
// a loopback-only listener. Against the browser-borne attacks that a page on
// localhost invites, it checks, in this order:
//
//   - Host, on every request, GETs included: only the names of
//     [WithAllowedHosts] (by default localhost, 127.0.0.1 and [::1], any
//     port) are answered, else 403. A page of another site whose name was
//     re-pointed at this address (DNS rebinding) can neither read the page
//     and its token nor act.
//   - For an action: the method (POST), the origin (a request that the
//     browser marks as not same-origin, by Sec-Fetch-Site or Origin, is
//     refused with 403, as [net/http.CrossOriginProtection] refuses it), and
//     the handler's token: a random value made by [Handler], put in the page
//     in a meta tag and required in the X-TinyMQ-Token header. A forged
//     cross-site form or fetch has neither the origin nor the token.
//   - Then the application's [AuthorizeFunc] ([WithAuthorize]), which sees
//     the request, the action and the queue and may refuse with 403 and its
//     own message.
//
// Queue and exchange names, keys, headers, payloads and error texts are
// treated as hostile: the JSON escapes them, the page inserts them as text
// only (never as HTML) and is served with a Content-Security-Policy that
// allows its own inline script and style and nothing else. Every string is
// cut to 256 bytes (a payload to 4 KiB), and each list of a response has a
// byte budget (2 MiB of queues, 1 MiB of exchanges or bindings, 1 MiB of
// dead letters): a page that would be longer ends early, "truncated" is
// true and next_offset says where the rest begins, so paging reaches every
// item.
//
// # Rates and history
//
// Rates (messages per second) are computed from [tinymq.MQ.Stats] snapshots
// taken when api/overview is requested: the handler keeps at most 9
// snapshots with their times and divides the change in each counter since
// the newest snapshot at least [WithRateWindow] old (else the oldest kept)
// by the time between them. The sparklines come from a history of 60 steps
// of 5 seconds (the last five minutes) of each queue's depth and published
// and delivered rates, written by the first request in each step; a step in
// which no request came is empty. The handler starts no goroutine, so there
// is nothing to close; rates are null until a second request comes. What it
// keeps is bounded by the number of queues: about 2 KB each.
package admin
