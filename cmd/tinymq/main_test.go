package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/admin"
)

// bin is the tinymq binary that TestMain builds: the tests run it as a user
// would, as another process.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tinymq-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "tinymq")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// result is what one run of the binary printed and its exit status.
type result struct {
	stdout, stderr string
	code           int
}

func tinymqRun(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running tinymq %q: %v", args, err)
	}
	return r
}

// hostile is a queue name with a newline, a tab and an ANSI escape.
const hostile = "evil\x1b[31m\n\tq"

// noRawControl fails if s holds a control character other than the
// newlines and the tabwriter's spaces of the output's own layout.
func noRawControl(t *testing.T, s string) {
	t.Helper()
	for _, line := range strings.Split(s, "\n") {
		for _, r := range line {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("raw control character %q in output line %q", r, line)
			}
		}
	}
}

// rawCodec stores []byte payloads as they are, so that a body need not be
// JSON; everything else as JSON.
type rawCodec struct{ tinymq.JSONCodec }

func (c rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return c.JSONCodec.Marshal(v)
}

// writeDataDir writes dir with a real MQ: on topic exchange "shop", durable
// queue "orders" with three waiting messages (the last one's body is not
// JSON), "audit" that acknowledged all of them, "retry" that failed the
// first and waits an hour to retry it, "gone", deleted with its messages, and
// the hostile queue with one message of a hostile routing key.
func writeDataDir(t *testing.T, dir string) {
	t.Helper()
	m := tinymq.New(tinymq.WithDataDir(dir), tinymq.WithCodec(rawCodec{}))
	bind := tinymq.WithBindingKey("#")
	require.NoError(t, m.DeclareQueue("orders", "shop", tinymq.Topic, tinymq.WithDurable(), bind))
	require.NoError(t, m.DeclareQueue("gone", "shop", tinymq.Topic, tinymq.WithDurable(), bind))
	require.NoError(t, m.DeclareQueue(hostile, "evil", tinymq.Fanout, tinymq.WithDurable()))
	require.NoError(t, m.RegisterQueue("shop", tinymq.Topic, func(context.Context, *tinymq.Msg) error { return nil }, 1,
		tinymq.WithQueueName("audit"), tinymq.WithDurable(), bind))
	failed := make(chan struct{}, 3)
	require.NoError(t, m.RegisterQueue("shop", tinymq.Topic, func(context.Context, *tinymq.Msg) error {
		failed <- struct{}{}
		return errors.New("not now")
	}, 1, tinymq.WithQueueName("retry"), tinymq.WithDurable(), tinymq.WithBindingKey("eu.#"),
		tinymq.WithRetry(tinymq.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Hour})))
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Publish("shop", map[string]any{"id": 1}, tinymq.WithRoutingKey("eu.fr"), tinymq.WithHeaders(map[string]any{"n": int32(1)})))
	require.NoError(t, m.Publish("shop", "two", tinymq.WithRoutingKey("us.ny")))
	require.NoError(t, m.Publish("shop", []byte{0xff, 0x00, '\n'}, tinymq.WithRoutingKey("us.ca")))
	require.NoError(t, m.Publish("evil", "x", tinymq.WithRoutingKey("\x1b[2J\r\n")))
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry queue's consumer never ran")
	}
	require.Eventually(t, func() bool {
		st := m.Stats().Queues
		return st["audit"].Succeeded == 3 && st["retry"].Scheduled == 1
	}, 10*time.Second, time.Millisecond)
	_, err := m.DeleteQueue("gone")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.Shutdown(ctx)
	m.Stop()
}

// snapshot is every file of dir with its content and modification time.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		info, err := e.Info()
		require.NoError(t, err)
		out[e.Name()] = string(b) + "|" + info.ModTime().String()
	}
	return out
}

func TestUsageIsPrintedOnRequestAndOnMisuse(t *testing.T) {
	r := tinymqRun(t, "-h")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "usage: tinymq")
	assert.Contains(t, r.stdout, "inspect DIR")

	for _, args := range [][]string{{}, {"frobnicate"}, {"inspect"}, {"dump", "dir"}, {"-bogus", "queues"},
		{"queues"}, {"-url", "ftp://x", "queues"}, {"-url", "http://127.0.0.1:1/", "replay", "q"}} {
		r := tinymqRun(t, args...)
		assert.Equal(t, exitUsage, r.code, "%q", args)
		assert.Empty(t, r.stdout, "%q", args)
		assert.Contains(t, r.stderr, "usage: tinymq", "%q", args)
	}
}

func TestInspectShowsQueuesSegmentsAndTheCheck(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	before := snapshot(t, dir)

	r := tinymqRun(t, "inspect", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Empty(t, r.stderr)
	assert.Contains(t, r.stdout, "in use:         no")
	assert.Regexp(t, `(?m)^orders +3 +\d+s +declared$`, r.stdout)
	assert.Regexp(t, `(?m)^retry +1 `, r.stdout)
	assert.Regexp(t, `(?m)^gone +0 +- +deleted$`, r.stdout)
	assert.Contains(t, r.stdout, "00000000000000000001.wal")
	assert.Regexp(t, `check: ok: \d+ records, every CRC valid`, r.stdout)
	assert.Contains(t, r.stdout, `evil\x1b[31m\n\tq`, "the hostile name is shown escaped")
	noRawControl(t, r.stdout)
	assert.Equal(t, before, snapshot(t, dir), "inspect changes nothing")

	r = tinymqRun(t, "-json", "inspect", dir)
	require.Equal(t, 0, r.code, r.stderr)
	var out inspectJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	assert.False(t, out.InUse)
	assert.True(t, out.Check.OK)
	assert.Positive(t, out.Check.Records)
	assert.NotEmpty(t, out.Segments)
	byName := make(map[string]queueJSON)
	for _, q := range out.Queues {
		byName[q.Name] = q
	}
	assert.Equal(t, 3, byName["orders"].Depth)
	if assert.NotNil(t, byName["orders"].OldestAgeSeconds) {
		assert.Less(t, *byName["orders"].OldestAgeSeconds, 600.0)
	}
	assert.True(t, byName["gone"].Deleted)
	assert.Equal(t, 1, byName[hostile].Depth, "JSON keeps the name exact")
}

func TestInspectOfADirectoryHeldByAnotherMQ(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	m := tinymq.New(tinymq.WithDataDir(dir))
	require.NoError(t, m.DeclareQueue("orders", "shop", tinymq.Topic, tinymq.WithDurable(), tinymq.WithBindingKey("#")))
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()

	pid := strconv.Itoa(os.Getpid())
	r := tinymqRun(t, "inspect", dir)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "in use:         yes, by process "+pid)
	assert.Contains(t, r.stderr, "is in use by process "+pid)
	assert.Regexp(t, `(?m)^orders +3 `, r.stdout)

	r = tinymqRun(t, "-json", "inspect", dir)
	require.Equal(t, 0, r.code, r.stderr)
	var out inspectJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	assert.True(t, out.InUse)
	assert.Equal(t, os.Getpid(), out.PID)

	r = tinymqRun(t, "dump", dir, "orders")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, 3, strings.Count(r.stdout, "\n"))
	assert.Contains(t, r.stderr, "is in use by process "+pid)

	require.NoError(t, m.Publish("shop", "after", tinymq.WithRoutingKey("x")), "the holder is undisturbed")
	assert.Eventually(t, func() bool { return m.Stats().Queues["orders"].Depth == 4 }, 10*time.Second, time.Millisecond)
}

func TestInspectReportsDamageWithoutRepairing(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	seg := filepath.Join(dir, "00000000000000000001.wal")
	b, err := os.ReadFile(seg)
	require.NoError(t, err)
	b[40] ^= 0xff
	require.NoError(t, os.WriteFile(seg, b, 0o600))
	before := snapshot(t, dir)

	r := tinymqRun(t, "inspect", dir)
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stdout, "check: DAMAGED")
	assert.Contains(t, r.stdout, "00000000000000000001.wal at offset 32")
	assert.Contains(t, r.stderr, "the log is damaged")

	r = tinymqRun(t, "-json", "inspect", dir)
	assert.Equal(t, exitFail, r.code)
	var out inspectJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	assert.False(t, out.Check.OK)
	assert.NotEmpty(t, out.Check.Damage)
	assert.Equal(t, before, snapshot(t, dir), "nothing is repaired")
}

func TestInspectAndDumpFailOnStderr(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none")
	r := tinymqRun(t, "inspect", missing)
	assert.Equal(t, exitFail, r.code)
	assert.Empty(t, r.stdout)
	assert.Contains(t, r.stderr, "tinymq: ")
	_, err := os.Stat(missing)
	assert.True(t, os.IsNotExist(err), "inspect creates nothing")

	dir := t.TempDir()
	writeDataDir(t, dir)
	r = tinymqRun(t, "dump", dir, "nope")
	assert.Equal(t, exitFail, r.code)
	assert.Empty(t, r.stdout)
	assert.Contains(t, r.stderr, "unknown queue")
}

func TestDumpWritesTheMessagesAsJSONLines(t *testing.T) {
	dir := t.TempDir()
	writeDataDir(t, dir)
	r := tinymqRun(t, "dump", dir, "orders")
	require.Equal(t, 0, r.code, r.stderr)
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		lines = append(lines, m)
	}
	require.Len(t, lines, 3)
	assert.EqualValues(t, 1, lines[0]["id"])
	assert.Equal(t, "shop", lines[0]["exchange"])
	assert.Equal(t, "eu.fr", lines[0]["routing_key"])
	assert.Equal(t, map[string]any{"n": 1.0}, lines[0]["headers"])
	assert.Equal(t, map[string]any{"id": 1.0}, lines[0]["body"], "a JSON body is shown as JSON")
	assert.Equal(t, []any{}, lines[0]["deaths"])
	assert.Equal(t, "two", lines[1]["body"])
	assert.Nil(t, lines[2]["body"])
	assert.Equal(t, "/wAK", lines[2]["body_base64"], "a body that is not JSON is base64")

	r = tinymqRun(t, "dump", dir, "retry")
	require.Equal(t, 0, r.code, r.stderr)
	var m dumpMsg
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &m))
	assert.Equal(t, 1, m.Attempt, "the attempt the queue saved")

	r = tinymqRun(t, "dump", dir, hostile)
	require.Equal(t, 0, r.code, r.stderr)
	noRawControl(t, r.stdout)
	require.Equal(t, 1, strings.Count(r.stdout, "\n"), "one line: the newline in the key is escaped")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &m))
	assert.Equal(t, "\x1b[2J\r\n", m.RoutingKey)
}

// adminServer serves the admin page, with actions and payloads, of an MQ
// with queue "work" (three messages, no consumer), the hostile queue (a
// message with a hostile key and payload), and "parking", which holds two
// dead letters of "jobs".
func adminServer(t *testing.T, opts ...admin.Option) (*httptest.Server, *tinymq.MQ) {
	t.Helper()
	m := tinymq.New()
	require.NoError(t, m.DeclareQueue("work", "in", tinymq.Fanout))
	require.NoError(t, m.DeclareQueue(hostile, "evil", tinymq.Fanout))
	require.NoError(t, m.DeclareQueue("parking", "dlx", tinymq.Fanout))
	require.NoError(t, m.RegisterQueue("jobs", tinymq.Fanout, func(context.Context, *tinymq.Msg) error {
		return fmt.Errorf("no: %w", tinymq.ErrPermanent)
	}, 1, tinymq.WithQueueName("jobs"), tinymq.WithDeadLetter("dlx", "")))
	require.NoError(t, m.Start(context.Background()))
	for i := range 3 {
		require.NoError(t, m.Publish("in", map[string]int{"i": i}, tinymq.WithHeaders(map[string]any{"k": "v\x1b"})))
	}
	require.NoError(t, m.Publish("evil", "\x1b]0;pwned\x07\n", tinymq.WithRoutingKey("\x1b[2J")))
	require.NoError(t, m.Publish("jobs", 1))
	require.NoError(t, m.Publish("jobs", 2))
	require.Eventually(t, func() bool { return m.Stats().Queues["parking"].Depth == 2 }, 10*time.Second, time.Millisecond)
	if opts == nil {
		opts = []admin.Option{admin.WithActions(), admin.WithPayloads()}
	}
	srv := httptest.NewServer(admin.Handler(m, opts...))
	t.Cleanup(func() {
		srv.Close()
		m.Stop()
	})
	return srv, m
}

func TestQueuesListsEveryQueue(t *testing.T) {
	srv, _ := adminServer(t)
	r := tinymqRun(t, "-url", srv.URL, "queues")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^NAME +DEPTH +READY +IN FLIGHT +CONSUMERS +PAUSED +PUBLISHED/S +DELIVERED/S$`, r.stdout)
	assert.Regexp(t, `(?m)^work +3 +3 +0 +0 +no `, r.stdout)
	assert.Regexp(t, `(?m)^parking +2 `, r.stdout)
	assert.Contains(t, r.stdout, `evil\x1b[31m\n\tq`)
	noRawControl(t, r.stdout)

	r = tinymqRun(t, "queues", "-json", "-url", srv.URL)
	require.Equal(t, 0, r.code, r.stderr)
	var qs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &qs))
	names := make([]string, 0, len(qs))
	for _, q := range qs {
		names = append(names, q["name"].(string))
	}
	assert.ElementsMatch(t, []string{"work", hostile, "parking", "jobs"}, names)
}

func TestActionsChangeTheQueueAndSayWhat(t *testing.T) {
	srv, m := adminServer(t)
	u := srv.URL + "/" // a trailing slash or none: the same page

	r := tinymqRun(t, "-url", u, "peek", "work", "-n", "2")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `(?m)^ID +EXCHANGE +ROUTING KEY +ATTEMPT +REDELIVERED +SIZE +TYPE +DEATHS +HEADERS +PAYLOAD$`, r.stdout)
	assert.Regexp(t, `(?m)^1 +in `, r.stdout)
	assert.Regexp(t, `(?m)^2 +in `, r.stdout)
	assert.NotRegexp(t, `(?m)^3 +in `, r.stdout)
	assert.Contains(t, r.stdout, `k="v\x1b"`, "the page shows header values quoted")
	noRawControl(t, r.stdout)

	r = tinymqRun(t, "-url", u, "-json", "peek", "work")
	require.Equal(t, 0, r.code, r.stderr)
	var res actionResult
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	assert.Equal(t, 3, res.Count)
	assert.Len(t, res.Messages, 3)

	r = tinymqRun(t, "-url", u, "pause", "work")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "work: paused\n", r.stdout)
	assert.True(t, m.Stats().Queues["work"].Paused)
	r = tinymqRun(t, "-url", u, "-json", "resume", "work")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	assert.Equal(t, "resume", res.Action)
	require.NotNil(t, res.Paused)
	assert.False(t, *res.Paused)

	r = tinymqRun(t, "-url", u, "delete", "work", "-if-empty")
	assert.Equal(t, exitFail, r.code)
	assert.Empty(t, r.stdout)
	assert.Contains(t, r.stderr, "409")
	assert.Contains(t, r.stderr, "not empty")
	assert.Equal(t, 3, m.Stats().Queues["work"].Depth, "refused: nothing changed")

	r = tinymqRun(t, "-url", u, "purge", "work")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "purged work: 3 messages removed\n", r.stdout)

	r = tinymqRun(t, "-url", u, "delete", "work", "-if-empty", "-if-unused")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "deleted work: 0 waiting messages removed\n", r.stdout)
	_, ok := m.Stats().Queues["work"]
	assert.False(t, ok)

	r = tinymqRun(t, "-url", u, "-json", "delete", "work")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "404")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), "-json prints the error answer too")
	assert.Contains(t, res.Error, "unknown queue")

	r = tinymqRun(t, "-url", u, "replay", "parking", "-n", "1")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "replayed 1 dead letters of parking\n", r.stdout)
	assert.Equal(t, uint64(1), m.Stats().Queues["parking"].Replayed)
}

func TestHostileNamesAndPayloadsAreEscaped(t *testing.T) {
	srv, _ := adminServer(t)
	r := tinymqRun(t, "-url", srv.URL, "peek", hostile)
	require.Equal(t, 0, r.code, r.stderr)
	noRawControl(t, r.stdout)
	assert.Contains(t, r.stdout, `\x1b[2J`, "the routing key")
	assert.Contains(t, r.stdout, `\x1b]0;pwned\a\n`, "the payload")
	assert.Contains(t, r.stdout, `of evil\x1b[31m\n\tq`)

	r = tinymqRun(t, "-url", srv.URL, "purge", "nope\x1b[5m")
	assert.Equal(t, exitFail, r.code)
	noRawControl(t, r.stderr)
	assert.Contains(t, r.stderr, `nope\x1b[5m`)
}

func TestActionsNeedTheActionsOfThePage(t *testing.T) {
	srv, _ := adminServer(t, admin.WithRefresh(time.Second))
	r := tinymqRun(t, "-url", srv.URL, "purge", "work")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "WithActions")

	r = tinymqRun(t, "-url", srv.URL, "queues")
	assert.Equal(t, 0, r.code, "the read-only page lists the queues: %s", r.stderr)

	r = tinymqRun(t, "-url", "http://127.0.0.1:1/", "queues")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "tinymq: ")
}
