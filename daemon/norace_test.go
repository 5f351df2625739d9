//go:build !race

package daemon_test

// raceEnabled: this test binary runs without the race detector.
const raceEnabled = false
