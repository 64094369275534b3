package admin

import (
	"errors"
	"net/http"

	"github.com/tinymq/tinymq"
)

// healthView is the JSON of /healthz; the README documents it.
type healthView struct {
	// Status is "ok", or what makes the MQ not ready: [tinymq.MQ.Health]'s
	// error.
	Status string `json:"status"`
	// Started says whether Start was called, Stopping whether Stop or
	// Shutdown has begun.
	Started  bool `json:"started"`
	Stopping bool `json:"stopping"`
	// Log is "ok", "none" when no queue is durable, or the log's error.
	Log    string `json:"log"`
	Queues int    `json:"queues"`
}

// serveHealth answers readiness: 200 while [tinymq.MQ.Health] is nil, 503
// otherwise (or when reading it panicked).
func (h *handler) serveHealth(w http.ResponseWriter, _ *http.Request) {
	v, err := h.health()
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, healthView{Status: "unknown: " + err.Error(), Log: "unknown"})
		return
	}
	code := http.StatusOK
	if v.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, v)
}

func (h *handler) health() (v healthView, err error) {
	defer func() {
		if recover() != nil {
			err = errCollect
		}
	}()
	v = healthView{Status: "ok", Started: true, Log: "none"}
	topo := h.mq.Topology()
	v.Queues = len(topo.Queues)
	for _, q := range topo.Queues {
		if q.Durable {
			v.Log = "ok"
			break
		}
	}
	herr := h.mq.Health()
	switch {
	case herr == nil:
	case errors.Is(herr, tinymq.ErrNotStarted):
		v.Started = false
	case errors.Is(herr, tinymq.ErrStopped):
		v.Stopping = true
	case errors.Is(herr, tinymq.ErrLog):
		v.Log = herr.Error()
	}
	if herr != nil {
		v.Status = herr.Error()
	}
	return v, nil
}
