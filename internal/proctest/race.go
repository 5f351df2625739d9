package proctest

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// The race detector in a -race child (a plain binary ignores GORACE).
const (
	// RaceReport marks a race detector report in a child's log.
	RaceReport = "WARNING: DATA RACE"
	// RaceExitCode is the exit status a -race child started with RaceEnv uses when it
	// found a race.
	RaceExitCode = 66
)

// RaceEnv makes a -race child stop at its first race with RaceExitCode, and exit
// without the race runtime's default one-second sleep at exit (atexit_sleep_ms), which
// every stop of a -race child in a test would otherwise wait out.
var RaceEnv = "GORACE=halt_on_error=1 exitcode=" + strconv.Itoa(RaceExitCode) + " atexit_sleep_ms=0"

// RaceFailure says why a process named name shows a race, or "" when it does not: a
// race report in its log, or waitErr (its Wait result, nil while it runs) carrying
// RaceExitCode.
func RaceFailure(name, log string, waitErr error) string {
	if i := strings.Index(log, RaceReport); i >= 0 {
		// The report and what follows it (halt_on_error makes it the end of the log).
		if j := strings.LastIndex(log[:i], "\n"); j >= 0 {
			i = j + 1
		}
		return fmt.Sprintf("the race detector reported a race in %s (%v):\n%s", name, waitErr, Tail(log[i:], 16000))
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) && ee.ExitCode() == RaceExitCode {
		return fmt.Sprintf("%s exited with status %d, the race detector's:\n%s", name, RaceExitCode, Tail(log, 4000))
	}
	return ""
}
