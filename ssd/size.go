package ssd

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Align is the unit of every SSD allocation, file offset and O_DIRECT IO length.
const Align = 512

// alignUp rounds n up to a multiple of Align.
func alignUp(n int64) int64 { return (n + Align - 1) &^ (Align - 1) }

// alignDown rounds n down to a multiple of Align.
func alignDown(n int64) int64 { return n &^ (Align - 1) }

// AlignedLen is the on-disk (IO) length of a value of n real bytes: n rounded up to
// a multiple of Align. The owner keeps the padding; callers only ever see n bytes.
func AlignedLen(n int64) int64 { return alignUp(n) }

// sizeUnits maps a lower-cased unit to its multiplier. Decimal-looking units (KB, MB,
// GB...) are binary on purpose, as in the seed's fluxonkv_spec: "4GB" is 4 GiB.
var sizeUnits = map[string]int64{
	"":    1,
	"b":   1,
	"k":   1 << 10,
	"kb":  1 << 10,
	"kib": 1 << 10,
	"m":   1 << 20,
	"mb":  1 << 20,
	"mib": 1 << 20,
	"g":   1 << 30,
	"gb":  1 << 30,
	"gib": 1 << 30,
	"t":   1 << 40,
	"tb":  1 << 40,
	"tib": 1 << 40,
	"p":   1 << 50,
	"pb":  1 << 50,
	"pib": 1 << 50,
}

// unitList is the units of sizeUnits, for ParseSize's refusals.
const unitList = "B, KiB, MiB, GiB, TiB, PiB; KB/MB/GB/TB/PB are binary too"

// ParseSize parses a byte size: plain bytes ("4096"), or a decimal number followed by
// a binary unit ("512MiB", "1.5GiB", "4GB" = 4·2^30, "512.9B" = 512). Units are
// case-insensitive and may be separated from the number by spaces; KB/MB/GB/TB/PB
// mean KiB/MiB/GiB/TiB/PiB. Fractional bytes are truncated. Negative numbers,
// exponents and results above MaxInt64 are errors. Zero is accepted; callers that
// need a minimum check it themselves.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("size %q: empty", s)
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if num == "" || num == "." || strings.Count(num, ".") > 1 {
		return 0, fmt.Errorf("size %q: want a non-negative number with an optional unit (%s)", s, unitList)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use %s)", s, t[i:], unitList)
	}
	// Exact decimal arithmetic: "1.1GiB" must not depend on float rounding.
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("size %q: bad number %q", s, num)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	q := new(big.Int).Quo(r.Num(), r.Denom()) // truncates toward zero; r is non-negative
	if !q.IsInt64() {
		return 0, fmt.Errorf("size %q: larger than %d bytes", s, int64(math.MaxInt64))
	}
	return q.Int64(), nil
}

// FormatSize renders n bytes for humans with a binary unit ("1.5GiB", "512B").
func FormatSize(n int64) string {
	const units = "KMGTPE"
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%dB", n)
	}
	f := float64(n)
	i := -1
	for math.Abs(f) >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", f), "0"), ".") + string(units[i]) + "iB"
}
