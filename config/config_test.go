package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		role    Role
		yaml    string
		want    *File
		wantErr string // substring of the error; empty = must succeed
	}{
		{
			name: "owner: every key",
			role: RoleOwner,
			yaml: `
fluxkv_spec:
  dram: 512MiB
  socket_dir: /run/fluxkv
  master: 10.0.0.1:7700
  cluster_name: prod
  instance_key: node-a/gpu0
  node_id: node-a
  peer_listen: 0.0.0.0:7701
  metrics_addr: :9701
  log_level: debug
  log_format: text
  cache_grace: 50ms
  hot_set: 0.25
  max_connections: 4000
  hello_timeout: 2s
  frame_timeout: 3s
  idle_timeout: 1m
  large_file_paths: [/data/a, /data/b]
  large_limit_size: ["4GB", 17179869184]
`,
			want: &File{Owner: &Owner{
				DRAM: 512 << 20, SocketDir: "/run/fluxkv", Master: "10.0.0.1:7700", ClusterName: "prod",
				InstanceKey: "node-a/gpu0", NodeID: "node-a", PeerListen: "0.0.0.0:7701", MetricsAddr: ":9701",
				LogLevel: "debug", LogFormat: "text", CacheGrace: ptr(50 * time.Millisecond), HotSet: ptr(0.25), MaxConnections: 4000,
				HelloTimeout: 2 * time.Second, FrameTimeout: 3 * time.Second, IdleTimeout: time.Minute,
				LargeFilePaths: []string{"/data/a", "/data/b"}, LargeLimitSize: []int64{4 << 30, 16 << 30},
			}},
		},
		{name: "size: plain int", role: RoleOwner, yaml: "fluxkv_spec: {dram: 1048576}", want: &File{Owner: &Owner{DRAM: 1 << 20}}},
		{name: "size: fractional GiB", role: RoleOwner, yaml: "fluxkv_spec: {dram: 1.5GiB}", want: &File{Owner: &Owner{DRAM: 3 << 29}}},
		{name: "size: GB is binary", role: RoleOwner, yaml: `fluxkv_spec: {dram: "4GB"}`, want: &File{Owner: &Owner{DRAM: 4 << 30}}},
		{name: "size: float truncated", role: RoleOwner, yaml: "fluxkv_spec: {dram: 4096.9}", want: &File{Owner: &Owner{DRAM: 4096}}},
		{name: "limits: fractional bytes truncated", role: RoleOwner,
			yaml: `fluxkv_spec: {large_file_paths: [/d], large_limit_size: ["512.9B"]}`,
			want: &File{Owner: &Owner{LargeFilePaths: []string{"/d"}, LargeLimitSize: []int64{512}}}},
		{name: "limits: null = SSD off", role: RoleOwner,
			yaml: "fluxkv_spec:\n  large_file_paths: [/d]\n  large_limit_size: null\n",
			want: &File{Owner: &Owner{LargeFilePaths: []string{"/d"}}}},
		{name: "cache grace off", role: RoleOwner, yaml: "fluxkv_spec: {cache_grace: off}", want: &File{Owner: &Owner{CacheGrace: ptr(time.Duration(0))}}},
		{name: "cache grace 0", role: RoleOwner, yaml: "fluxkv_spec: {cache_grace: 0}", want: &File{Owner: &Owner{CacheGrace: ptr(time.Duration(0))}}},
		{name: "cache grace 0s", role: RoleOwner, yaml: `fluxkv_spec: {cache_grace: "0s"}`, want: &File{Owner: &Owner{CacheGrace: ptr(time.Duration(0))}}},
		{name: "hot set fraction", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: 0.75}", want: &File{Owner: &Owner{HotSet: ptr(0.75)}}},
		{name: "hot set 1 = the whole pool", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: 1}", want: &File{Owner: &Owner{HotSet: ptr(1.0)}}},
		{name: "hot set quoted", role: RoleOwner, yaml: `fluxkv_spec: {hot_set: "0.5"}`, want: &File{Owner: &Owner{HotSet: ptr(0.5)}}},
		{name: "hot set off", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: off}", want: &File{Owner: &Owner{HotSet: ptr(0.0)}}},
		{name: "hot set 0", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: 0}", want: &File{Owner: &Owner{HotSet: ptr(0.0)}}},
		{name: "hot set 0.0", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: 0.0}", want: &File{Owner: &Owner{HotSet: ptr(0.0)}}},
		{name: "hot set null = unset", role: RoleOwner, yaml: "fluxkv_spec:\n  hot_set:\n", want: &File{Owner: &Owner{}}},
		{name: "max connections 0 = derived", role: RoleOwner, yaml: "fluxkv_spec: {max_connections: 0}", want: &File{Owner: &Owner{}}},
		{name: "persist workers", role: RoleMaster, yaml: "master: {persist_workers: 8}", want: &File{Master: &Master{PersistWorkers: 8}}},
		{name: "null key = unset", role: RoleOwner, yaml: "fluxkv_spec:\n  dram:\n  node_id: ~\n", want: &File{Owner: &Owner{}}},
		{name: "empty file", role: RoleOwner, yaml: "", want: &File{}},
		{name: "comments only", role: RoleUp, yaml: "# nothing\n", want: &File{}},
		{name: "null section", role: RoleOwner, yaml: "fluxkv_spec:\n", want: &File{}},
		{
			name: "master: every key",
			role: RoleMaster,
			yaml: `
master:
  listen: 0.0.0.0:7700
  node_ttl: 10s
  heartbeat_interval: 2s
  inflight_ttl: 1m
  alloc_wait: 500ms
  placement: local
  metrics_addr: 127.0.0.1:9700
  log_level: warn
  log_format: json
  cluster_secret_files: [/etc/fluxkv/new.secret, /etc/fluxkv/old.secret]
  insecure_cluster: false
`,
			want: &File{Master: &Master{Listen: "0.0.0.0:7700", NodeTTL: 10 * time.Second, HeartbeatInterval: 2 * time.Second,
				InflightTTL: time.Minute, AllocWait: 500 * time.Millisecond, Placement: "local", MetricsAddr: "127.0.0.1:9700", LogLevel: "warn", LogFormat: "json",
				ClusterSecretFiles: []string{"/etc/fluxkv/new.secret", "/etc/fluxkv/old.secret"}}},
		},
		{name: "owner: cluster secret files", role: RoleOwner, yaml: "fluxkv_spec:\n  cluster_secret_files: [/s]\n  insecure_cluster: true\n",
			want: &File{Owner: &Owner{ClusterSecretFiles: []string{"/s"}, InsecureCluster: true}}},
		{
			name: "up: both sections",
			role: RoleUp,
			yaml: "fluxkv_spec: {dram: 2GiB}\nmaster: {listen: \"127.0.0.1:0\"}\n",
			want: &File{Owner: &Owner{DRAM: 2 << 30}, Master: &Master{Listen: "127.0.0.1:0"}},
		},

		{
			name: "master: HA keys",
			role: RoleMaster,
			yaml: `
master:
  listen: 0.0.0.0:7700
  etcd_endpoints: [etcd1:2379, "https://etcd2.example:2379", "[::1]:2379"]
  advertise_addr: 10.0.0.5:7700
  etcd_prefix: /fluxkv/prod/
  cluster_name: prod
  etcd_cacert: /etc/etcd/ca.pem
  etcd_cert: /etc/etcd/client.pem
  etcd_key: /etc/etcd/client-key.pem
  leader_ttl: 3s
`,
			want: &File{Master: &Master{Listen: "0.0.0.0:7700", EtcdEndpoints: []string{"etcd1:2379", "https://etcd2.example:2379", "[::1]:2379"},
				AdvertiseAddr: "10.0.0.5:7700", EtcdPrefix: "/fluxkv/prod/", ClusterName: "prod", EtcdCACert: "/etc/etcd/ca.pem",
				EtcdCert: "/etc/etcd/client.pem", EtcdKey: "/etc/etcd/client-key.pem", LeaderTTL: 3 * time.Second}},
		},
		// The file's keys are checked one by one; how they go together (endpoints
		// for the others, cert with key, advertise_addr for a wildcard listen) is
		// checked once flags are merged over them.
		{name: "master: HA key without endpoints parses", role: RoleMaster, yaml: "master: {advertise_addr: \"h:1\"}",
			want: &File{Master: &Master{AdvertiseAddr: "h:1"}}},
		{name: "master: null endpoints = unset", role: RoleMaster, yaml: "master:\n  etcd_endpoints:\n", want: &File{Master: &Master{}}},
		{
			name: "owner: master on etcd, with TLS",
			role: RoleOwner,
			yaml: "fluxkv_spec:\n  master: etcd://h1:2379,h2:2379/fluxkv/prod/\n  etcd_cacert: /ca.pem\n  etcd_cert: /c.pem\n  etcd_key: /k.pem\n",
			want: &File{Owner: &Owner{Master: "etcd://h1:2379,h2:2379/fluxkv/prod/", EtcdCACert: "/ca.pem", EtcdCert: "/c.pem", EtcdKey: "/k.pem"}},
		},
		{name: "owner: master on etcd, default prefix", role: RoleOwner, yaml: "fluxkv_spec: {master: \"etcd://h1:2379\"}",
			want: &File{Owner: &Owner{Master: "etcd://h1:2379"}}},

		// Errors name the key.
		{name: "unknown owner key", role: RoleOwner, yaml: "fluxkv_spec:\n  dramm: 1GiB\n", wantErr: "line 2: fluxkv_spec.dramm: unknown key (known: advertise_host, allowed_uids, cache_grace, client_isolation, cluster_name, cluster_secret_files, data_listen, dram, etcd_cacert, etcd_cert, etcd_key, frame_memory, frame_timeout, hello_timeout, hot_set, huge_pages, idle_timeout,"},
		{name: "secret files not a list", role: RoleOwner, yaml: "fluxkv_spec: {cluster_secret_files: /etc/s}",
			wantErr: `fluxkv_spec.cluster_secret_files: want a list of file paths, got str "/etc/s"`},
		{name: "secret file empty", role: RoleMaster, yaml: "master: {cluster_secret_files: [/a, \"\"]}",
			wantErr: `master.cluster_secret_files[1]: want a file path, got str ""`},
		// Values that would silently mean something else are refused.
		{name: "paths without limits", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  dram: 1GiB\n  large_file_paths: [/d]\n",
			wantErr: "line 3: fluxkv_spec.large_file_paths: set without fluxkv_spec.large_limit_size"},
		{name: "negative cache grace", role: RoleOwner, yaml: "fluxkv_spec: {cache_grace: -1s}",
			wantErr: "fluxkv_spec.cache_grace: -1s must be ≥ 0 (0 or off disables the grace"},
		{name: "cache grace not a duration", role: RoleOwner, yaml: "fluxkv_spec: {cache_grace: 20}",
			wantErr: `fluxkv_spec.cache_grace: invalid duration "20"`},
		{name: "cache grace a bool", role: RoleOwner, yaml: "fluxkv_spec: {cache_grace: false}",
			wantErr: `fluxkv_spec.cache_grace: want a duration such as "20ms", or off, got bool "false"`},
		{name: "hot set above 1", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: 1.5}",
			wantErr: "fluxkv_spec.hot_set: 1.5 must be ≤ 1: it is a fraction of the memory pool (0 or off disables the hot set"},
		{name: "hot set a percentage", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: 50}",
			wantErr: "fluxkv_spec.hot_set: 50 must be ≤ 1"},
		{name: "negative hot set", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: -0.5}",
			wantErr: "fluxkv_spec.hot_set: -0.5 must be ≥ 0 (0 or off disables the hot set"},
		{name: "hot set not a number", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: half}",
			wantErr: `fluxkv_spec.hot_set: invalid fraction "half" (want a number 0 < x ≤ 1 of the memory pool`},
		{name: "hot set nan", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: .nan}",
			wantErr: `fluxkv_spec.hot_set: invalid fraction ".nan"`},
		{name: "hot set a bool", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: true}",
			wantErr: `fluxkv_spec.hot_set: want a fraction of the memory pool such as 0.5, or off, got bool "true"`},
		{name: "hot set a list", role: RoleOwner, yaml: "fluxkv_spec: {hot_set: [0.5]}",
			wantErr: `fluxkv_spec.hot_set: want a fraction of the memory pool such as 0.5, or off, got`},
		{name: "negative max connections", role: RoleOwner, yaml: "fluxkv_spec: {max_connections: -1}",
			wantErr: "fluxkv_spec.max_connections: -1 must be ≥ 0"},
		{name: "max connections a string", role: RoleOwner, yaml: "fluxkv_spec: {max_connections: many}",
			wantErr: `fluxkv_spec.max_connections: want a whole number, got str "many"`},
		{name: "port out of range", role: RoleOwner, yaml: "fluxkv_spec: {peer_listen: \"127.0.0.1:70000\"}",
			wantErr: `fluxkv_spec.peer_listen: invalid address "127.0.0.1:70000": port "70000" is not a number from 0 to 65535`},
		{name: "named port", role: RoleMaster, yaml: "master: {listen: \"127.0.0.1:http\"}",
			wantErr: `master.listen: invalid address "127.0.0.1:http": port "http"`},
		{name: "bad placement", role: RoleMaster, yaml: "master:\n  placement: spread\n",
			wantErr: `line 2: master.placement: invalid placement "spread" (want pool or local)`},
		{name: "unknown master key", role: RoleMaster, yaml: "master:\n  listen: :1\n  nodettl: 5s\n", wantErr: "line 3: master.nodettl: unknown key"},
		{name: "unknown section", role: RoleUp, yaml: "fluxonkv_spec:\n  dram: 1GiB\n", wantErr: "line 1: fluxonkv_spec: unknown key (known: fluxkv_spec, master)"},
		{name: "owner section for master", role: RoleMaster, yaml: "fluxkv_spec: {dram: 1GiB}\n", wantErr: "fluxkv_spec: not read by `fluxkv master`"},
		{name: "master section for owner", role: RoleOwner, yaml: "master: {listen: \":1\"}\n", wantErr: "master: not read by `fluxkv owner`"},
		{name: "duplicate key", role: RoleOwner, yaml: "fluxkv_spec:\n  dram: 1GiB\n  dram: 2GiB\n", wantErr: "line 3: fluxkv_spec.dram: duplicate key"},
		{name: "bad size unit", role: RoleOwner, yaml: "fluxkv_spec:\n  dram: 12XB\n", wantErr: `line 2: fluxkv_spec.dram: invalid size "12XB"`},
		{name: "negative size", role: RoleOwner, yaml: "fluxkv_spec: {dram: -5}", wantErr: `fluxkv_spec.dram: invalid size "-5"`},
		{name: "zero dram", role: RoleOwner, yaml: "fluxkv_spec: {dram: 0}", wantErr: `fluxkv_spec.dram: invalid size "0": must be positive`},
		{name: "size is a list", role: RoleOwner, yaml: "fluxkv_spec: {dram: [1]}", wantErr: "fluxkv_spec.dram: want bytes or a size string"},
		{name: "size is a bool", role: RoleOwner, yaml: "fluxkv_spec: {dram: true}", wantErr: "fluxkv_spec.dram: want bytes or a size string"},
		{name: "mismatched lengths", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: [4GB, 8GB]\n",
			wantErr: "line 3: fluxkv_spec.large_limit_size has 2 entries but large_file_paths has 1"},
		{name: "limits without paths", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_limit_size: [4GB]\n",
			wantErr: "fluxkv_spec.large_limit_size has 1 entries but large_file_paths has 0"},
		{name: "limit below 512", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a, /b]\n  large_limit_size: [4GB, 511]\n",
			wantErr: "fluxkv_spec.large_limit_size[1]: 511 bytes is below the minimum of 512"},
		{name: "limit bad size string", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: [4QB]\n",
			wantErr: `fluxkv_spec.large_limit_size[0]: size "4QB"`},
		{name: "limit null entry", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: [null]\n",
			wantErr: "fluxkv_spec.large_limit_size[0]: null entry"},
		{name: "limit is a nested list", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: [[1]]\n",
			wantErr: "line 3: fluxkv_spec.large_limit_size[0]: want bytes or a size string"},
		{name: "limits not a list", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: 4GB\n",
			wantErr: "fluxkv_spec.large_limit_size: want a list"},
		{name: "paths not a list", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: /a\n",
			wantErr: "fluxkv_spec.large_file_paths: want a list"},
		{name: "empty path", role: RoleOwner,
			yaml:    "fluxkv_spec:\n  large_file_paths: [/a, \"\"]\n",
			wantErr: "fluxkv_spec.large_file_paths[1]: want a directory path"},
		// HA on etcd.
		{name: "up: etcd endpoints refused", role: RoleUp, yaml: "master:\n  etcd_endpoints: [h:2379]\n",
			wantErr: "line 2: master.etcd_endpoints: not for `fluxkv up` (one node, its own master); run `fluxkv master`"},
		{name: "up: every HA key refused", role: RoleUp, yaml: "master: {leader_ttl: 2s}", wantErr: "master.leader_ttl: not for `fluxkv up`"},
		{name: "up: cluster_name under master refused", role: RoleUp, yaml: "master: {cluster_name: x}", wantErr: "master.cluster_name: not for `fluxkv up`"},
		{name: "up: owner etcd TLS refused", role: RoleUp, yaml: "fluxkv_spec: {etcd_cacert: /ca.pem}", wantErr: "fluxkv_spec.etcd_cacert: not for `fluxkv up`"},
		{name: "endpoints not a list", role: RoleMaster, yaml: "master: {etcd_endpoints: \"h1:2379,h2:2379\"}",
			wantErr: `master.etcd_endpoints: want a list of etcd endpoint (host:port or http(s)://host:port)s, got str "h1:2379,h2:2379"`},
		{name: "endpoints empty", role: RoleMaster, yaml: "master: {etcd_endpoints: []}",
			wantErr: "master.etcd_endpoints: empty list (leave the key out to run the master alone)"},
		{name: "endpoint without port", role: RoleMaster, yaml: "master: {etcd_endpoints: [h1:2379, etcd2]}",
			wantErr: `master.etcd_endpoints[1]: invalid etcd endpoint "etcd2": want host:port or http(s)://host:port`},
		{name: "endpoint bad scheme", role: RoleMaster, yaml: "master: {etcd_endpoints: [\"unix://x:1\"]}",
			wantErr: `master.etcd_endpoints[0]: invalid etcd endpoint "unix://x:1"`},
		{name: "endpoint port 0", role: RoleMaster, yaml: "master: {etcd_endpoints: [\"h:0\"]}",
			wantErr: `master.etcd_endpoints[0]: invalid etcd endpoint "h:0": port "0" is not a number from 1 to 65535`},
		{name: "endpoint a number", role: RoleMaster, yaml: "master: {etcd_endpoints: [2379]}",
			wantErr: `master.etcd_endpoints[0]: want an etcd endpoint (host:port or http(s)://host:port), got int "2379"`},
		{name: "advertise addr wildcard", role: RoleMaster, yaml: "master: {advertise_addr: \"0.0.0.0:7700\"}",
			wantErr: `master.advertise_addr: invalid address "0.0.0.0:7700": advertise a host other hosts can reach`},
		{name: "advertise addr port 0", role: RoleMaster, yaml: "master: {advertise_addr: \"10.0.0.1:0\"}",
			wantErr: `master.advertise_addr: invalid address "10.0.0.1:0"`},
		{name: "advertise addr without port", role: RoleMaster, yaml: "master: {advertise_addr: 10.0.0.1}",
			wantErr: `master.advertise_addr: invalid address "10.0.0.1": want host:port`},
		{name: "prefix without trailing slash", role: RoleMaster, yaml: "master: {etcd_prefix: /fluxkv/prod}",
			wantErr: `master.etcd_prefix: invalid etcd prefix "/fluxkv/prod": must start and end with /`},
		{name: "prefix without leading slash", role: RoleMaster, yaml: "master: {etcd_prefix: fluxkv/}",
			wantErr: `master.etcd_prefix: invalid etcd prefix "fluxkv/"`},
		{name: "leader ttl not positive", role: RoleMaster, yaml: "master: {leader_ttl: 0s}",
			wantErr: `master.leader_ttl: invalid duration "0s": must be positive`},
		{name: "leader ttl a number", role: RoleMaster, yaml: "master: {leader_ttl: 2}",
			wantErr: `master.leader_ttl: want a duration such as "5s"`},
		{name: "etcd cert empty", role: RoleMaster, yaml: "master: {etcd_cert: \"\"}", wantErr: "master.etcd_cert: empty value"},
		{name: "owner etcd url without endpoints", role: RoleOwner, yaml: "fluxkv_spec: {master: \"etcd:///p/\"}",
			wantErr: `fluxkv_spec.master: "etcd:///p/": no etcd endpoints`},
		{name: "owner etcd url bad prefix", role: RoleOwner, yaml: "fluxkv_spec: {master: \"etcd://h:2379/p\"}",
			wantErr: `fluxkv_spec.master: "etcd://h:2379/p": etcd prefix "/p": must start and end with /`},
		{name: "owner etcd url endpoint without port", role: RoleOwner, yaml: "fluxkv_spec: {master: \"etcd://h1\"}",
			wantErr: `fluxkv_spec.master: "etcd://h1": etcd endpoint "h1": want host:port`},
		{name: "bad address", role: RoleOwner, yaml: "fluxkv_spec: {master: localhost}", wantErr: `fluxkv_spec.master: invalid address "localhost": want host:port`},
		{name: "bad log level", role: RoleOwner, yaml: "fluxkv_spec: {log_level: loud}", wantErr: `fluxkv_spec.log_level: invalid log level "loud"`},
		{name: "bad log format", role: RoleMaster, yaml: "master: {log_format: xml}", wantErr: `master.log_format: invalid log format "xml"`},
		{name: "empty string", role: RoleOwner, yaml: `fluxkv_spec: {socket_dir: ""}`, wantErr: "fluxkv_spec.socket_dir: empty value"},
		{name: "string is a mapping", role: RoleOwner, yaml: "fluxkv_spec: {node_id: {a: 1}}", wantErr: "fluxkv_spec.node_id: want a string, got a mapping"},
		{name: "bad duration", role: RoleMaster, yaml: "master: {node_ttl: 5}", wantErr: `master.node_ttl: want a duration such as "5s"`},
		{name: "bad duration string", role: RoleMaster, yaml: "master: {node_ttl: 5 seconds}", wantErr: `master.node_ttl: invalid duration "5 seconds"`},
		{name: "negative persist workers", role: RoleMaster, yaml: "master: {persist_workers: -2}",
			wantErr: "master.persist_workers: -2 must be ≥ 0 (0 = the default)"},
		{name: "negative duration", role: RoleMaster, yaml: "master: {alloc_wait: -1s}", wantErr: `master.alloc_wait: invalid duration "-1s": must be positive`},
		{name: "ttl below heartbeat", role: RoleMaster, yaml: "master: {node_ttl: 1s, heartbeat_interval: 2s}", wantErr: "master.node_ttl: 1s must be at least twice master.heartbeat_interval 2s"},
		{name: "section not a mapping", role: RoleOwner, yaml: "fluxkv_spec: [1, 2]", wantErr: "fluxkv_spec: want a mapping of settings, got a list"},
		{name: "top level not a mapping", role: RoleOwner, yaml: "- 1\n", wantErr: "want a mapping of sections (fluxkv_spec, master), got a list"},
		{name: "two documents", role: RoleOwner, yaml: "fluxkv_spec: {dram: 1GiB}\n---\nfluxkv_spec: {dram: 2GiB}\n", wantErr: "more than one YAML document"},
		{name: "syntax error", role: RoleOwner, yaml: "fluxkv_spec:\n  dram: [1GiB\n", wantErr: "yaml:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.yaml), tt.role)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, want one containing %q; got %+v", tt.wantErr, got)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q\n  does not contain %q", err, tt.wantErr)
				}
				var ce *Error
				if !errors.As(err, &ce) {
					t.Errorf("error %T is not a *config.Error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got\n  %s\nwant\n  %s", dump(got), dump(tt.want))
			}
		})
	}
}

func dump(f *File) string {
	s := "File{"
	if f.Owner != nil {
		s += fmt.Sprintf("Owner: %+v", *f.Owner)
	}
	if f.Master != nil {
		s += fmt.Sprintf(" Master: %+v", *f.Master)
	}
	return s + "}"
}

func TestSSDEnabled(t *testing.T) {
	on, err := Parse([]byte("fluxkv_spec: {large_file_paths: [/a], large_limit_size: [1GiB]}"), RoleOwner)
	if err != nil {
		t.Fatal(err)
	}
	off, err := Parse([]byte("fluxkv_spec: {large_file_paths: [/a], large_limit_size: null}"), RoleOwner)
	if err != nil {
		t.Fatal(err)
	}
	if !on.Owner.SSDEnabled() || off.Owner.SSDEnabled() {
		t.Fatalf("SSDEnabled: on=%v off=%v", on.Owner.SSDEnabled(), off.Owner.SSDEnabled())
	}
}

func TestLoadNamesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "owner.yaml")
	if err := os.WriteFile(p, []byte("fluxkv_spec:\n  dram: 12XB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p, RoleOwner)
	want := p + `:2: fluxkv_spec.dram: invalid size "12XB"`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v, want prefix %q", err, want)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), RoleOwner); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v, want ErrNotExist", err)
	}
}

// The example configs shipped in scripts/examples parse for their role.
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		file string
		role Role
	}{
		{"master.yaml", RoleMaster},
		{"owner.yaml", RoleOwner},
		{"up.yaml", RoleUp},
	} {
		t.Run(ex.file, func(t *testing.T) {
			f, err := Load(filepath.Join("..", "scripts", "examples", ex.file), ex.role)
			if err != nil {
				t.Fatal(err)
			}
			if ex.role != RoleMaster && f.Owner == nil {
				t.Error("no fluxkv_spec section")
			}
			if ex.role != RoleOwner && f.Master == nil {
				t.Error("no master section")
			}
			if ex.role == RoleOwner && (!f.Owner.SSDEnabled() || f.Owner.Master == "" || f.Owner.DRAM == 0) {
				t.Errorf("owner example should configure dram, master and an SSD cache: %+v", f.Owner)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestIsWildcardAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		":7700": true, "0.0.0.0:7700": true, "[::]:7700": true, "10.0.0.1:0": true, "host": true,
		"10.0.0.1:7700": false, "master-a:7700": false, "[fe80::1]:7700": false, "127.0.0.1:7700": false,
	} {
		if got := IsWildcardAddr(addr); got != want {
			t.Errorf("IsWildcardAddr(%q) = %v, want %v", addr, got, want)
		}
	}
	for _, e := range []string{"e:2379", "http://e:2379", "https://10.0.0.1:2379", "[::1]:2379"} {
		if err := CheckEtcdEndpoint(e); err != nil {
			t.Errorf("CheckEtcdEndpoint(%q): %v", e, err)
		}
	}
	for _, e := range []string{"e", ":2379", "e:0", "e:http", "ftp://e:1", "http://", "unix:///run/etcd.sock"} {
		if err := CheckEtcdEndpoint(e); err == nil {
			t.Errorf("CheckEtcdEndpoint(%q) accepted", e)
		}
	}
}

func TestPersistWorkersNullIsTheDefault(t *testing.T) {
	f, err := Parse([]byte("master:\n  persist_workers: null\n"), RoleMaster)
	if err != nil || f.Master == nil || f.Master.PersistWorkers != 0 {
		t.Fatalf("persist_workers: null: %+v, %v; want the default (0)", f, err)
	}
}
