package tinymq

import (
	"context"
	"fmt"
	"sync"
)

// boundEngines maps each Engine value that an MQ took to that MQ, until the
// MQ's Shutdown returned: an Engine serves one MQ (see [WithEngine]), and a
// second MQ given the same value must fail on its own, not break the first.
var boundEngines sync.Map

// bindEngine returns the engine that m runs on: e, or, when e serves another
// MQ that has not shut down, an engine whose every call fails with an error
// wrapping ErrInvalidOption, and whose Init is not called. An Engine value
// that cannot be a map key (a struct holding a slice, say) is not tracked.
func bindEngine(m *MQ, e Engine) (run Engine, bound bool) {
	defer func() {
		if recover() != nil { // hash of an unhashable value
			run, bound = e, false
		}
	}()
	if other, loaded := boundEngines.LoadOrStore(e, m); loaded && other != m {
		return refusedEngine{fmt.Errorf("%w: WithEngine: the Engine serves another MQ that has not shut down; give each MQ an Engine option of its own", ErrInvalidOption)}, false
	}
	return e, true
}

// unbindEngine lets e serve another MQ once m has shut down (an engine that
// shut down refuses a second MQ itself, or serves it).
func unbindEngine(m *MQ, e Engine) {
	defer func() { _ = recover() }()
	boundEngines.CompareAndDelete(e, m)
}

// refusedEngine is the engine of an MQ whose Engine serves another MQ.
type refusedEngine struct{ err error }

func (refusedEngine) Init(EngineConfig)                             {}
func (r refusedEngine) DeclareExchange(ExchangeSpec) error          { return r.err }
func (r refusedEngine) DeclareQueue(QueueSpec) error                { return r.err }
func (r refusedEngine) Bind(BindingSpec) error                      { return r.err }
func (r refusedEngine) Unbind(BindingSpec) error                    { return r.err }
func (r refusedEngine) DeleteQueue(string, bool, bool) (int, error) { return 0, r.err }
func (r refusedEngine) PurgeQueue(string) (int, error)              { return 0, r.err }
func (r refusedEngine) DeleteExchange(string, bool) error           { return r.err }
func (r refusedEngine) PauseQueue(string) error                     { return r.err }
func (r refusedEngine) ResumeQueue(string) error                    { return r.err }
func (r refusedEngine) Publish(context.Context, Publishing) error   { return r.err }
func (r refusedEngine) Start(context.Context) error                 { return r.err }
func (refusedEngine) Shutdown(context.Context) error                { return nil }
func (refusedEngine) Stats() Stats                                  { return Stats{} }
func (r refusedEngine) Consume(string, ConsumerFunc, int) (EngineSubscription, error) {
	return nil, r.err
}
