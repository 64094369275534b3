package tinymq_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The README's quick start is the code of examples/quickstart, which CI
// builds and runs, so it compiles and runs as written.
func TestReadmeQuickStartIsTheProgramCIRuns(t *testing.T) {
	src, err := os.ReadFile("examples/quickstart/main.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, code, ok := strings.Cut(string(src), "// quickstart:begin\n")
	require.True(t, ok, "the quickstart:begin marker")
	code, _, ok = strings.Cut(code, "\n// quickstart:end")
	require.True(t, ok, "the quickstart:end marker")
	_, quick, ok := strings.Cut(string(readme), "## Quick start\n")
	require.True(t, ok, "the README's Quick start section")
	_, block, ok := strings.Cut(quick, "```go\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```\n")
	require.True(t, ok)
	require.Equal(t, strings.TrimSpace(code), strings.TrimSpace(block), "the README's quick start differs from examples/quickstart")
}
