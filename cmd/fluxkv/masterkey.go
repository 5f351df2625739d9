package main

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// Master keys (docs/architecture.md §11): the cluster secret makes a process a member; a master
// also proves it is one with its private key (--master-key-file), whose public half
// owners accept (--master-pubkey-file, repeatable for rotation). A master or owner with
// a cluster secret and no key refuses to start; up uses DIR/master.key, created with
// DIR/master.pub (for other owners) when absent, and its owner accepts it.

// Names of the key pair `up` creates in its socket directory when given none.
const (
	upMasterKeyName    = "master.key"
	upMasterPubKeyName = "master.pub"
)

// YAML keys of the master key files.
const (
	masterKeyKey     = config.MasterSection + ".master_key_file"
	ownerPubKeysKey  = config.OwnerSection + ".master_pubkey_files"
	masterKeyHint    = "make a pair with: fluxkv gen-master-key --master-key-file KEY --master-pubkey-file PUB"
	masterKeyFlagDoc = "the master's Ed25519 private key (PEM PKCS#8, mode 0600), which proves it to owners: they answer master-only " +
		"calls (PullPut, BatchSsdReplicaPersist, InvalidateCachedInfo, ReleaseHotSet) only from it; " + masterKeyHint
)

func masterKeyFlag() cli.Flag {
	return &cli.StringFlag{Name: "master-key-file", Usage: masterKeyFlagDoc + " [" + masterKeyKey + "]"}
}

func masterPubKeyFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: "master-pubkey-file",
		Usage: "a master public key this owner accepts (PEM PKIX Ed25519, the master's --master-key-file's public half); repeat to rotate: " +
			"any is accepted [" + ownerPubKeysKey + "]"}
}

// masterKeyFile is --master-key-file, else the config's master.master_key_file.
func masterKeyFile(c *cli.Context, f *config.File) (string, bool) {
	if c.IsSet("master-key-file") {
		return c.String("master-key-file"), false
	}
	if f.Master != nil {
		return f.Master.MasterKeyFile, f.Master.MasterKeyFile != ""
	}
	return "", false
}

// masterPubKeyFiles is --master-pubkey-file, else the config's fluxkv_spec.master_pubkey_files.
func masterPubKeyFiles(c *cli.Context, f *config.File) ([]string, bool) {
	if c.IsSet("master-pubkey-file") {
		return c.StringSlice("master-pubkey-file"), false
	}
	if f.Owner != nil {
		return f.Owner.MasterPubKeyFiles, len(f.Owner.MasterPubKeyFiles) > 0
	}
	return nil, false
}

// clusterMasterKey loads a master's key; nil for an insecure cluster (secrets nil),
// where giving one is a contradiction. Exit status 2 for a missing or bad key.
func clusterMasterKey(c *cli.Context, f *config.File, secrets *auth.Secrets) (*auth.MasterKey, error) {
	path, fromFile := masterKeyFile(c, f)
	name := settingName(c, "master-key-file", masterKeyKey, fromFile)
	switch {
	case secrets == nil && path != "":
		return nil, refuse("%s and --insecure-cluster contradict each other: give one", name)
	case secrets == nil:
		return nil, nil
	case path == "":
		return nil, refuse("fluxkv master: no master key: give --master-key-file PATH (YAML %s; %s, and give every owner the public key "+
			"with --master-pubkey-file), or --insecure-cluster to run without authentication", masterKeyKey, masterKeyHint)
	}
	k, err := auth.LoadMasterKey(path)
	if err != nil {
		return nil, refuse("%s: %v", name, err)
	}
	logger.Info().Str("master_key_file", path).Msg("master key loaded: owners accept this master's calls")
	return k, nil
}

// clusterMasterPubKeys loads the master public keys an owner accepts; nil for an
// insecure cluster. own, when set (up's master), is accepted besides the files, which
// are then optional.
func clusterMasterPubKeys(c *cli.Context, f *config.File, secrets *auth.Secrets, own *auth.MasterKey) (*auth.MasterPubKeys, error) {
	paths, fromFile := masterPubKeyFiles(c, f)
	name := settingName(c, "master-pubkey-file", ownerPubKeysKey, fromFile)
	switch {
	case secrets == nil && len(paths) > 0:
		return nil, refuse("%s and --insecure-cluster contradict each other: give one", name)
	case secrets == nil:
		return nil, nil
	case len(paths) == 0 && own == nil:
		return nil, refuse("fluxkv owner: no master public key: give --master-pubkey-file PATH (YAML %s), the public half of the "+
			"master's --master-key-file (fluxkv up and make install create master.pub beside the secret), or --insecure-cluster to run without authentication",
			ownerPubKeysKey)
	}
	var keys *auth.MasterPubKeys
	if len(paths) > 0 {
		var err error
		if keys, err = auth.LoadMasterPubKeys(paths); err != nil {
			return nil, refuse("%s: %v", name, err)
		}
	}
	if own != nil {
		keys = keys.With(own.Public())
	}
	logger.Info().Strs("master_pubkey_files", paths).Bool("own_master", own != nil).Msg("master keys accepted")
	return keys, nil
}

// upMasterKey is up's master key: --master-key-file or master.master_key_file, else
// DIR/master.key, created with DIR/master.pub when absent (nil for an insecure cluster).
func upMasterKey(c *cli.Context, f *config.File, dir string, secrets *auth.Secrets) (*auth.MasterKey, error) {
	if path, _ := masterKeyFile(c, f); path != "" || secrets == nil {
		return clusterMasterKey(c, f, secrets)
	}
	key, pub := filepath.Join(dir, upMasterKeyName), filepath.Join(dir, upMasterPubKeyName)
	err := auth.GenerateMasterKeyFiles(key, pub)
	switch {
	case err == nil:
		logger.Info().Str("path", key).Str("public", pub).Msg("created a master key pair (give other owners the public key with --master-pubkey-file)")
	case !errors.Is(err, os.ErrExist):
		return nil, refuse("cannot create %s: %v (or give --master-key-file)", key, err)
	}
	k, err := auth.LoadMasterKey(key)
	if err != nil {
		return nil, refuse("%s: %v", key, err)
	}
	return k, nil
}

// genMasterKeyCommand creates a master key pair, as make install does.
func genMasterKeyCommand() *cli.Command {
	return &cli.Command{
		Name:  "gen-master-key",
		Usage: "create a master key pair: the private key for masters (--master-key-file), the public key for owners (--master-pubkey-file)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "master-key-file", Required: true, Usage: "the private key to create (mode 0600; kept when it exists)"},
			&cli.StringFlag{Name: "master-pubkey-file", Required: true, Usage: "the public key to create (mode 0644) from the private key"},
		},
		Action: func(c *cli.Context) error {
			key, pub := c.String("master-key-file"), c.String("master-pubkey-file")
			if err := auth.GenerateMasterKeyFiles(key, pub); err != nil {
				if errors.Is(err, os.ErrExist) {
					return cli.Exit(err.Error()+": nothing to do", 1)
				}
				return cli.Exit(err.Error(), 1)
			}
			logger.Info().Str("master_key_file", key).Str("master_pubkey_file", pub).Msg("master key pair ready")
			return nil
		},
	}
}
