package main

import (
	"fmt"
	"math/big"
	"strings"
)

// pageSize is the owner's segment granularity: daemon.Options rounds DRAM up to it.
const pageSize = 4096

// segmentSize is the segment the owner maps for a requested DRAM size.
func segmentSize(dram int64) int64 { return (dram + pageSize - 1) / pageSize * pageSize }

// humanSize renders a size people must be able to trust (a capacity, a segment):
// the figure of approxSize when it is exact ("8 KiB", "1.5 GiB"), else that figure
// followed by the exact byte count ("4 KiB (4097 B)"), so that neither 4097 bytes
// nor 8192 ever reads as a bare "4 KiB".
func humanSize(n int64) string {
	s, exact := formatSize(n)
	if !exact {
		s += fmt.Sprintf(" (%d B)", n)
	}
	return s
}

// approxSize renders n bytes with a binary unit, rounded to nearest at two decimals
// ("1.23 GiB", "512 B"): for figures that move (used bytes).
func approxSize(n int64) string {
	s, _ := formatSize(n)
	return s
}

// formatSize is n in the largest binary unit it reaches, rounded to nearest at two
// decimals with trailing zeros dropped, and whether that figure is exact.
func formatSize(n int64) (string, bool) {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n), true
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit || m <= -unit; m /= unit {
		div *= unit
		exp++
	}
	r := new(big.Rat).SetFrac64(n, div)
	num := strings.TrimSuffix(strings.TrimRight(r.FloatString(2), "0"), ".")
	// Exact when n/div has at most two decimals: 100·n is a multiple of div.
	hundred := new(big.Int).Mul(big.NewInt(n), big.NewInt(100))
	exact := new(big.Int).Rem(hundred, big.NewInt(div)).Sign() == 0
	return num + " " + string("KMGTPE"[exp]) + "iB", exact
}
