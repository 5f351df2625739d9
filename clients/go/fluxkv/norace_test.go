//go:build !race

package fluxkv

// raceEnabled: this test binary runs without the race detector.
const raceEnabled = false
