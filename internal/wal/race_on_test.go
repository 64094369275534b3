//go:build race

package wal

// raceEnabled says that the tests run under the race detector, which changes
// allocation counts.
const raceEnabled = true
