package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// escape makes s safe to print on a terminal: control characters (newlines,
// tabs and ESC, so ANSI sequences too), other unprintable runes (such as
// bidirectional overrides) and invalid UTF-8 are written as Go escapes
// (\n, \x1b, \u202e, \xff), so that what is printed cannot move the cursor,
// recolour the terminal or start a line that looks like another row.
func escape(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == ' ' || (unicode.IsPrint(r) && r != utf8.RuneError):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r) // '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

func needsEscape(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || (r != ' ' && !unicode.IsPrint(r)) {
			return true
		}
	}
	return false
}
