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

// remove unbinds q from key (as add collapses it), pruning the nodes that no
// binding needs any more.
func (t *topicTrie) remove(key string, q *queue) {
	var words []string
	if key != "" {
		prevHash := false
		for rest, more := key, true; more; {
			var w string
			w, rest, more = nextWord(rest)
			if w == "#" && prevHash {
				continue
			}
			prevHash = w == "#"
			words = append(words, w)
		}
	}
	t.root.remove(words, q)
}

// remove unbinds q from the key of words below n, and reports whether n is
// left empty.
func (n *topicNode) remove(words []string, q *queue) bool {
	if len(words) == 0 {
		for i, b := range n.queues {
			if b == q {
				n.queues = append(n.queues[:i:i], n.queues[i+1:]...)
				break
			}
		}
	} else {
		switch w := words[0]; w {
		case "#":
			if n.hash != nil && n.hash.remove(words[1:], q) {
				n.hash = nil
			}
		case "*":
			if n.star != nil && n.star.remove(words[1:], q) {
				n.star = nil
			}
		default:
			if c := n.children[w]; c != nil && c.remove(words[1:], q) {
				delete(n.children, w)
			}
		}
	}
	return len(n.queues) == 0 && len(n.children) == 0 && n.star == nil && n.hash == nil
}

// match appends to dst every queue bound with a key that matches key; a queue
// bound with several matching keys may be appended more than once.
//
// A plain walk of the trie can take time exponential in the number of "#"
// words of a binding ("#.a.#.a.#.b" against "a.a.a.a...": every way of
// splitting the key between the "#"s is tried). The walk reaches the same
// node at the same word many times then, and each time it appends the same
// queues; so past a budget of steps, proportional to the key's length, it
// starts over remembering the (node, word) pairs it has been at, and never
// repeats one: at most nodes x words steps, whatever the bindings.
func (t *topicTrie) match(key string, dst []*queue) []*queue {
	w := topicWalk{key: key, budget: 64 + 8*len(key)} // at least 16 per word
	if out, ok := w.match(&t.root, key, key != "", dst); ok {
		return out
	}
	return t.matchOnce(key, dst)
}

// matchOnce is match remembering every (node, word) visited from the start.
func (t *topicTrie) matchOnce(key string, dst []*queue) []*queue {
	w := topicWalk{key: key, seen: make(map[topicVisit]struct{})}
	dst, _ = w.match(&t.root, key, key != "", dst)
	return dst
}

// topicWalk is one match of a routing key.
type topicWalk struct {
	key    string
	budget int                     // steps left before the walk gives up (while seen is nil)
	seen   map[topicVisit]struct{} // the pairs visited, once the budget ran out
}

// topicVisit is a node reached with the words of key from pos on left (and
// more as in match).
type topicVisit struct {
	n    *topicNode
	pos  int
	more bool
}

// match matches the words left in rest (none when more is false) against the
// sub-trie at n. It reports false if it ran out of budget (dst is then
// incomplete).
func (w *topicWalk) match(n *topicNode, rest string, more bool, dst []*queue) ([]*queue, bool) {
	if w.seen == nil {
		if w.budget--; w.budget < 0 {
			return dst, false
		}
	} else {
		v := topicVisit{n, len(w.key) - len(rest), more}
		if _, ok := w.seen[v]; ok {
			return dst, true // its queues are in dst already
		}
		w.seen[v] = struct{}{}
	}
	ok := true
	if n.hash != nil {
		// "#" takes zero words, then one more at a time.
		r, m := rest, more
		for ok {
			dst, ok = w.match(n.hash, r, m, dst)
			if !m {
				break
			}
			_, r, m = nextWord(r)
		}
	}
	if !ok {
		return dst, false
	}
	if !more {
		return append(dst, n.queues...), true
	}
	word, tail, tailMore := nextWord(rest)
	if c := n.children[word]; c != nil {
		if dst, ok = w.match(c, tail, tailMore, dst); !ok {
			return dst, false
		}
	}
	if n.star != nil {
		dst, ok = w.match(n.star, tail, tailMore, dst)
	}
	return dst, ok
}
