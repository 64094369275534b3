package tinymq

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// words splits a topic key as RabbitMQ does: "" has no words.
func words(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, ".")
}

// naiveMatch is the reference matcher: a direct recursive reading of the rules.
func naiveMatch(pattern, key []string) bool {
	if len(pattern) == 0 {
		return len(key) == 0
	}
	switch pattern[0] {
	case "#":
		for i := 0; i <= len(key); i++ {
			if naiveMatch(pattern[1:], key[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(key) > 0 && naiveMatch(pattern[1:], key[1:])
	default:
		return len(key) > 0 && key[0] == pattern[0] && naiveMatch(pattern[1:], key[1:])
	}
}

// FuzzTopicMatch checks the trie against naiveMatch. patterns holds up to eight
// binding keys separated by '|', each bound to its own queue; the trie must
// return each matching queue once and no other.
func FuzzTopicMatch(f *testing.F) {
	seeds := [][2]string{
		{"#", ""}, {"*", ""}, {"", ""}, {"a.#|#.b|*.*", "a.b"}, {"#.#|#.a.#", "a"},
		{"a..b|a.*.b", "a..b"}, {"a.|*.", "a."}, {".a|*.a", ".a"}, {"a*.b|a#", "a*.b"},
		{"#.x.#.y.#|*.x.*", "q.x.y"}, {"a.#.#.z", "a.z"}, {"#.*|*.#", "."},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, patterns, key string) {
		ps := strings.Split(patterns, "|")
		if len(ps) > 8 || len(key) > 64 || len(patterns) > 128 {
			t.Skip()
		}
		var trie topicTrie
		qs := make([]*queue, len(ps))
		for i, p := range ps {
			qs[i] = &queue{id: i}
			trie.add(p, qs[i])
		}
		var want []int
		for i, p := range ps {
			if naiveMatch(words(p), words(key)) {
				want = append(want, i)
			}
		}
		var got []int
		for _, q := range dedupe(trie.match(key, nil), 0) {
			got = append(got, q.id)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("patterns %q, key %q: trie matched queues %v, reference %v", ps, key, got, want)
		}
		got = got[:0]
		for _, q := range dedupe(trie.matchOnce(key, nil), 0) {
			got = append(got, q.id)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("patterns %q, key %q: the remembering walk matched queues %v, reference %v", ps, key, got, want)
		}
	})
}

// Bindings with many "#" words against a long key of repeated words: a plain
// walk tries every way of splitting the key between the "#"s (here about
// C(60,9), 10^10 paths) and would not finish; match must switch to its
// remembering walk and return in about nodes x words steps.
func TestTopicMatchAdversarialBindingsStayPolynomial(t *testing.T) {
	var trie topicTrie
	hostile := &queue{id: 1}
	trie.add(strings.Repeat("#.a.", 9)+"#.b", hostile)
	trie.add(strings.Repeat("#.a.", 9)+"#", &queue{id: 2})
	trie.add("*.#.*.#.*.#.*.#.*.#.*.#.*.#", &queue{id: 3})
	key := strings.Repeat("a.", 59) + "a"
	done := make(chan []*queue, 1)
	go func() { done <- dedupe(trie.match(key, nil), 0) }()
	select {
	case got := <-done:
		ids := []int{}
		for _, q := range got {
			ids = append(ids, q.id)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []int{2, 3}) {
			t.Fatalf("matched %v, want [2 3]", ids)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("topic match did not return: exponential walk")
	}
}

// BenchmarkTopicMatch measures routing alone, through a trie of 10 and of
// 10,000 bindings ("device.<i>.*", plus a few wildcard bindings that every
// key must also be tried against): the cost should not grow with bindings that
// cannot match.
func BenchmarkTopicMatch(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("bindings=%d", n), func(b *testing.B) {
			var trie topicTrie
			for i := range n {
				trie.add(fmt.Sprintf("device.%d.*", i), &queue{id: i})
			}
			trie.add("#.alert", &queue{id: n})
			trie.add("device.*.humidity", &queue{id: n + 1})
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = fmt.Sprintf("device.%d.temperature", (i*7919)%n)
			}
			var dst [8]*queue
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if len(trie.match(keys[i%len(keys)], dst[:0])) != 1 {
					b.Fatal("want exactly one match")
				}
			}
		})
	}
}
