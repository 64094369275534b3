package guard

import (
	"bytes"
	"runtime"
	"sync"
)

// Owned is the set of an engine's own goroutines that run user code, by
// goroutine id. The zero value is an empty set, ready to use; its methods
// are safe for concurrent use. An Owned must not be copied after first use.
type Owned struct {
	ids sync.Map // uint64 -> struct{}
}

// Enter adds the calling goroutine to the set and returns its id, for
// [Owned.Leave]: defer o.Leave(o.Enter()). It costs a [Goid].
func (o *Owned) Enter() uint64 {
	id := Goid()
	o.ids.Store(id, struct{}{})
	return id
}

// Leave removes the goroutine of id, from [Owned.Enter], from the set.
func (o *Owned) Leave(id uint64) { o.ids.Delete(id) }

// Mine reports whether the calling goroutine is in the set. It costs a
// [Goid].
func (o *Owned) Mine() bool {
	_, ok := o.ids.Load(Goid())
	return ok
}

// Guard is the one place where an engine's own goroutines run user code
// other than a consumer's (loggers, codecs, the methods of a consumer's error
// or panic value): it calls fn on a goroutine of its own, counted in the set,
// and waits for it. It returns the value of a panic in fn (recovered), and
// whether fn returned; a runtime.Goexit in fn ends only that goroutine. The
// caller should hold no lock that fn may need, as fn may call back into the
// engine; a fn that blocks holds its caller, as a consumer that blocks holds
// its worker. It costs a goroutine and a [Goid], about a microsecond.
func (o *Owned) Guard(fn func()) (panicked any, returned bool) {
	done := make(chan struct{})
	go func() {
		id := o.Enter()
		defer func() {
			if !returned {
				panicked = recover()
			}
			o.Leave(id)
			close(done)
		}()
		fn()
		returned = true
	}()
	<-done
	return panicked, returned
}

// Goid returns the calling goroutine's id, read from the first line of its
// stack ("goroutine 42 [running]:"). It costs about a microsecond, so call it
// when a goroutine starts and when stopping, never per message.
func Goid() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	var id uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}
