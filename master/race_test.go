//go:build race

package master

// raceEnabled: this test binary runs under the race detector.
const raceEnabled = true
