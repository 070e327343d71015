package loadgen

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and a parenthesis, utime 250 and stime
	// 75 ticks (fields 14 and 15).
	line := "4242 (moe host) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 1000 50"
	got, err := parseStatCPU(4242, []byte(line), false)
	if err != nil || got != 3250*time.Millisecond {
		t.Errorf("parseStatCPU = %v, %v; want 3.25s", got, err)
	}
	// With the waited-for children's cutime 30 and cstime 20 (fields 16
	// and 17).
	withChildren := "4242 (moe host) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 30 20 20 0 9 0 100 1000 50"
	if got, err := parseStatCPU(4242, []byte(withChildren), true); err != nil || got != 3750*time.Millisecond {
		t.Errorf("parseStatCPU with children = %v, %v; want 3.75s", got, err)
	}
	for _, bad := range []string{"4242 no name", "4242 (x) S 1 2", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 u s"} {
		if _, err := parseStatCPU(4242, []byte(bad), false); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
	if _, err := parseStatCPU(4242, []byte("4242 (x) S 1 2 3 4 5 6 7 8 9 10 1 2"), true); err == nil {
		t.Error("parseStatCPU with children of a line without fields 16 and 17: no error")
	}
	if _, err := ProcessCPU(os.Getpid()); err != nil {
		t.Errorf("ProcessCPU(self): %v", err)
	}
}
