package tinymq

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"weak"
)

// boundEngines maps each Engine that an MQ took to a weak pointer to that
// MQ, until the MQ's Shutdown returned nil (or the MQ was collected without
// one): an Engine serves one MQ (see [WithEngine]), and a second MQ given the
// same one must fail on its own, not break the first. Only engines that are
// pointers to values of non-zero size are tracked: two pointers to distinct
// zero-size values may be equal, and a value type is copied, not shared.
var boundEngines sync.Map // Engine -> weak.Pointer[MQ]

// trackable reports whether e can be told apart from every other Engine by
// its value.
func trackable(e Engine) bool {
	t := reflect.TypeOf(e)
	return t.Kind() == reflect.Pointer && t.Elem().Size() > 0 && !reflect.ValueOf(e).IsNil()
}

// bindEngine returns the engine that m runs on: e, or, when e serves another
// MQ that has not shut down, an engine whose every call fails with an error
// wrapping ErrInvalidOption, and whose Init is not called. bound reports
// whether m holds e in boundEngines.
func bindEngine(m *MQ, e Engine) (run Engine, bound bool) {
	if !trackable(e) {
		return e, false
	}
	mine := weak.Make(m)
	for {
		other, loaded := boundEngines.LoadOrStore(e, mine)
		if !loaded {
			break
		}
		if other.(weak.Pointer[MQ]).Value() != nil {
			return refusedEngine{fmt.Errorf("%w: WithEngine: the Engine serves another MQ that has not shut down; give each MQ an Engine option of its own", ErrInvalidOption)}, false
		}
		// Its MQ was collected without a Shutdown: e is free.
		if boundEngines.CompareAndSwap(e, other, mine) {
			break
		}
	}
	// An MQ dropped without a Shutdown frees e when it is collected (e does
	// not keep m alive: see MQ.init's Forget).
	runtime.AddCleanup(m, func(e Engine) { boundEngines.CompareAndDelete(e, mine) }, e)
	return e, true
}

// unbindEngine lets e serve another MQ once m has shut down.
func unbindEngine(m *MQ, e Engine) {
	boundEngines.CompareAndDelete(e, weak.Make(m))
}

// finalStats returns e's Stats, which the MQ keeps once it has shut down and
// let e go, or none when e's Stats panics (it is user code; the MQ's
// Shutdown must not panic for it).
func finalStats(e Engine) (st Stats) {
	defer func() {
		if recover() != nil {
			st = Stats{}
		}
	}()
	return e.Stats()
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
