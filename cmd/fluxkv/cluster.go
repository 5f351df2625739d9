package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Cluster authentication (docs/architecture.md §11): master, owner and up take the shared secret
// from --cluster-secret-file (repeatable: the first signs, any is accepted) or their
// YAML section's cluster_secret_files. master and owner without one refuse to start
// unless --insecure-cluster says so; up creates DIR/cluster.secret when it has none.

// upSecretName is the secret `up` creates in its socket directory when given none.
const upSecretName = "cluster.secret"

func clusterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "cluster-secret-file",
			Usage: "file holding the cluster's shared secret (≥ 32 bytes; mode 0600, or 0640 with a group this process is in; " +
				"make one with: head -c 32 /dev/urandom | base64); repeat to rotate: the first signs, any is accepted " +
				"[master.cluster_secret_files, fluxkv_spec.cluster_secret_files]"},
		&cli.BoolFlag{Name: "insecure-cluster",
			Usage: "run without cluster authentication: anyone who can reach the master or peer port may call it; every node must agree " +
				"[master.insecure_cluster, fluxkv_spec.insecure_cluster]"},
	}
}

// clusterSettings merges --cluster-secret-file and --insecure-cluster over the file's
// values: each flag given on the command line replaces the file's (--insecure-cluster=false
// turns the file's insecure_cluster off), and one that chooses a mode replaces the file's
// other setting too: secret files on the command line over a file's insecure_cluster,
// --insecure-cluster over its cluster_secret_files (make install's units always pass
// --cluster-secret-file; a file saying insecure_cluster: true refused every start).
func clusterSettings(c *cli.Context, fileFiles []string, fileInsecure bool) ([]string, bool) {
	files, insecure := fileFiles, fileInsecure
	if c.IsSet("cluster-secret-file") {
		files = c.StringSlice("cluster-secret-file")
		if !c.IsSet("insecure-cluster") {
			insecure = false
		}
	}
	if c.IsSet("insecure-cluster") {
		insecure = c.Bool("insecure-cluster")
		if insecure && !c.IsSet("cluster-secret-file") {
			files = nil
		}
	}
	return files, insecure
}

// YAML keys of the secret files.
const (
	ownerSecretsKey  = config.OwnerSection + ".cluster_secret_files"
	masterSecretsKey = config.MasterSection + ".cluster_secret_files"
)

// clusterSecrets loads the secrets of a master, owner or up (role), or returns nil for
// an insecure cluster; key is the YAML key the files came from unless the flag gave
// them. Missing or bad secrets refuse the start (exit status 2).
func clusterSecrets(c *cli.Context, role, key string, files []string, insecure bool) (*auth.Secrets, error) {
	name := settingName(c, "cluster-secret-file", key, true)
	switch {
	case len(files) > 0 && insecure:
		// Only both from the command line, or both from the file (clusterSettings).
		return nil, refuse("%s and %s contradict each other: give one", name,
			settingName(c, "insecure-cluster", strings.TrimSuffix(key, "cluster_secret_files")+"insecure_cluster", true))
	case insecure:
		logger.Warn().Str("role", role).Msg("running WITHOUT cluster authentication (--insecure-cluster): anyone who can reach this node's " +
			"master or peer port can call it; use --cluster-secret-file on every node")
		return nil, nil
	case len(files) == 0:
		return nil, refuse("fluxkv %s: no cluster secret: give --cluster-secret-file PATH (YAML %s; make one with "+
			"(umask 077; head -c 32 /dev/urandom | base64 > PATH) and give every node of the cluster the same file), "+
			"or --insecure-cluster to run without authentication", role, key)
	}
	s, err := auth.LoadSecrets(files)
	if err != nil {
		return nil, refuse("%s: %v", name, err)
	}
	logger.Info().Str("role", role).Strs("cluster_secret_files", files).Msg("cluster authentication on")
	return s, nil
}

// upSecrets are the secrets of `up`: the flag's files, else the fluxkv_spec section's,
// else the master section's (the two sections must not name different files); with
// none, DIR/cluster.secret, created (0600) when absent, so the quick start needs none.
func upSecrets(c *cli.Context, f *config.File, dir string) (*auth.Secrets, error) {
	var of, mf []string
	var insecure bool
	if f.Owner != nil {
		of, insecure = f.Owner.ClusterSecretFiles, f.Owner.InsecureCluster
	}
	if f.Master != nil {
		mf, insecure = f.Master.ClusterSecretFiles, insecure || f.Master.InsecureCluster
	}
	if !c.IsSet("cluster-secret-file") && len(of) > 0 && len(mf) > 0 && !slices.Equal(of, mf) {
		return nil, refuse("fluxkv_spec.cluster_secret_files %v and master.cluster_secret_files %v differ: up's master and owner share one secret; set one of them",
			of, mf)
	}
	key, fileFiles := ownerSecretsKey, of
	if len(of) == 0 {
		key, fileFiles = masterSecretsKey, mf
	}
	files, insecure := clusterSettings(c, fileFiles, insecure)
	if len(files) == 0 && !insecure {
		p := filepath.Join(dir, upSecretName)
		err := os.MkdirAll(dir, 0o755) // as the owner makes it
		if err == nil {
			_, err = wire.CheckDir(dir) // before a secret goes in it (the owner warns of a shared one)
		}
		if err == nil {
			err = auth.GenerateSecretFile(p)
		}
		switch {
		case err == nil:
			logger.Info().Str("path", p).Msg("created a cluster secret for this node (give it to other nodes with --cluster-secret-file)")
		case !errors.Is(err, os.ErrExist):
			return nil, refuse("cannot create %s: %v (or give --cluster-secret-file)", p, err)
		}
		files = []string{p}
	}
	return clusterSecrets(c, "up", key, files, insecure)
}
