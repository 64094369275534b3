package tinymq

import "github.com/tinymq/tinymq/internal/wal"

// SetWALFaults makes every log opened from now on obey f, until the returned
// func restores the real disk. Tests only; not safe while an MQ opens a log.
func SetWALFaults(f *wal.Faults) (restore func()) {
	old := walFaults
	walFaults = f
	return func() { walFaults = old }
}

// SetParkHook makes every worker call f, holding its queue's lock, when it
// found nothing to take and is about to count itself idle and park, until
// the returned func removes it: tests widen the window in which a plain
// publish races the park with it.
func SetParkHook(f func()) (restore func()) {
	testHookPark.Store(&f)
	return func() { testHookPark.Store(nil) }
}
