package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Directions of the owner-to-owner data plane (the dir label of the transfer metrics).
const (
	TransferPull  = "pull"  // bytes this node pulled into its own segment
	TransferServe = "serve" // bytes this node served from its segment to a puller
)

// Kinds of transfer errors (the kind label of fluxkv_transfer_errors_total).
const (
	TransferErrFenced      = "fenced"      // the source refused the fence (node, generation, transfer id or range)
	TransferErrUnreachable = "unreachable" // dial or authentication failed
	TransferErrTimeout     = "timeout"     // no byte arrived (or could be sent) within the progress deadline
	TransferErrIO          = "io"          // the connection broke mid-transfer
	TransferErrUnavailable = "unavailable" // the source could not serve (closing, its Source failed)
	TransferErrBadRequest  = "bad_request" // a malformed or out-of-bounds request
	TransferErrCanceled    = "canceled"    // the puller's context ended
)

var transferErrKinds = []string{TransferErrFenced, TransferErrUnreachable, TransferErrTimeout, TransferErrIO,
	TransferErrUnavailable, TransferErrBadRequest, TransferErrCanceled}

// Transfer counts the data plane's bytes and errors. A nil *Transfer records nothing.
type Transfer struct {
	pull, serve prometheus.Counter
	errors      *prometheus.CounterVec
}

// Transfer returns m's data-plane instruments, registering them in m's registry on
// the first call (a data-plane server and client of one node share them). Nil for a
// nil m.
func (m *Metrics) Transfer() *Transfer {
	if m == nil {
		return nil
	}
	bytes := registerOrReuse(m.reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fluxkv_transfer_bytes_total",
		Help: "Bytes moved by the owner-to-owner data plane, by direction (pull: into this node's segment, serve: out of it).",
	}, []string{"dir"}))
	errs := registerOrReuse(m.reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fluxkv_transfer_errors_total",
		Help: "Failed data-plane transfers, by direction (pull, serve) and kind (fenced, unreachable, timeout, io, unavailable, bad_request, canceled).",
	}, []string{"dir", "kind"}))
	for _, dir := range []string{TransferPull, TransferServe} {
		for _, kind := range transferErrKinds {
			errs.WithLabelValues(dir, kind) // at 0 from the start, for increase()
		}
	}
	return &Transfer{pull: bytes.WithLabelValues(TransferPull), serve: bytes.WithLabelValues(TransferServe), errors: errs}
}

// registerOrReuse registers cv in reg, or returns the identical collector already there.
func registerOrReuse(reg *prometheus.Registry, cv *prometheus.CounterVec) *prometheus.CounterVec {
	if err := reg.Register(cv); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
		panic("BUG: register transfer metrics: " + err.Error())
	}
	return cv
}

// Bytes counts n bytes moved in direction dir (TransferPull or TransferServe).
func (t *Transfer) Bytes(dir string, n int64) {
	if t == nil || n <= 0 {
		return
	}
	if dir == TransferPull {
		t.pull.Add(float64(n))
	} else {
		t.serve.Add(float64(n))
	}
}

// Error counts one failed transfer in direction dir of kind.
func (t *Transfer) Error(dir, kind string) {
	if t == nil {
		return
	}
	t.errors.WithLabelValues(dir, kind).Inc()
}
