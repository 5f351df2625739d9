//go:build race

package daemon_test

// raceEnabled: this test binary runs under the race detector, so the fluxkv it
// builds for its process tests does too.
const raceEnabled = true
