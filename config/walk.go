package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

	"github.com/fluxkv/fluxkv/ssd"
)

func joinKey(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null" || n.Kind == 0
}

// walkMapping calls the handler of every key of the mapping n (whose own key is
// prefix), in file order. A key without a handler, a duplicated key or a non-string
// key is an error naming it.
func walkMapping(n *yaml.Node, prefix string, handlers map[string]func(*yaml.Node) error) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		what := prefix
		if what == "" {
			return &Error{Line: n.Line, Err: fmt.Errorf("want a mapping of sections (%s), got %s", knownKeys(handlers), describe(n))}
		}
		return keyErr(n, what, "want a mapping of settings, got %s", describe(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			return keyErr(k, prefix, "unsupported key %s (want plain setting names)", describe(k))
		}
		key := joinKey(prefix, k.Value)
		if seen[k.Value] {
			return keyErr(k, key, "duplicate key")
		}
		seen[k.Value] = true
		h, ok := handlers[k.Value]
		if !ok {
			return keyErr(k, key, "unknown key (known: %s)", knownKeys(handlers))
		}
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		if err := h(v); err != nil {
			return err
		}
	}
	return nil
}

func knownKeys(handlers map[string]func(*yaml.Node) error) string {
	keys := make([]string, 0, len(handlers))
	for k := range handlers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%s %q", strings.TrimPrefix(n.Tag, "!!"), n.Value)
	}
	return "an unsupported node"
}

// The field parsers below each set *dst from a non-null value node or return an
// error naming key. A null value leaves *dst unset (the default applies).

func stringField(key string, dst *string, check func(string) error) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.ScalarNode || v.Tag == "!!bool" {
			return keyErr(v, key, "want a string, got %s", describe(v))
		}
		if v.Value == "" {
			return keyErr(v, key, "empty value (leave the key out for the default)")
		}
		if check != nil {
			if err := check(v.Value); err != nil {
				return keyErr(v, key, "%w", err)
			}
		}
		*dst = v.Value
		return nil
	}
}

func sizeField(key string, dst *int64) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		n, err := sizeValue(v)
		if err != nil {
			return keyErr(v, key, "%w", err)
		}
		if n <= 0 {
			return keyErr(v, key, "invalid size %q: must be positive", v.Value)
		}
		*dst = n
		return nil
	}
}

// sizeValue is a YAML integer (bytes), float (fraction truncated) or size string.
func sizeValue(v *yaml.Node) (int64, error) {
	if v.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("want bytes or a size string such as \"4GiB\", got %s", describe(v))
	}
	switch v.Tag {
	case "!!int":
		var n int64
		if err := v.Decode(&n); err != nil {
			return 0, fmt.Errorf("invalid size %q: %v", v.Value, err)
		}
		if n < 0 {
			return 0, fmt.Errorf("invalid size %q: negative", v.Value)
		}
		return n, nil
	case "!!float":
		var f float64
		if err := v.Decode(&f); err != nil || math.IsNaN(f) || f < 0 || f >= math.MaxInt64 {
			return 0, fmt.Errorf("invalid size %q: want a non-negative number of bytes below 2^63", v.Value)
		}
		return int64(f), nil
	case "!!str":
		n, err := ssd.ParseSize(v.Value)
		if err != nil {
			// ssd's errors read `size "12XB": ...`.
			return 0, fmt.Errorf("invalid %w", err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("want bytes or a size string such as \"4GiB\", got %s", describe(v))
}

func durationField(key string, dst *time.Duration) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			return keyErr(v, key, "want a duration such as \"5s\" or \"500ms\", got %s", describe(v))
		}
		d, err := time.ParseDuration(v.Value)
		if err != nil {
			return keyErr(v, key, "invalid duration %q (want e.g. \"5s\", \"500ms\", \"1m\")", v.Value)
		}
		if d <= 0 {
			return keyErr(v, key, "invalid duration %q: must be positive", v.Value)
		}
		*dst = d
		return nil
	}
}

// CheckAddr accepts host:port with a numeric port 0-65535 (host may be empty for
// every interface; port 0 picks a free one). Service names ("http") are refused: a
// daemon's port should be read off its config, not looked up.
func CheckAddr(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("invalid address %q: want host:port", s)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("invalid address %q: port %q is not a number from 0 to 65535", s, port)
	}
	return nil
}

// ParseCacheGrace parses a cache grace: a duration ≥ 0 ("20ms", "1s"), where 0 and
// "off" turn the grace off. A negative duration is refused rather than read as "off".
func ParseCacheGrace(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "off") || t == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want e.g. \"20ms\", or off to disable)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%v must be ≥ 0 (0 or off disables the grace; unset = the default 30s)", d)
	}
	return d, nil
}

// offField parses a scalar whose value parse reads (0 and off included) into *dst;
// tags are the YAML scalar tags it accepts, want says what it wants in the error.
func offField[T any](key, want string, parse func(string) (T, error), dst **T, tags ...string) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.ScalarNode || !slices.Contains(tags, v.Tag) {
			return keyErr(v, key, "want %s, got %s", want, describe(v))
		}
		x, err := parse(v.Value)
		if err != nil {
			return keyErr(v, key, "%w", err)
		}
		*dst = &x
		return nil
	}
}

// ParseHotSet parses a hot set size: the fraction 0 < x ≤ 1 of the memory pool (dram
// less the transfer area) that idle hot-set holdings may keep, where 0 and
// "off" turn the hot set off. A negative fraction is refused rather than read as
// "off", and one above 1 (more than the pool) is refused too.
func ParseHotSet(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "off") {
		return 0, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) {
		return 0, fmt.Errorf("invalid fraction %q (want a number 0 < x ≤ 1 of the memory pool such as 0.5, or off to disable)", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("%v must be ≥ 0 (0 or off disables the hot set; unset = the default 0.5)", f)
	}
	if f > 1 {
		return 0, fmt.Errorf("%v must be ≤ 1: it is a fraction of the memory pool (0 or off disables the hot set; unset = the default 0.5)", f)
	}
	if f == 0 {
		return 0, nil // also -0
	}
	return f, nil
}

// ParseUIDShare parses a per-uid share (the owner's uid_share): a fraction 0 < x ≤ 1, or
// "off" (1: no per-uid bound). 0 is refused: it would admit no client of another uid.
func ParseUIDShare(s string) (float64, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "off") {
		return 1, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) {
		return 0, fmt.Errorf("invalid share %q (want a fraction 0 < x ≤ 1 such as 0.5, or off for no per-uid bound)", s)
	}
	if f <= 0 || f > 1 {
		return 0, fmt.Errorf("%v must be a fraction 0 < x ≤ 1 (off or unset: no per-uid bound)", f)
	}
	return f, nil
}

// countValue is a YAML integer ≥ 0.
// countField reads a whole number ≥ 0 into dst; zero says what 0 means.
func countField(key, zero string, dst *int) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) { // as every other key: the default
			return nil
		}
		n, err := countValue(v)
		if err != nil {
			return keyErr(v, key, "%w (%s)", err, zero)
		}
		*dst = n
		return nil
	}
}

func countValue(v *yaml.Node) (int, error) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, fmt.Errorf("want a whole number, got %s", describe(v))
	}
	var n int
	if err := v.Decode(&n); err != nil {
		return 0, fmt.Errorf("invalid number %q: %v", v.Value, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("%d must be ≥ 0", n)
	}
	return n, nil
}

// CheckLogLevel accepts the levels zerolog knows (debug, info, warn, error, ...).
func CheckLogLevel(s string) error {
	if _, err := zerolog.ParseLevel(s); err != nil || s == "" {
		return fmt.Errorf("invalid log level %q (want debug, info, warn or error)", s)
	}
	return nil
}

// CheckLogFormat accepts json and text.
func CheckLogFormat(s string) error {
	if s != "json" && s != "text" {
		return fmt.Errorf("invalid log format %q (want json or text)", s)
	}
	return nil
}

var errNotList = errors.New("want a list")

func boolField(key string, dst *bool) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
			return keyErr(v, key, "want true or false, got %s", describe(v))
		}
		return v.Decode(dst)
	}
}

// optionalBoolField parses true or false into *dst (a new bool); null leaves *dst nil:
// the setting's default.
func optionalBoolField(key string, dst **bool) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		var b bool
		if err := boolField(key, &b)(v); err != nil {
			return err
		}
		*dst = &b
		return nil
	}
}

// pathListField parses a list of paths (a file's or a directory's, as what says);
// null leaves dst nil.
func pathListField(key, what string, dst *[]string) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.SequenceNode {
			return keyErr(v, key, "%w of %s paths, got %s", errNotList, what, describe(v))
		}
		*dst = []string{}
		for i, e := range v.Content {
			if e.Kind != yaml.ScalarNode || e.Tag != "!!str" || e.Value == "" {
				return keyErr(e, fmt.Sprintf("%s[%d]", key, i), "want a %s path, got %s", what, describe(e))
			}
			*dst = append(*dst, e.Value)
		}
		return nil
	}
}

// uidListField parses a list of numeric uids; null leaves dst nil.
func uidListField(key string, dst *[]uint32) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.SequenceNode {
			return keyErr(v, key, "%w of numeric uids, got %s", errNotList, describe(v))
		}
		*dst = []uint32{}
		for i, e := range v.Content {
			n, err := countValue(e)
			if err == nil && n > math.MaxUint32-1 {
				err = fmt.Errorf("%d is not a uid", n)
			}
			if err != nil {
				return keyErr(e, fmt.Sprintf("%s[%d]", key, i), "%w", err)
			}
			*dst = append(*dst, uint32(n))
		}
		return nil
	}
}

// CheckHost accepts a host name or an IP address (no port, not a wildcard).
func CheckHost(s string) error {
	if s == "" || strings.ContainsAny(s, " /:") && net.ParseIP(s) == nil {
		return fmt.Errorf("invalid host %q (want a host name or an IP address, no port)", s)
	}
	if ip := net.ParseIP(s); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%q is a wildcard: advertise an address other hosts can reach", s)
	}
	return nil
}
