// Package guard keeps user code from taking an engine down with it. It holds
// what every TinyMQ engine (the in-process core and the broker engines) needs
// around the code it calls on its own goroutines: consumers, loggers,
// codecs, and the methods of a consumer's error or panic value.
//
//   - [Owned] is the set of an engine's own goroutines, so that a Stop called
//     from one of them begins the stop instead of waiting for itself, and
//     [Owned.Guard] runs a piece of user code on a goroutine of its own, where
//     a panic is recovered and a runtime.Goexit ends nothing else.
//   - [IsNil], [ErrorText], [ValueText], [Is] and [As] ask an error or a
//     value what it is without letting its methods panic out.
//   - A [Freezer] turns a consumer's error, once, into one whose methods never
//     reach the consumer's code again, so that settling, logging and
//     dead-lettering it are safe.
//
// The package cannot import tinymq (tinymq imports it), so a Freezer is told
// the sentinels and the panic type it deals in.
package guard
