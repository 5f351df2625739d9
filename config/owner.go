package config

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

func parseOwner(n *yaml.Node) (*Owner, error) {
	const sec = OwnerSection
	o := &Owner{}
	var (
		limits     []any
		limitsSet  bool // large_limit_size present and not null
		limitsNode *yaml.Node
	)
	k := func(name string) string { return sec + "." + name }
	err := walkMapping(n, sec, map[string]func(*yaml.Node) error{
		"dram":         sizeField(k("dram"), &o.DRAM),
		"socket_dir":   stringField(k("socket_dir"), &o.SocketDir, nil),
		"master":       stringField(k("master"), &o.Master, CheckAddr),
		"cluster_name": stringField(k("cluster_name"), &o.ClusterName, nil),
		"instance_key": stringField(k("instance_key"), &o.InstanceKey, nil),
		"node_id":      stringField(k("node_id"), &o.NodeID, wire.ValidateNodeID),
		"peer_listen":  stringField(k("peer_listen"), &o.PeerListen, CheckAddr),
		"metrics_addr": stringField(k("metrics_addr"), &o.MetricsAddr, CheckAddr),
		"log_level":    stringField(k("log_level"), &o.LogLevel, CheckLogLevel),
		"log_format":   stringField(k("log_format"), &o.LogFormat, CheckLogFormat),
		"large_file_paths": func(v *yaml.Node) error {
			if isNull(v) {
				return nil
			}
			if v.Kind != yaml.SequenceNode {
				return keyErr(v, k("large_file_paths"), "%w of directories, got %s", errNotList, describe(v))
			}
			o.LargeFilePaths = []string{}
			for i, e := range v.Content {
				if e.Kind != yaml.ScalarNode || e.Tag != "!!str" || e.Value == "" {
					return keyErr(e, fmt.Sprintf("%s[%d]", k("large_file_paths"), i), "want a directory path, got %s", describe(e))
				}
				o.LargeFilePaths = append(o.LargeFilePaths, e.Value)
			}
			return nil
		},
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
	})
	if err != nil {
		return nil, err
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
