package tinymq

import "strings"

// A topic key is a list of words separated by '.'. As in RabbitMQ, the empty key
// has no words, and every '.' separates two words, so "a..b" has three words, the
// middle one empty, and "a." has two. In a binding key the words "*" (exactly one
// word) and "#" (zero or more words) are wildcards; "a*" or "#b" are plain words.

// topicNode is a node of the binding trie: the path from the root spells the
// binding key's words.
type topicNode struct {
	children map[string]*topicNode
	star     *topicNode // the word "*"
	hash     *topicNode // the word "#"
	queues   []*queue   // bindings whose key ends here
}

// topicTrie routes a routing key to the queues whose binding keys match it. The
// cost of a match grows with the number of words and of wildcard bindings on the
// paths the key can take, not with the number of bindings.
type topicTrie struct {
	root topicNode
}

// nextWord splits the first word off rest. more reports whether a word followed.
func nextWord(rest string) (word, tail string, more bool) {
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		return rest[:i], rest[i+1:], true
	}
	return rest, "", false
}

// add binds q with key. It reports false when q was already bound with a key
// that is the same after collapsing repeated "#" words.
func (t *topicTrie) add(key string, q *queue) bool {
	n := &t.root
	if key != "" {
		prevHash := false
		for rest, more := key, true; more; {
			var w string
			w, rest, more = nextWord(rest)
			switch w {
			case "#":
				if prevHash { // "#.#" matches what "#" matches
					continue
				}
				if n.hash == nil {
					n.hash = &topicNode{}
				}
				n = n.hash
			case "*":
				if n.star == nil {
					n.star = &topicNode{}
				}
				n = n.star
			default:
				c := n.children[w]
				if c == nil {
					if n.children == nil {
						n.children = make(map[string]*topicNode)
					}
					c = &topicNode{}
					n.children[w] = c
				}
				n = c
			}
			prevHash = w == "#"
		}
	}
	for _, b := range n.queues {
		if b == q {
			return false
		}
	}
	n.queues = append(n.queues, q)
	return true
}

// match appends to dst every queue bound with a key that matches key; a queue
// bound with several matching keys may be appended more than once.
func (t *topicTrie) match(key string, dst []*queue) []*queue {
	return t.root.match(key, key != "", dst)
}

// match matches the words left in rest (none when more is false) against the
// sub-trie at n.
func (n *topicNode) match(rest string, more bool, dst []*queue) []*queue {
	if n.hash != nil {
		// "#" takes zero words, then one more at a time.
		r, m := rest, more
		for {
			dst = n.hash.match(r, m, dst)
			if !m {
				break
			}
			_, r, m = nextWord(r)
		}
	}
	if !more {
		return append(dst, n.queues...)
	}
	w, tail, tailMore := nextWord(rest)
	if c := n.children[w]; c != nil {
		dst = c.match(tail, tailMore, dst)
	}
	if n.star != nil {
		dst = n.star.match(tail, tailMore, dst)
	}
	return dst
}
