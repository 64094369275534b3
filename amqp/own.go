package amqp

import (
	"bytes"
	"runtime"
	"sync"
)

// owned is the set of the engine's goroutines that run user code, by
// goroutine id, as the core keeps its own: a Stop called from one of them
// begins the stop and returns instead of waiting for its caller.
type owned struct {
	ids sync.Map // uint64 -> struct{}
}

func (o *owned) enter() uint64 {
	id := goid()
	o.ids.Store(id, struct{}{})
	return id
}

func (o *owned) leave(id uint64) { o.ids.Delete(id) }

// mine reports whether the calling goroutine is one of the engine's own.
func (o *owned) mine() bool {
	_, ok := o.ids.Load(goid())
	return ok
}

// goid returns the calling goroutine's id, read from the first line of its
// stack ("goroutine 42 [running]:"). It costs about a microsecond: called
// when a goroutine starts and by Shutdown, never per message.
func goid() uint64 {
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
