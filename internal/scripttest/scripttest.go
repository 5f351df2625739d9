// Package scripttest holds the argument helpers of the datadriven scenario scripts
// (the master's testdata/*.txt, the owner's): one place that reads "key=value" and
// "flag" arguments of a command.
package scripttest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cockroachdb/datadriven"
)

// Arg is the first value of the command's argument key: "true" for a bare flag, ""
// when absent.
func Arg(d *datadriven.TestData, key string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "true"
			}
			return a.Vals[0]
		}
	}
	return ""
}

// Int is the argument key as a number: decimal, or with a KiB or MiB suffix; 0 when
// absent. A malformed number is a bug in the script: it panics naming the line.
func Int(d *datadriven.TestData, key string) int64 {
	v := Arg(d, key)
	if v == "" {
		return 0
	}
	mul := int64(1)
	for suf, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20} {
		if strings.HasSuffix(v, suf) {
			v, mul = strings.TrimSuffix(v, suf), m
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("%s: %s=%q: %v", d.Pos, key, Arg(d, key), err))
	}
	return n * mul
}
