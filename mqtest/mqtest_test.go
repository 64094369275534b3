package mqtest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/mqtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestMemory runs the suite against the in-memory engine: every behaviour it
// checks is what the core promises.
func TestMemory(t *testing.T) {
	mqtest.Run(t, func(*testing.T) *tinymq.MQ { return tinymq.New() }, mqtest.Memory)
}
