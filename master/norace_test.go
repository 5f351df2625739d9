//go:build !race

package master

// raceEnabled: this test binary runs without the race detector.
const raceEnabled = false
