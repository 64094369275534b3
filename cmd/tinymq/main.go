// Command tinymq inspects a TinyMQ data directory offline and operates a
// running MQ through its admin page.
//
// Offline, on a data directory (read-only: it never writes, repairs or
// locks it, and says when another process holds it):
//
//	tinymq inspect DIR          durable queues, segments, the check of every record
//	tinymq dump DIR QUEUE       a queue's messages as JSON lines
//
// Against the admin page of a running MQ (admin.Handler with
// admin.WithActions for the actions), like rabbitmqadmin:
//
//	tinymq -url URL queues
//	tinymq -url URL peek QUEUE [-n N]
//	tinymq -url URL purge QUEUE
//	tinymq -url URL delete QUEUE [-if-unused] [-if-empty]
//	tinymq -url URL replay QUEUE -n N
//	tinymq -url URL pause QUEUE
//	tinymq -url URL resume QUEUE
//
// Every command prints a table, or JSON with -json. Names, keys, headers and
// payloads are shown with control characters, escape sequences and invalid
// UTF-8 escaped. The exit status is 0 on success, 1 when the command failed
// (or inspect found damage), 2 for a usage error; errors go to stderr.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `usage: tinymq [-url URL] [-json] [-timeout D] COMMAND [ARGS]

Offline, on a data directory (read-only; works while an MQ holds it, and says so):
  inspect DIR                 durable queues (depth, oldest message's age, deleted),
                              segments and sizes, and the check of every record's CRC
  dump DIR QUEUE              the queue's pending messages as JSON lines: id, exchange,
                              routing_key, headers, attempt, deaths, and body (JSON) or
                              body_base64

Against a running MQ's admin page (-url, e.g. http://127.0.0.1:8080/debug/tinymq/):
  queues                      name, depth, ready, in flight, consumers, paused, rates
  peek QUEUE [-n N]           the first N waiting messages (default 10, at most 100)
  purge QUEUE                 remove every waiting message
  delete QUEUE [-if-unused] [-if-empty]
                              delete the queue (refused if it has a consumer / messages)
  replay QUEUE -n N           move N dead letters back to where they died
  pause QUEUE, resume QUEUE   stop / restart deliveries

Flags (before the command, or after it):
  -url URL      the admin page (the actions need admin.WithActions)
  -json         print JSON instead of a table
  -timeout D    for each HTTP request (default 10s)

Exit status: 0 success, 1 failure (or damage found by inspect), 2 usage error.
`

// errUsage marks a usage error: exit status 2.
var errUsage = errors.New("usage")

// cli is one run of the command: its flags and its output streams.
type cli struct {
	stdout, stderr io.Writer
	url            string
	json           bool
	timeout        time.Duration
	n              int
	nSet           bool
	ifUnused       bool
	ifEmpty        bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr, timeout: 10 * time.Second}
	pos, err := c.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if err == nil {
		err = c.dispatch(pos)
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "tinymq: %s\n\n%s", escape(err.Error()), usage)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "tinymq: %s\n", escape(err.Error()))
		return exitFail
	}
}

// parse reads the flags wherever they are among args, and returns the
// positional arguments.
func (c *cli) parse(args []string) ([]string, error) {
	fs := flag.NewFlagSet("tinymq", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.url, "url", "", "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "")
	fs.Func("n", "", func(s string) error {
		_, err := fmt.Sscan(s, &c.n)
		c.nSet = true
		return err
	})
	fs.BoolVar(&c.ifUnused, "if-unused", false, "")
	fs.BoolVar(&c.ifEmpty, "if-empty", false, "")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// dispatch runs the command pos[0].
func (c *cli) dispatch(pos []string) error {
	if len(pos) == 0 {
		return fmt.Errorf("%w: no command", errUsage)
	}
	cmd, args := pos[0], pos[1:]
	want := func(n int, what string) error {
		if len(args) != n {
			return fmt.Errorf("%w: %s takes %s", errUsage, cmd, what)
		}
		return nil
	}
	switch cmd {
	case "inspect":
		if err := want(1, "DIR"); err != nil {
			return err
		}
		return c.inspect(args[0])
	case "dump":
		if err := want(2, "DIR QUEUE"); err != nil {
			return err
		}
		return c.dump(args[0], args[1])
	case "queues":
		if err := want(0, "no argument"); err != nil {
			return err
		}
		return c.queues()
	case "peek", "purge", "delete", "replay", "pause", "resume":
		if err := want(1, "QUEUE"); err != nil {
			return err
		}
		return c.action(cmd, args[0])
	case "help":
		fmt.Fprint(c.stdout, usage)
		return nil
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}
