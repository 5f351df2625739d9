package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"gopkg.in/yaml.v3"
)

// CheckPlacement accepts the master's placement modes: pool (a put goes to the owner
// with room, the requester first) and local (every put on its requester).
func CheckPlacement(s string) error {
	if s != "pool" && s != "local" {
		return fmt.Errorf("invalid placement %q (want pool or local)", s)
	}
	return nil
}

// CheckSSDAdmit accepts the master's SSD admission modes: evict (a KV page is written to
// SSD as it nears eviction from memory) and put (every value at its put).
func CheckSSDAdmit(s string) error {
	if s != "evict" && s != "put" {
		return fmt.Errorf("invalid SSD admission %q (want evict or put)", s)
	}
	return nil
}

// haMasterKeys are the master section's keys for high availability on etcd: only
// `fluxkv master` reads them (`fluxkv up` is one node with its own master).
var haMasterKeys = []string{"etcd_endpoints", "advertise_addr", "etcd_prefix", "cluster_name",
	"etcd_cacert", "etcd_cert", "etcd_key", "leader_ttl"}

// CheckEtcdEndpoint accepts an etcd client endpoint: host:port, or a URL
// http(s)://host:port.
func CheckEtcdEndpoint(s string) error {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("invalid etcd endpoint %q: want host:port or http(s)://host:port", s)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("invalid etcd endpoint %q: want host:port or http(s)://host:port", s)
	}
	if err := CheckAddr(s); err != nil || port == "0" {
		return fmt.Errorf("invalid etcd endpoint %q: port %q is not a number from 1 to 65535", s, port)
	}
	return nil
}

// CheckEtcdPrefix accepts an etcd key prefix: it starts and ends with "/".
func CheckEtcdPrefix(s string) error {
	if !strings.HasPrefix(s, "/") || !strings.HasSuffix(s, "/") {
		return fmt.Errorf("invalid etcd prefix %q: must start and end with / (e.g. /fluxkv/prod/)", s)
	}
	return nil
}

// CheckAdvertiseAddr accepts the host:port other hosts reach a listener at: a host
// that is not a wildcard and a port other than 0.
func CheckAdvertiseAddr(s string) error {
	if err := CheckAddr(s); err != nil {
		return err
	}
	if IsWildcardAddr(s) {
		return fmt.Errorf("invalid address %q: advertise a host other hosts can reach (not a wildcard) and a fixed port (not 0)", s)
	}
	return nil
}

// IsWildcardAddr reports whether the listen address host:port cannot be handed to
// other hosts as it is: its host is empty or unspecified (0.0.0.0, ::), or its port is
// 0 (a free one is picked). An address that does not parse counts as a wildcard.
func IsWildcardAddr(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "0" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

func parseMaster(n *yaml.Node, role Role) (*Master, error) {
	const sec = MasterSection
	m := &Master{}
	k := func(name string) string { return sec + "." + name }
	var ttlNode *yaml.Node
	handlers := map[string]func(*yaml.Node) error{
		"listen": stringField(k("listen"), &m.Listen, CheckAddr),
		"node_ttl": func(v *yaml.Node) error {
			ttlNode = v
			return durationField(k("node_ttl"), &m.NodeTTL)(v)
		},
		"heartbeat_interval":   durationField(k("heartbeat_interval"), &m.HeartbeatInterval),
		"inflight_ttl":         durationField(k("inflight_ttl"), &m.InflightTTL),
		"alloc_wait":           durationField(k("alloc_wait"), &m.AllocWait),
		"no_promotion":         boolField(k("no_promotion"), &m.NoPromotion),
		"persist_workers":      countField(k("persist_workers"), "0 = the default", &m.PersistWorkers),
		"placement":            stringField(k("placement"), &m.Placement, CheckPlacement),
		"ssd_admit":            stringField(k("ssd_admit"), &m.SSDAdmit, CheckSSDAdmit),
		"metrics_addr":         stringField(k("metrics_addr"), &m.MetricsAddr, CheckAddr),
		"log_level":            stringField(k("log_level"), &m.LogLevel, CheckLogLevel),
		"log_format":           stringField(k("log_format"), &m.LogFormat, CheckLogFormat),
		"cluster_secret_files": pathListField(k("cluster_secret_files"), "file", &m.ClusterSecretFiles),
		"insecure_cluster":     boolField(k("insecure_cluster"), &m.InsecureCluster),
		"master_key_file":      stringField(k("master_key_file"), &m.MasterKeyFile, nil),
		"etcd_endpoints": func(v *yaml.Node) error {
			if err := stringListField(k("etcd_endpoints"), "etcd endpoint (host:port or http(s)://host:port)", &m.EtcdEndpoints, CheckEtcdEndpoint)(v); err != nil {
				return err
			}
			if m.EtcdEndpoints != nil && len(m.EtcdEndpoints) == 0 {
				return keyErr(v, k("etcd_endpoints"), "empty list (leave the key out to run the master alone)")
			}
			return nil
		},
		"advertise_addr": stringField(k("advertise_addr"), &m.AdvertiseAddr, CheckAdvertiseAddr),
		"etcd_prefix":    stringField(k("etcd_prefix"), &m.EtcdPrefix, CheckEtcdPrefix),
		"cluster_name":   stringField(k("cluster_name"), &m.ClusterName, nil),
		"etcd_cacert":    stringField(k("etcd_cacert"), &m.EtcdCACert, nil),
		"etcd_cert":      stringField(k("etcd_cert"), &m.EtcdCert, nil),
		"etcd_key":       stringField(k("etcd_key"), &m.EtcdKey, nil),
		"leader_ttl":     durationField(k("leader_ttl"), &m.LeaderTTL),
	}
	if role == RoleUp {
		for _, name := range haMasterKeys {
			handlers[name] = func(v *yaml.Node) error {
				return keyErr(v, k(name), "not for `fluxkv up` (one node, its own master); run `fluxkv master` for masters on etcd")
			}
		}
	}
	if err := walkMapping(n, sec, handlers); err != nil {
		return nil, err
	}
	if m.NodeTTL != 0 && m.HeartbeatInterval != 0 && m.NodeTTL < 2*m.HeartbeatInterval {
		return nil, keyErr(ttlNode, k("node_ttl"), "%v must be at least twice %s %v (an owner's lease ends a quarter heartbeat before the TTL: one heartbeat late or lost must not end it)",
			m.NodeTTL, k("heartbeat_interval"), m.HeartbeatInterval)
	}
	return m, nil
}

// stringListField parses a list of non-empty strings, each checked by check (what
// names one in errors); null leaves dst nil, [] makes it empty.
func stringListField(key, what string, dst *[]string, check func(string) error) func(*yaml.Node) error {
	return func(v *yaml.Node) error {
		if isNull(v) {
			return nil
		}
		if v.Kind != yaml.SequenceNode {
			return keyErr(v, key, "%w of %ss, got %s", errNotList, what, describe(v))
		}
		*dst = []string{}
		for i, e := range v.Content {
			ek := fmt.Sprintf("%s[%d]", key, i)
			if e.Kind != yaml.ScalarNode || e.Tag != "!!str" || e.Value == "" {
				return keyErr(e, ek, "want an %s, got %s", what, describe(e))
			}
			if check != nil {
				if err := check(e.Value); err != nil {
					return keyErr(e, ek, "%w", err)
				}
			}
			*dst = append(*dst, e.Value)
		}
		return nil
	}
}
