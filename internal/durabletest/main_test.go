// Black-box tests of what the README promises about durable queues across
// restarts, kill -9 and Shutdown deadlines: restored backlogs (order, TTLs,
// retry states, deaths, DropHead, typed consumers, atomic dead-letter moves
// under SIGKILL) and durable publishes racing Stop, Shutdown, RegisterQueue
// and Bind (every nil publish accounted for, no ErrStopped one delivered).
package durabletest_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// A child process that is killed with SIGKILL: no leak check.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
