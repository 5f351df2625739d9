package main

import (
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/ssd"
)

// A setting is one owner or master setting, declared once, in a table of
// settingtable.go: its flag, its YAML key under the section and its kind, which knows
// its field in the section S (config.Owner, config.Master) and how the flag merges
// over the file's value. From the table come the flags (each usage ends with the key:
// " [fluxkv_spec.dram]"), the merge (a flag given on the command line, else the
// file's value, else the flag's default), the names refusals give (settingName) and
// the options the components take (O: daemon.Options, master.Options, ...).
type setting[S, O any] struct {
	flag cli.Flag // as --help shows it, less the " [section.key]" its usage ends with
	key  string   // YAML key under the section
	kind kind[S]
	// set sets the options from the merged section; nil for a setting that is no
	// options field of its own (the row says where it goes).
	set func(o *O, s *S)
	// common: the flag is every long-running command's (metricsAddrFlag), listed by
	// the command once, with no section in its usage.
	common bool
}

// A kind is what a setting holds and how its flag merges over the file's value.
type kind[S any] interface {
	// merge sets the setting in s from the flag when it was given on the command
	// line, else from file when that has it, else from the flag's default; it
	// refuses a value that cannot mean what it says.
	merge(c *cli.Context, r ref, file, s *S) error
	// has reports whether the setting has a value in s.
	has(s *S) bool
}

// A checker is a kind that checks its merged value (an address, a host, a name):
// after every setting is merged and those that go together are checked (settings.go).
type checker[S any] interface {
	check(c *cli.Context, r ref, file, s *S) error
}

// A ref names a setting in refusals: its flag and its dotted YAML key.
type ref struct{ flag, key string }

// name is settingName: the flag, or the key with its flag when the value came from
// the file (fromFile: the file has one).
func (r ref) name(c *cli.Context, fromFile bool) string {
	return settingName(c, r.flag, r.key, fromFile)
}

// A table is a section's settings in the order of their flags.
type table[S, O any] struct {
	section string // config.OwnerSection or config.MasterSection
	rows    []setting[S, O]
}

func (t *table[S, O]) ref(r *setting[S, O]) ref {
	return ref{r.flag.Names()[0], t.section + "." + r.key}
}

// row is the setting whose flag is named flag.
func (t *table[S, O]) row(flag string) *setting[S, O] {
	for i := range t.rows {
		if t.rows[i].flag.Names()[0] == flag {
			return &t.rows[i]
		}
	}
	panic("BUG: no setting --" + flag + " in " + t.section)
}

// flags are the table's flags but the common ones, each usage ending with its key.
// They are the table's own: call it once (a table is built for each use).
func (t *table[S, O]) flags() []cli.Flag {
	var fs []cli.Flag
	for i := range t.rows {
		r := &t.rows[i]
		if r.common {
			continue
		}
		suffix := " [" + t.ref(r).key + "]"
		// Every urfave/cli flag type has its own Usage field, and no setter.
		u := reflect.ValueOf(r.flag).Elem().FieldByName("Usage")
		if !u.IsValid() || u.Kind() != reflect.String {
			panic("BUG: flag type " + reflect.TypeOf(r.flag).String() + " has no Usage")
		}
		u.SetString(u.String() + suffix)
		fs = append(fs, r.flag)
	}
	return fs
}

// merge merges every setting of the file's section file under its flag into s, in
// the order of the table, and returns the first refusal.
func (t *table[S, O]) merge(c *cli.Context, file, s *S) error {
	for i := range t.rows {
		r := &t.rows[i]
		if err := r.kind.merge(c, t.ref(r), file, s); err != nil {
			return err
		}
	}
	return nil
}

// check checks the merged values of the table's checkers, in the order of the table,
// and returns the first refusal.
func (t *table[S, O]) check(c *cli.Context, file, s *S) error {
	for i := range t.rows {
		r := &t.rows[i]
		if k, ok := r.kind.(checker[S]); ok {
			if err := k.check(c, t.ref(r), file, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// apply sets the options from the merged section s.
func (t *table[S, O]) apply(s *S, o *O) {
	for _, r := range t.rows {
		if r.set != nil {
			r.set(o, s)
		}
	}
}

// name names the setting of flag in a refusal; file is the file's section.
func (t *table[S, O]) name(c *cli.Context, flag string, file *S) string {
	r := t.row(flag)
	return t.ref(r).name(c, r.kind.has(file))
}

// offNegative is an owner setting that "off" (0) disables, as the daemon takes it:
// unset (nil) is the daemon's 0, its default, and the CLI's 0 the daemon's negative.
func offNegative[T ~int64 | ~float64](v *T) T {
	switch {
	case v == nil:
		return 0
	case *v == 0:
		return -1
	}
	return *v
}

// text is a string setting; check, if any, refuses a merged value (ifGiven: only a
// non-empty one) once every setting is merged.
func text[S any](field func(*S) *string, check func(string) error) kind[S] {
	return textKind[S]{field, check}
}

type textKind[S any] struct {
	field func(*S) *string
	valid func(string) error
}

func (k textKind[S]) merge(c *cli.Context, r ref, file, s *S) error {
	v := *k.field(file)
	if c.IsSet(r.flag) || v == "" {
		v = c.String(r.flag)
	}
	*k.field(s) = v
	return nil
}

func (k textKind[S]) check(c *cli.Context, r ref, file, s *S) error {
	if k.valid == nil {
		return nil
	}
	if err := k.valid(*k.field(s)); err != nil {
		return refuse("%s: %v", r.name(c, k.has(file)), err)
	}
	return nil
}

func (k textKind[S]) has(s *S) bool { return *k.field(s) != "" }

// ifGiven checks a value that is not empty (empty: unset, the component's default).
func ifGiven(check func(string) error) func(string) error {
	return func(v string) error {
		if v == "" {
			return nil
		}
		return check(v)
	}
}

// duration is a duration setting; a flag ≤ 0 is refused (the file refuses it
// itself), where it would silently mean the default.
func duration[S any](field func(*S) *time.Duration) durationKind[S] {
	return durationKind[S]{field: field, unset: "the default"}
}

type durationKind[S any] struct {
	field func(*S) *time.Duration
	unset string // what leaving the flag out gives, for the refusal
}

// withDefault names the default in the refusal of a flag ≤ 0.
func (k durationKind[S]) withDefault(d string) durationKind[S] {
	k.unset = "the default " + d
	return k
}

func (k durationKind[S]) merge(c *cli.Context, r ref, file, s *S) error {
	v := *k.field(file)
	if c.IsSet(r.flag) || v == 0 {
		v = c.Duration(r.flag)
	}
	if c.IsSet(r.flag) && v <= 0 {
		return refuse("--%s must be positive, got %v (leave it out for %s)", r.flag, v, k.unset)
	}
	*k.field(s) = v
	return nil
}

func (k durationKind[S]) has(s *S) bool { return *k.field(s) != 0 }

// size is a size setting (ssd.ParseSize: 512MiB, 1.5GiB, bytes) of at least min
// bytes (min 1: positive), on the command line and in the file (which refuses sizes
// ≤ 0 itself).
func size[S any](field func(*S) *int64, min int64) kind[S] {
	return sizeKind[S]{field, min}
}

type sizeKind[S any] struct {
	field func(*S) *int64
	min   int64
}

func (k sizeKind[S]) merge(c *cli.Context, r ref, file, s *S) error {
	v := *k.field(file)
	if t := c.String(r.flag); c.IsSet(r.flag) || v == 0 && t != "" {
		n, err := ssd.ParseSize(t)
		switch {
		case err != nil:
			return refuse("--%s: %v", r.flag, err)
		case n < k.min && k.min == 1:
			return refuse("--%s: must be positive", r.flag)
		case n < k.min:
			return refuse("--%s %s: must be at least %s", r.flag, t, humanSize(k.min))
		}
		v = n
	} else if v != 0 && v < k.min {
		return refuse("%s %s: must be at least %s", r.name(c, true), humanSize(v), humanSize(k.min))
	}
	*k.field(s) = v
	return nil
}

func (k sizeKind[S]) has(s *S) bool { return *k.field(s) != 0 }

// replace is a setting whose flag, when given, replaces the file's value (there is
// no flag default to fall back on): read reads it, refusing one that cannot be.
func replace[S, T any](field func(*S) *T, read func(c *cli.Context, flag string) (T, error)) kind[S] {
	return replaceKind[S, T]{field, read}
}

type replaceKind[S, T any] struct {
	field func(*S) *T
	read  func(c *cli.Context, flag string) (T, error)
}

func (k replaceKind[S, T]) merge(c *cli.Context, r ref, file, s *S) error {
	v := *k.field(file)
	if c.IsSet(r.flag) {
		var err error
		if v, err = k.read(c, r.flag); err != nil {
			return err
		}
	}
	*k.field(s) = v
	return nil
}

func (k replaceKind[S, T]) has(s *S) bool { return !isZero(*k.field(s)) }

func isZero[T any](v T) bool { return reflect.ValueOf(&v).Elem().IsZero() }

// either is a switch (off by default) that the flag or the file turns on; a flag
// given on the command line decides (--no-promotion=false turns the file's off).
func either[S any](field func(*S) *bool) kind[S] { return eitherKind[S]{field} }

type eitherKind[S any] struct{ field func(*S) *bool }

func (k eitherKind[S]) merge(c *cli.Context, r ref, file, s *S) error {
	v := *k.field(file)
	if c.IsSet(r.flag) {
		v = c.Bool(r.flag)
	}
	*k.field(s) = v
	return nil
}

func (k eitherKind[S]) has(s *S) bool { return *k.field(s) }

// byHand is a setting whose flag a function of its own merges over the file's value
// together with other settings (the row names it); the table carries the file's value.
func byHand[S, T any](field func(*S) *T) kind[S] { return byHandKind[S, T]{field} }

type byHandKind[S, T any] struct{ field func(*S) *T }

func (k byHandKind[S, T]) merge(c *cli.Context, r ref, file, s *S) error {
	*k.field(s) = *k.field(file)
	return nil
}

func (k byHandKind[S, T]) has(s *S) bool { return !isZero(*k.field(s)) }

// The readers of replace flags.

func intFlag(c *cli.Context, flag string) (int, error) { return c.Int(flag), nil }

// countFlag reads a whole number ≥ 0.
func countFlag(c *cli.Context, flag string) (int, error) {
	n := c.Int(flag)
	if n < 0 {
		return 0, refuse("--%s must be ≥ 0, got %d (0 = the default)", flag, n)
	}
	return n, nil
}

func stringsFlag(c *cli.Context, flag string) ([]string, error) { return c.StringSlice(flag), nil }

func boolFlag(c *cli.Context, flag string) (*bool, error) {
	b := c.Bool(flag)
	return &b, nil
}

// parsedFlag reads a flag with parse, which takes 0 and "off" for off.
func parsedFlag[T any](parse func(string) (T, error)) func(*cli.Context, string) (*T, error) {
	return func(c *cli.Context, flag string) (*T, error) {
		v, err := parse(c.String(flag))
		if err != nil {
			return nil, refuse("--%s: %v", flag, err)
		}
		return &v, nil
	}
}

// transferReserveFlag is a size, or 0 or off for none.
func transferReserveFlag(c *cli.Context, flag string) (*int64, error) {
	var n int64
	if v := c.String(flag); v != "off" {
		var err error
		if n, err = ssd.ParseSize(v); err != nil || n < 0 {
			return nil, refuse("--%s %q: want a size such as 64MiB, 0 or off", flag, v)
		}
	}
	return &n, nil
}

func uidsFlag(c *cli.Context, flag string) ([]uint32, error) {
	uids := []uint32{}
	for _, u := range c.IntSlice(flag) {
		if u < 0 || u > math.MaxUint32-1 {
			return nil, refuse("--%s %d: not a uid", flag, u)
		}
		uids = append(uids, uint32(u))
	}
	return uids, nil
}

// endpointsFlag is a list of etcd endpoints, comma-separated or repeated; the file's
// were checked when it was parsed.
func endpointsFlag(c *cli.Context, flag string) ([]string, error) {
	var es []string
	for _, e := range c.StringSlice(flag) {
		if e = strings.TrimSpace(e); e != "" {
			es = append(es, e)
		}
	}
	if len(es) == 0 {
		return nil, refuse("--%s: no endpoint given (leave it out to run the master alone)", flag)
	}
	for _, e := range es {
		if err := config.CheckEtcdEndpoint(e); err != nil {
			return nil, refuse("--%s: %v", flag, err)
		}
	}
	return es, nil
}
