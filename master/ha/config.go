// Package ha is master high availability on etcd (docs/architecture.md §12): masters campaign for
// leadership on an etcd lease (Elector), the leader publishes its address and the
// epoch of its leadership under the election key, and owners and `fluxkv status`
// follow that key (Watch, Candidates).
//
// Safety does not rest on the lease alone: a leader stops serving at the send time of
// its last acknowledged keepalive + the granted TTL − a margin (Term.Leading), before
// etcd can let anyone else win, and every leadership has its own epoch, a counter kept
// on etcd and raised by the new leader in a transaction guarded by its election key.
package ha

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fluxkv/fluxkv/internal/etcddial"
)

// Scheme prefixes an owner's --master that names etcd instead of one master.
const Scheme = "etcd://"

// Config names an etcd cluster and the key prefix of one fluxkv cluster on it.
type Config struct {
	// Endpoints are etcd client endpoints, host:port (http) or full URLs.
	Endpoints []string
	// Prefix is the key prefix, ending in "/"; DefaultPrefix(cluster name) by default.
	Prefix string
	TLS    TLS
	// DialTimeout bounds connecting to etcd. Default 2s.
	DialTimeout time.Duration
}

// TLS towards etcd: CACert verifies etcd's certificate; Cert and Key (both or none)
// authenticate this process. With none of them the connection is plain http.
type TLS struct {
	CACert, Cert, Key string
}

// DefaultPrefix is the key prefix of cluster on etcd: /fluxkv/<cluster>/.
func DefaultPrefix(cluster string) string { return "/fluxkv/" + cluster + "/" }

// IsURL reports whether an owner's --master names etcd (etcd://...).
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// ParseURL parses etcd://h1:2379,h2:2379[/prefix/]; without a path the prefix is
// DefaultPrefix(cluster).
func ParseURL(s, cluster string) (Config, error) {
	if !IsURL(s) {
		return Config{}, fmt.Errorf("%q: want %sHOST:PORT[,HOST:PORT...][/PREFIX/]", s, Scheme)
	}
	rest := strings.TrimPrefix(s, Scheme)
	hosts, path, _ := strings.Cut(rest, "/")
	c := Config{Prefix: DefaultPrefix(cluster)}
	if path != "" {
		c.Prefix = "/" + path
	}
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.Endpoints = append(c.Endpoints, h)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%q: %w", s, err)
	}
	return c, nil
}

// Validate reports a config that cannot work.
func (c *Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("no etcd endpoints")
	}
	for _, e := range c.Endpoints {
		if strings.Contains(e, "://") {
			if _, err := url.Parse(e); err != nil {
				return fmt.Errorf("etcd endpoint %q: %w", e, err)
			}
		} else if !strings.Contains(e, ":") {
			return fmt.Errorf("etcd endpoint %q: want host:port", e)
		}
	}
	if !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
		return fmt.Errorf("etcd prefix %q: must start and end with /", c.Prefix)
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		return errors.New("etcd TLS: give both the certificate and the key, or neither")
	}
	return nil
}

// Client connects to etcd. The caller closes it.
func (c *Config) Client() (*clientv3.Client, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	// Keepalive pings find a member that hangs, or whose host vanished, with its TCP
	// connection up: without them a watch on it (a standby's election, an owner's leader
	// watch) waited for good for events it would never send, while the other members
	// held quorum. 5 s is etcd's --grpc-keepalive-min-time: pinging more often gets the
	// connection closed.
	cfg := clientv3.Config{Endpoints: c.Endpoints, DialTimeout: c.DialTimeout,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second, DialOptions: etcddial.Options()}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if c.TLS.CACert != "" || c.TLS.Cert != "" {
		t, err := c.TLS.config()
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(c.Endpoints, ","), err)
	}
	return cli, nil
}

// Check reads the TLS files as Client will, so that a missing or bad one is found
// before anything starts.
func (c *TLS) Check() error {
	if c.CACert == "" && c.Cert == "" {
		return nil
	}
	_, err := c.config()
	return err
}

func (c *TLS) config() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("etcd CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA certificate %s: no PEM certificate in it", c.CACert)
		}
		t.RootCAs = pool
	}
	if c.Cert != "" {
		kp, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{kp}
	}
	return t, nil
}

// Keys under the prefix.
func (c *Config) electionPrefix() string { return c.Prefix + "leader" }
func (c *Config) epochKey() string       { return c.Prefix + "epoch" }
func (c *Config) servedKey() string      { return c.Prefix + "served" }
