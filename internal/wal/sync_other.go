//go:build !linux

package wal

import "os"

// fdatasync falls back to File.Sync where fdatasync(2) is not available
// (F_FULLFSYNC on darwin, FlushFileBuffers on windows).
func fdatasync(f *os.File) error { return f.Sync() }
