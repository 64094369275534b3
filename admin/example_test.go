package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

// Mount the admin page under a prefix, as net/http/pprof is mounted, and
// read the JSON that the page polls.
func ExampleHandler() {
	mq := tinymq.New()
	_ = mq.RegisterQueue("user.created", tinymq.Fanout, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("welcome-email"))
	_ = mq.Publish("user.created", "ada@example.com") // waits for Start
	defer mq.Stop()

	mux := http.NewServeMux()
	mux.Handle("/debug/tinymq/", http.StripPrefix("/debug/tinymq", admin.Handler(mq)))
	// In a program: http.ListenAndServe("127.0.0.1:6060", mux), behind your
	// own authentication. It is read-only: admin.WithActions adds purge,
	// delete, pause, resume, replay and peek.

	// The handler answers loopback names only, unless told otherwise
	// (admin.WithAllowedHosts): a request as from a browser on this machine.
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost/debug/tinymq/api/overview", nil))
	var ov struct {
		Queues []struct {
			Name  string `json:"name"`
			Depth int    `json:"depth"`
		} `json:"queues"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &ov)
	for _, q := range ov.Queues {
		fmt.Printf("%s: %d waiting\n", q.Name, q.Depth)
	}

	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "http://localhost/debug/tinymq/api/overview", nil))
	fmt.Println("POST:", rec.Code)
	// Output:
	// welcome-email: 1 waiting
	// POST: 405
}
