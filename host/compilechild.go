package host

import "github.com/moehost/moehost/host/internal/sandbox"

// CompileChildMain runs this process as a compile child when args (the
// process's arguments less the binary's name) ask for one, and returns its
// exit code and true; otherwise it returns false at once. A binary that
// calls CompileInChild must call it first thing in main.
func CompileChildMain(args []string) (int, bool) { return sandbox.ChildMain(args) }

// CompileInChild makes the servers of this process compile uploaded and
// deployed modules in a child process (this binary, re-run through
// CompileChildMain) under a memory limit and a timeout, so that the
// compile's allocations and garbage collection stay out of the server.
// Only a binary whose main calls CompileChildMain may call it; without
// it, modules compile in the process (see RATIONALE).
func CompileInChild() error { return sandbox.CompileInChild() }
