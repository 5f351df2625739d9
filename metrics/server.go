package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Server serves one Metrics on /metrics over HTTP.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{} // closed when the serving goroutine returned
	log  zerolog.Logger
}

// shutdownTimeout bounds how long Close waits for scrapes in progress.
const shutdownTimeout = 2 * time.Second

// Serve listens on addr (host:port; port 0 picks a free one) before it returns, so
// the endpoint is reachable as soon as Serve succeeds, then serves /metrics in the
// background until Close.
func Serve(addr string, m *Metrics, log zerolog.Logger) (*Server, error) {
	if m == nil {
		return nil, errors.New("metrics: serve: nil *Metrics")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.InstrumentMetricHandler(m.reg,
		promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
			ErrorLog:      promLogger{log},
			ErrorHandling: promhttp.ContinueOnError,
			Timeout:       10 * time.Second,
		})))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "fluxkv: metrics at /metrics")
	})
	s := &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
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
