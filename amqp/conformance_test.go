package amqp_test

import (
	"testing"

	"github.com/tinymq/tinymq"
	"github.com/tinymq/tinymq/mqtest"
)

// Broker says how the engine differs from the in-memory MQ; each difference
// is listed in README.md.
var Broker = mqtest.Capabilities{
	StopDrains:     false, // queues live in the broker and outlive the MQ
	Filter:         false, // the broker routes
	Block:          false, // a broker cannot make a publisher wait for room
	UnnamedQueues:  false, // a shared queue needs a name every process agrees on
	SequentialIDs:  false, // IDs are unique, not counted per exchange
	DelayedNoRoute: false, // a delayed message is routed when its delay ends
	JobFeatures:    false, // timeouts, rate limits, groups and deduplication are the in-memory MQ's
}

func TestConformance(t *testing.T) {
	mqtest.Run(t, func(t *testing.T) *tinymq.MQ { return newMQ(t) }, Broker)
}
