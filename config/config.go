package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Role is the command a file configures; it decides which sections may appear.
type Role int

const (
	RoleMaster Role = iota // `fluxkv master`: section master
	RoleOwner              // `fluxkv owner`: section fluxkv_spec
	RoleUp                 // `fluxkv up`: sections fluxkv_spec and master
)

func (r Role) String() string {
	switch r {
	case RoleMaster:
		return "master"
	case RoleOwner:
		return "owner"
	case RoleUp:
		return "up"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// Section names (top-level keys).
const (
	OwnerSection  = "fluxkv_spec"
	MasterSection = "master"
)

// File is one parsed config file. A section that is absent (or null) is nil.
type File struct {
	Path   string // as given to Load; empty for Parse
	Owner  *Owner
	Master *Master
}

// Owner is the fluxkv_spec section. A zero field was not set by the file (the key
// was absent or null); the caller's flag or default applies.
type Owner struct {
	DRAM      int64  // dram: the memory segment size in bytes (> 0)
	SocketDir string // socket_dir: directory of fluxkv.sock
	// Master (master) is the master's host:port, or etcd://HOST:PORT[,HOST:PORT...][/PREFIX/]
	// to follow the leader among masters campaigning on etcd (HA, docs/architecture.md §12).
	Master      string
	ClusterName string // cluster_name: names the SSD cache root
	InstanceKey string // instance_key: names this owner's SSD cache root
	NodeID      string // node_id: this owner's id in the cluster
	PeerListen  string // peer_listen: host:port of the peer service
	DataListen  string // data_listen: host:port of the data plane
	// AdvertiseHost (advertise_host) is the host other nodes reach this owner at.
	AdvertiseHost string
	MetricsAddr   string // metrics_addr: host:port of /metrics
	LogLevel      string // log_level: debug, info, warn, error
	LogFormat     string // log_format: json or text
	// ClusterSecretFiles (cluster_secret_files) hold the cluster's shared secret, the
	// first signing, any accepted; InsecureCluster (insecure_cluster) runs without.
	ClusterSecretFiles []string
	InsecureCluster    bool
	// MasterPubKeyFiles (master_pubkey_files) hold the master public keys the owner
	// accepts (docs/architecture.md §11), any of them.
	MasterPubKeyFiles []string
	// CacheGrace (cache_grace) keeps released holdings of local replicas in the hot
	// set this long: nil takes the daemon's default (30s), a pointer to 0 turns the
	// grace, and so the hot set, off ("off" or "0s").
	CacheGrace *time.Duration
	// HotSet (hot_set) is the fraction 0 < x ≤ 1 of the memory pool (the segment less
	// the transfer area) that idle hot-set holdings may keep pinned: nil takes the
	// daemon's default (0.5), a pointer to 0 turns the hot set off ("off" or 0).
	HotSet *float64
	// UIDShare (uid_share) is the largest share of each socket's connection cap, the
	// put areas' total and the frame memory that one client uid other than the owner's
	// and root may take: a fraction 0 < x ≤ 1; nil takes the daemon's default (no
	// per-uid bound), as does "off" (1).
	UIDShare *float64
	// MaxConnections (max_connections) caps the open connections of each owner
	// socket; 0 derives the cap from RLIMIT_NOFILE.
	MaxConnections int
	// HelloTimeout (hello_timeout) bounds the wait for an attach hello, FrameTimeout
	// (frame_timeout) a partial RPC frame, IdleTimeout (idle_timeout) an RPC
	// connection without a live session. Zero: the daemon's defaults.
	HelloTimeout, FrameTimeout, IdleTimeout time.Duration
	// ClientIsolation (client_isolation): seal the segment against client writes and
	// take puts through per-session put areas (docs/architecture.md §11). nil: the default.
	ClientIsolation *bool
	// Prefault (prefault): allocate the whole segment at start (every page faulted in)
	// rather than as puts first write each page. nil: the default, true.
	Prefault *bool
	// HugePages (huge_pages): advise transparent huge pages for the segment. nil: the
	// default, true.
	HugePages *bool
	// TransferReserve (transfer_reserve) is the owner's transfer area for puts placed
	// on other owners: nil takes the daemon's default, a pointer to 0 means none
	// ("off" or 0).
	TransferReserve *int64
	// LandingReserve (landing_reserve) is memory beyond dram for gets of values held by
	// other owners that are not promoted (0: none).
	LandingReserve int64
	// AllowedUIDs (allowed_uids) may attach besides root, the owner's uid and members
	// of the socket's group.
	AllowedUIDs []uint32
	// PutArea (put_area) is each session's put area under isolation, PutAreaTotal
	// (put_area_total) the cap on all live sessions' areas together. 0: the defaults.
	PutArea, PutAreaTotal int64
	// FrameMemory (frame_memory) bounds the bytes of request frames in progress across
	// the owner's RPC and peer connections. 0: the daemon's default.
	FrameMemory int64
	// EtcdCACert (etcd_cacert) verifies etcd's certificate, EtcdCert (etcd_cert) and
	// EtcdKey (etcd_key) authenticate the owner to etcd: with Master etcd://... only.
	EtcdCACert, EtcdCert, EtcdKey string

	// LargeFilePaths and LargeLimitSize are large_file_paths and the parsed
	// large_limit_size: one limit in bytes (≥ 512) per path. LargeLimitSize nil
	// means the SSD cache is off: large_limit_size absent with no paths, or null
	// (the seed's explicit "off", paths then kept but unused). Paths with
	// large_limit_size absent are refused: that typo would silently run without SSD.
	LargeFilePaths []string
	LargeLimitSize []int64
}

// SSDEnabled reports whether the SSD cache is on (large_limit_size was given).
func (o *Owner) SSDEnabled() bool { return o.LargeLimitSize != nil }

// Master is the master section. A zero field was not set by the file.
type Master struct {
	Listen            string        // listen: host:port the master serves on
	NodeTTL           time.Duration // node_ttl: tomb an owner silent this long
	HeartbeatInterval time.Duration // heartbeat_interval: told to owners at Register
	InflightTTL       time.Duration // inflight_ttl: revoke a put or get older than this
	AllocWait         time.Duration // alloc_wait: wait this long for space before NO_SPACE
	NoPromotion       bool          // no_promotion: SSD refills never become memory replicas
	PersistWorkers    int           // persist_workers: concurrent SSD persist calls (0: the default)
	Placement         string        // placement: pool or local (where puts' memory replicas go)
	SSDAdmit          string        // ssd_admit: evict or put (when KV pages reach SSD)
	MetricsAddr       string        // metrics_addr: host:port of /metrics
	LogLevel          string        // log_level: debug, info, warn, error
	LogFormat         string        // log_format: json or text
	// ClusterSecretFiles (cluster_secret_files) hold the cluster's shared secret, the
	// first signing, any accepted; InsecureCluster (insecure_cluster) runs without.
	ClusterSecretFiles []string
	InsecureCluster    bool
	// MasterKeyFile (master_key_file) holds the master's private key, which proves it
	// to owners (docs/architecture.md §11).
	MasterKeyFile string

	// High availability on etcd (docs/architecture.md §12); `fluxkv master` only. EtcdEndpoints
	// (etcd_endpoints) turn it on: the master campaigns there and serves while it
	// leads. The rest needs them.
	EtcdEndpoints []string
	// AdvertiseAddr (advertise_addr) is the host:port owners reach this master at,
	// published while it leads; required when listen is a wildcard or port 0.
	AdvertiseAddr string
	// EtcdPrefix (etcd_prefix) is the key prefix of the cluster on etcd, starting and
	// ending with "/"; default /fluxkv/<cluster_name>/.
	EtcdPrefix string
	// ClusterName (cluster_name) names the cluster in the default etcd prefix.
	ClusterName string
	// EtcdCACert (etcd_cacert) verifies etcd's certificate; EtcdCert (etcd_cert) and
	// EtcdKey (etcd_key), both or neither, authenticate the master to etcd.
	EtcdCACert, EtcdCert, EtcdKey string
	// LeaderTTL (leader_ttl) is the etcd lease TTL of the leadership; 0 = default (2s).
	LeaderTTL time.Duration
}

// Error is a bad config: the dotted key it concerns (empty for the file as a whole),
// the line it is on and what is wrong.
type Error struct {
	File string
	Line int
	Key  string
	Err  error
	// nested: Err's message already starts with the rest of the key
	// (ssd's "large_limit_size[1]: ..."), so Key and Err join with a dot.
	nested bool
}

func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		fmt.Fprintf(&b, "%s: ", e.File)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	switch {
	case e.Key != "" && e.nested:
		b.WriteString(e.Key + ".")
	case e.Key != "":
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

func keyErr(n *yaml.Node, key string, format string, args ...any) *Error {
	return &Error{Line: n.Line, Key: key, Err: fmt.Errorf(format, args...)}
}

// Load reads and parses the file at path for role.
func Load(path string, role Role) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	f, err := Parse(data, role)
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.File = path
			return nil, ce
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.Path = path
	return f, nil
}

// Parse parses one YAML document for role.
func Parse(data []byte, role Role) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &File{}, nil // an empty file sets nothing
		}
		return nil, &Error{Err: err}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		if err != nil {
			return nil, &Error{Err: err}
		}
		return nil, &Error{Line: line, Err: errors.New("more than one YAML document")}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return &File{}, nil
		}
		root = root.Content[0]
	}
	if isNull(root) {
		return &File{}, nil
	}
	f := &File{}
	err := walkMapping(root, "", map[string]func(*yaml.Node) error{
		OwnerSection: func(v *yaml.Node) error {
			if role == RoleMaster {
				return keyErr(v, OwnerSection, "not read by `fluxkv master` (its settings are under %s:)", MasterSection)
			}
			if isNull(v) {
				return nil
			}
			o, err := parseOwner(v, role)
			f.Owner = o
			return err
		},
		MasterSection: func(v *yaml.Node) error {
			if role == RoleOwner {
				return keyErr(v, MasterSection, "not read by `fluxkv owner` (its settings are under %s:; the master's address is %s.master)", OwnerSection, OwnerSection)
			}
			if isNull(v) {
				return nil
			}
			m, err := parseMaster(v, role)
			f.Master = m
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}
