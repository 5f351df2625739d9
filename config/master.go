package config

import (
	"fmt"

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

func parseMaster(n *yaml.Node) (*Master, error) {
	const sec = MasterSection
	m := &Master{}
	k := func(name string) string { return sec + "." + name }
	var ttlNode *yaml.Node
	err := walkMapping(n, sec, map[string]func(*yaml.Node) error{
		"listen": stringField(k("listen"), &m.Listen, CheckAddr),
		"node_ttl": func(v *yaml.Node) error {
			ttlNode = v
			return durationField(k("node_ttl"), &m.NodeTTL)(v)
		},
		"heartbeat_interval":   durationField(k("heartbeat_interval"), &m.HeartbeatInterval),
		"inflight_ttl":         durationField(k("inflight_ttl"), &m.InflightTTL),
		"alloc_wait":           durationField(k("alloc_wait"), &m.AllocWait),
		"no_promotion":         boolField(k("no_promotion"), &m.NoPromotion),
		"placement":            stringField(k("placement"), &m.Placement, CheckPlacement),
		"metrics_addr":         stringField(k("metrics_addr"), &m.MetricsAddr, CheckAddr),
		"log_level":            stringField(k("log_level"), &m.LogLevel, CheckLogLevel),
		"log_format":           stringField(k("log_format"), &m.LogFormat, CheckLogFormat),
		"cluster_secret_files": pathListField(k("cluster_secret_files"), "file", &m.ClusterSecretFiles),
		"insecure_cluster":     boolField(k("insecure_cluster"), &m.InsecureCluster),
	})
	if err != nil {
		return nil, err
	}
	if m.NodeTTL != 0 && m.HeartbeatInterval != 0 && m.NodeTTL <= m.HeartbeatInterval {
		return nil, keyErr(ttlNode, k("node_ttl"), "%v must exceed %s %v (an owner misses a few heartbeats before it is tombed)",
			m.NodeTTL, k("heartbeat_interval"), m.HeartbeatInterval)
	}
	return m, nil
}
