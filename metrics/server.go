package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Server serves one Metrics on /metrics over HTTP, with the process's health on
// /healthz and its readiness on /readyz (the paths Kubernetes probes).
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{} // closed when the serving goroutine returned
	log  zerolog.Logger
}

// Options configure Serve.
type Options struct {
	// Ready says whether the process's role is ready: nil, or why not. /readyz answers
	// 200 "ok" when it returns nil, else 503 with the reason on one line. It is called
	// at every /readyz request, from the HTTP handler, and must not block. Default
	// (nil): ready while the server serves.
	Ready func() error
	// Logger receives the server's errors. Default: none.
	Logger *zerolog.Logger
	// ReadTimeout bounds reading a request, body included; WriteTimeout writing its
	// answer. A client that declares a body and never sends it, or never reads the
	// answer, otherwise holds its connection and a goroutine for good (file
	// descriptors the owner's sockets and SSD files need). Defaults 10 s and 30 s
	// (more than a scrape's own 10 s timeout).
	ReadTimeout, WriteTimeout time.Duration
}

const (
	// shutdownTimeout bounds how long Close waits for scrapes in progress.
	shutdownTimeout = 2 * time.Second
	// scrapesInFlight bounds the /metrics requests served at once (each takes the
	// owner's lock for its gauges); another gets 503 at once.
	scrapesInFlight = 4
)

// Serve listens on addr (host:port; port 0 picks a free one) before it returns, so
// the endpoints are reachable as soon as Serve succeeds, then serves in the background
// until Close:
//
//	/metrics  m's registry in the Prometheus text format
//	/healthz  200 "ok" while the process serves (liveness)
//	/readyz   200 "ok" once opts.Ready says the role is ready, else 503 and the reason
func Serve(addr string, m *Metrics, opts Options) (*Server, error) {
	if m == nil {
		return nil, errors.New("metrics: serve: nil *Metrics")
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = *opts.Logger
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.InstrumentMetricHandler(m.reg,
		promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
			ErrorLog:            promLogger{log},
			ErrorHandling:       promhttp.ContinueOnError,
			Timeout:             10 * time.Second,
			MaxRequestsInFlight: scrapesInFlight,
		})))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if opts.Ready != nil {
			if err := opts.Ready(); err != nil {
				plain(w, http.StatusServiceUnavailable, "not ready: "+oneLine(err.Error()))
				return
			}
		}
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "fluxkv: metrics at /metrics, health at /healthz, readiness at /readyz")
	})
	s := &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       cmp.Or(opts.ReadTimeout, 10*time.Second),
			WriteTimeout:      cmp.Or(opts.WriteTimeout, 30*time.Second),
			IdleTimeout:       60 * time.Second,
		},
		done: make(chan struct{}),
		log:  log,
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", s.Addr()).Msg("metrics server stopped")
		}
	}()
	return s, nil
}

// plain answers status with body and a newline as text/plain, never cached.
func plain(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintln(w, body)
}

// oneLine is s with every run of white space, newlines included, made one space.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Addr is the address the server listens on (with the real port when addr had 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops listening, waits briefly for scrapes in progress and returns when the
// server is down.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	<-s.done
	if err != nil {
		return fmt.Errorf("metrics: close %s: %w", s.Addr(), err)
	}
	return nil
}

// promLogger routes promhttp's errors into zerolog.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn().Msg(fmt.Sprint(v...)) }
