//go:build race

package fluxkv

// raceEnabled: this test binary runs under the race detector, so the fluxkv it
// builds for its node tests does too.
const raceEnabled = true
