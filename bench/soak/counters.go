package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Counters is what one worker incarnation did so far. Workers write it as one JSON line
// every half second (worker.py writes the same fields), and at once after a wrong byte,
// so the driver's totals survive kill -9: it keeps the last line of every incarnation.
type Counters struct {
	Worker        string            `json:"worker"`
	Lang          string            `json:"lang"`
	Puts          int64             `json:"puts"`
	Gets          int64             `json:"gets"`
	Deletes       int64             `json:"deletes"`
	BatchPuts     int64             `json:"batch_puts"`
	BatchGets     int64             `json:"batch_gets"`
	BatchDeletes  int64             `json:"batch_deletes"`
	BatchItems    int64             `json:"batch_items"`
	Hits          int64             `json:"hits"`
	SSDHits       int64             `json:"ssd_hits"`
	Misses        int64             `json:"misses"`
	BytesWritten  int64             `json:"bytes_written"`
	BytesVerified int64             `json:"bytes_verified"`
	WrongBytes    int64             `json:"wrong_bytes"`
	BadHolders    int64             `json:"bad_holders"`
	NeverReleased int64             `json:"never_released"`
	SlowestOp     string            `json:"slowest_op"` // the operation that took longest, and how long
	SlowestMs     float64           `json:"slowest_ms"`
	Errors        map[string]int64  `json:"errors"`
	ErrorSamples  map[string]string `json:"error_samples"` // the first message of each code
	Failures      []string          `json:"failures"`
	Final         bool              `json:"final"`
}

// Ops counts operations: each batch call is one.
func (c *Counters) Ops() int64 {
	return c.Puts + c.Gets + c.Deletes + c.BatchPuts + c.BatchGets + c.BatchDeletes
}

// add accumulates o into c.
func (c *Counters) add(o *Counters) {
	c.Puts += o.Puts
	c.Gets += o.Gets
	c.Deletes += o.Deletes
	c.BatchPuts += o.BatchPuts
	c.BatchGets += o.BatchGets
	c.BatchDeletes += o.BatchDeletes
	c.BatchItems += o.BatchItems
	c.Hits += o.Hits
	c.SSDHits += o.SSDHits
	c.Misses += o.Misses
	c.BytesWritten += o.BytesWritten
	c.BytesVerified += o.BytesVerified
	c.WrongBytes += o.WrongBytes
	c.BadHolders += o.BadHolders
	c.NeverReleased += o.NeverReleased
	if o.SlowestMs > c.SlowestMs {
		c.SlowestOp, c.SlowestMs = o.Worker+" "+o.SlowestOp, o.SlowestMs
	}
	for k, v := range o.Errors {
		if c.Errors == nil {
			c.Errors = map[string]int64{}
		}
		c.Errors[k] += v
	}
	for k, v := range o.ErrorSamples {
		if c.ErrorSamples == nil {
			c.ErrorSamples = map[string]string{}
		}
		if _, ok := c.ErrorSamples[k]; !ok {
			c.ErrorSamples[k] = o.Worker + ": " + v
		}
	}
	for _, f := range o.Failures {
		if len(c.Failures) < 16 {
			c.Failures = append(c.Failures, o.Worker+": "+f)
		}
	}
}

// failedOps counts the errors of c that say an operation could not run: all but the
// answers (KEY_NOT_FOUND, ALREADY_EXISTS) and NO_SPACE (a full cache).
func failedOps(c Counters) int64 {
	var n int64
	for code, v := range c.Errors {
		switch code {
		case "KEY_NOT_FOUND", "ALREADY_EXISTS", "NO_SPACE":
		default:
			n += v
		}
	}
	return n
}

// errorsString renders the error counts in name order: "NO_SPACE=3 UNAVAILABLE=1".
func (c *Counters) errorsString() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(c.Errors)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, c.Errors[k])
	}
	return b.String()
}

// reporter writes a worker's counters as JSON lines; safe for concurrent use.
type reporter struct {
	mu sync.Mutex // protects c and w
	c  Counters
	w  io.Writer
}

// update changes the counters under the lock.
func (r *reporter) update(f func(c *Counters)) {
	r.mu.Lock()
	f(&r.c)
	r.mu.Unlock()
}

// slowest records an operation's duration when it is the longest so far.
func (r *reporter) slowest(op string, d time.Duration) {
	ms := float64(d.Microseconds()) / 1000
	r.mu.Lock()
	if ms > r.c.SlowestMs {
		r.c.SlowestOp, r.c.SlowestMs = op, ms
	}
	r.mu.Unlock()
}

// emit writes the current counters as one line.
func (r *reporter) emit(final bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.c.Final = final
	b, err := json.Marshal(&r.c)
	if err != nil {
		panic("BUG: counters do not marshal: " + err.Error())
	}
	r.w.Write(append(b, '\n'))
}
