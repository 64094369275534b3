package tinymq

import "github.com/tinymq/tinymq/internal/wal"

// SetWALFaults makes every log opened from now on obey f, until the returned
// func restores the real disk. Tests only; not safe while an MQ opens a log.
func SetWALFaults(f *wal.Faults) (restore func()) {
	old := walFaults
	walFaults = f
	return func() { walFaults = old }
}
