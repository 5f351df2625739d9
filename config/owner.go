package config

import (
	"fmt"
	"net"

	"gopkg.in/yaml.v3"

	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// CheckMaster accepts an owner's master: the master's host:port, or
// etcd://HOST:PORT[,HOST:PORT...][/PREFIX/] naming the etcd cluster where masters
// campaign (HA, docs/architecture.md §12).
func CheckMaster(s string) error {
	if ha.IsURL(s) {
		// The cluster name only fills in a missing prefix; any valid one does here.
		_, err := ha.ParseURL(s, "fluxkv")
		return err
	}
	if err := CheckAddr(s); err != nil {
		return err
	}
	if _, port, _ := net.SplitHostPort(s); port == "0" {
		return fmt.Errorf("invalid master address %q: port 0 names no listener (give the master's port)", s)
	}
	return nil
}

// haOwnerKeys are the fluxkv_spec keys for following masters on etcd: only `fluxkv
// owner` reads them (`fluxkv up`'s owner registers with its embedded master).
var haOwnerKeys = []string{"etcd_cacert", "etcd_cert", "etcd_key"}

func parseOwner(n *yaml.Node, role Role) (*Owner, error) {
	const sec = OwnerSection
	o := &Owner{}
	var (
		limits     []any
		limitsSet  bool // large_limit_size present and not null
		limitsNode *yaml.Node
		pathsNode  *yaml.Node
	)
	k := func(name string) string { return sec + "." + name }
	handlers := map[string]func(*yaml.Node) error{
		"dram":             sizeField(k("dram"), &o.DRAM),
		"socket_dir":       stringField(k("socket_dir"), &o.SocketDir, nil),
		"master":           stringField(k("master"), &o.Master, CheckMaster),
		"cluster_name":     stringField(k("cluster_name"), &o.ClusterName, nil),
		"instance_key":     stringField(k("instance_key"), &o.InstanceKey, nil),
		"node_id":          stringField(k("node_id"), &o.NodeID, wire.ValidateNodeID),
		"peer_listen":      stringField(k("peer_listen"), &o.PeerListen, CheckAddr),
		"data_listen":      stringField(k("data_listen"), &o.DataListen, CheckAddr),
		"advertise_host":   stringField(k("advertise_host"), &o.AdvertiseHost, CheckHost),
		"metrics_addr":     stringField(k("metrics_addr"), &o.MetricsAddr, CheckAddr),
		"log_level":        stringField(k("log_level"), &o.LogLevel, CheckLogLevel),
		"log_format":       stringField(k("log_format"), &o.LogFormat, CheckLogFormat),
		"cache_grace":      offField(k("cache_grace"), "a duration such as \"20ms\", or off", ParseCacheGrace, &o.CacheGrace, "!!str", "!!int"),
		"hot_set":          offField(k("hot_set"), "a fraction of the memory pool such as 0.5, or off", ParseHotSet, &o.HotSet, "!!str", "!!int", "!!float"),
		"uid_share":        offField(k("uid_share"), "a fraction of each shared resource such as 0.5, or off", ParseUIDShare, &o.UIDShare, "!!str", "!!int", "!!float"),
		"hello_timeout":    durationField(k("hello_timeout"), &o.HelloTimeout),
		"frame_timeout":    durationField(k("frame_timeout"), &o.FrameTimeout),
		"idle_timeout":     durationField(k("idle_timeout"), &o.IdleTimeout),
		"client_isolation": optionalBoolField(k("client_isolation"), &o.ClientIsolation),
		"prefault":         optionalBoolField(k("prefault"), &o.Prefault),
		"huge_pages":       optionalBoolField(k("huge_pages"), &o.HugePages),
		"allowed_uids":     uidListField(k("allowed_uids"), &o.AllowedUIDs),
		"transfer_reserve": func(v *yaml.Node) error {
			if isNull(v) {
				return nil
			}
			var n int64
			if v.Kind == yaml.ScalarNode && v.Value == "off" {
				o.TransferReserve = &n
				return nil
			}
			n, err := sizeValue(v)
			if err != nil || n < 0 {
				return keyErr(v, k("transfer_reserve"), "want a size such as \"64MiB\", 0 or off, got %s", describe(v))
			}
			o.TransferReserve = &n
			return nil
		},
		"etcd_cacert": stringField(k("etcd_cacert"), &o.EtcdCACert, nil),
		"etcd_cert":   stringField(k("etcd_cert"), &o.EtcdCert, nil),
		"etcd_key":    stringField(k("etcd_key"), &o.EtcdKey, nil),
		"put_area":    sizeField(k("put_area"), &o.PutArea),
		"landing_reserve": func(v *yaml.Node) error {
			// 0 is none, as --landing-reserve 0 (its default).
			if isNull(v) {
				return nil
			}
			n, err := sizeValue(v)
			if err != nil {
				return keyErr(v, k("landing_reserve"), "%w (0 = none)", err)
			}
			o.LandingReserve = n
			return nil
		},
		"put_area_total": sizeField(k("put_area_total"), &o.PutAreaTotal),
		"frame_memory":   sizeField(k("frame_memory"), &o.FrameMemory),
		"max_connections": func(v *yaml.Node) error {
			if isNull(v) {
				return nil
			}
			n, err := countValue(v)
			if err != nil {
				return keyErr(v, k("max_connections"), "%w (0 = derived from the open-file limit)", err)
			}
			o.MaxConnections = n
			return nil
		},
		"large_file_paths": func(v *yaml.Node) error {
			pathsNode = v
			return pathListField(k("large_file_paths"), "directory", &o.LargeFilePaths)(v)
		},
		"cluster_secret_files": pathListField(k("cluster_secret_files"), "file", &o.ClusterSecretFiles),
		"insecure_cluster":     boolField(k("insecure_cluster"), &o.InsecureCluster),
		"master_pubkey_files":  pathListField(k("master_pubkey_files"), "file", &o.MasterPubKeyFiles),
		"large_limit_size": func(v *yaml.Node) error {
			limitsNode = v
			if isNull(v) {
				return nil // null: the SSD cache is off
			}
			if v.Kind != yaml.SequenceNode {
				return keyErr(v, k("large_limit_size"), "%w with one size per large_file_paths entry, got %s", errNotList, describe(v))
			}
			limitsSet = true
			limits = []any{}
			for i, e := range v.Content {
				// Decode to the plain values ssd.ParseLimits takes (int, float64,
				// string); anything else is reported by index.
				if e.Kind != yaml.ScalarNode {
					return keyErr(e, fmt.Sprintf("%s[%d]", k("large_limit_size"), i), "want bytes or a size string such as \"4GB\", got %s", describe(e))
				}
				var x any
				if err := e.Decode(&x); err != nil {
					return keyErr(e, fmt.Sprintf("%s[%d]", k("large_limit_size"), i), "%w", err)
				}
				limits = append(limits, x)
			}
			return nil
		},
	}
	if role == RoleUp {
		for _, name := range haOwnerKeys {
			handlers[name] = func(v *yaml.Node) error {
				return keyErr(v, k(name), "not for `fluxkv up` (its owner registers with its own master); run `fluxkv owner` to follow masters on etcd")
			}
		}
	}
	if err := walkMapping(n, sec, handlers); err != nil {
		return nil, err
	}
	if limitsNode == nil && len(o.LargeFilePaths) > 0 {
		// The seed turns the SSD off when large_limit_size is absent; a forgotten
		// key must not silently run a node without its SSD.
		return nil, keyErr(pathsNode, k("large_file_paths"), "set without %s: give one limit per path (or --ssd-limit), "+
			"or %s: null to run without SSD on purpose", k("large_limit_size"), k("large_limit_size"))
	}
	if limitsSet {
		c := ssd.Config{LargeFilePaths: o.LargeFilePaths, LargeLimitSize: limits}
		l, err := c.Limits()
		if err != nil {
			// ssd's messages start with the key: "large_limit_size[1]: ...".
			return nil, &Error{Line: limitsNode.Line, Key: sec, Err: err, nested: true}
		}
		o.LargeLimitSize = l
	}
	return o, nil
}
