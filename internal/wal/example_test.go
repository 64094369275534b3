package wal_test

import (
	"fmt"
	"log"
	"os"

	"github.com/tinymq/tinymq/internal/wal"
)

func Example() {
	dir, err := os.MkdirTemp("", "wal-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	l, err := wal.Open(dir, wal.Options{})
	if err != nil {
		log.Fatal(err)
	}
	var b wal.Batch
	b.Put([]byte("msg/1"), []byte("hello"))
	b.Put([]byte("msg/2"), []byte("world"))
	if err := l.Commit(&b); err != nil { // durable when it returns
		log.Fatal(err)
	}
	b.Reset()
	b.Delete([]byte("msg/1")) // an acknowledgement: no fdatasync of its own
	if err := l.CommitAsync(&b); err != nil {
		log.Fatal(err)
	}
	if err := l.Close(); err != nil { // syncs what is pending
		log.Fatal(err)
	}

	l, err = wal.Open(dir, wal.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	err = l.Range(func(key, val []byte) bool {
		fmt.Printf("%s = %s\n", key, val)
		return true
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: msg/2 = world
}
