package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// runCluster runs command with its real flags up to the loading of the cluster
// secrets, as the command does, and returns them.
func runCluster(t *testing.T, command, yaml string, args ...string) (*auth.Secrets, error) {
	t.Helper()
	if yaml != "" {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", p}, args...)
	}
	var (
		secrets *auth.Secrets
		got     error
	)
	run := func(c *cli.Context) error {
		role := map[string]config.Role{"master": config.RoleMaster, "owner": config.RoleOwner, "up": config.RoleUp}[command]
		f, err := loadConfig(c, role)
		if err != nil {
			return err
		}
		switch command {
		case "master":
			mc, err := masterSettings(c, f)
			if err != nil {
				return err
			}
			secrets, err = clusterSecrets(c, "master", masterSecretsKey, mc.ClusterSecretFiles, mc.InsecureCluster)
			return err
		case "owner":
			oc, err := ownerSettings(c, f)
			if err != nil {
				return err
			}
			secrets, err = clusterSecrets(c, "owner", ownerSecretsKey, oc.ClusterSecretFiles, oc.InsecureCluster)
			return err
		default:
			oc, err := ownerSettings(c, f)
			if err != nil {
				return err
			}
			secrets, err = upSecrets(c, f, oc.SocketDir)
			return err
		}
	}
	cmd := map[string]func() *cli.Command{"master": masterCommand, "owner": ownerCommand, "up": upCommand}[command]()
	cmd.Action = func(c *cli.Context) error { got = run(c); return nil }
	app := &cli.App{Name: "fluxkv", Flags: logFlags(), Commands: []*cli.Command{cmd}}
	if err := app.Run(append([]string{"fluxkv", command}, args...)); err != nil {
		t.Fatalf("app: %v", err)
	}
	return secrets, got
}

func secretFile(t *testing.T, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(p, []byte(strings.Repeat("k", 40)), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, mode)
	return p
}

func TestClusterSecretSettings(t *testing.T) {
	good, open := secretFile(t, 0o600), secretFile(t, 0o644)
	other := secretFile(t, 0o600)
	missing := filepath.Join(t.TempDir(), "nope")
	owner := []string{"--master", "127.0.0.1:1", "--dir", t.TempDir()}
	for _, tc := range []struct {
		name, command, yaml string
		args                []string
		wantErr             string // "" = starts
		wantPaths           []string
	}{
		{name: "master without either", command: "master",
			wantErr: "fluxkv master: no cluster secret: give --cluster-secret-file PATH (YAML master.cluster_secret_files"},
		{name: "owner without either names both flags", command: "owner", args: owner, wantErr: "or --insecure-cluster to run without authentication"},
		{name: "missing file", command: "master", args: []string{"--cluster-secret-file", missing},
			wantErr: "--cluster-secret-file: cluster secret file " + missing + " does not exist"},
		{name: "other-readable file", command: "owner", args: append([]string{"--cluster-secret-file", open}, owner...),
			wantErr: "is readable by others (mode 0644)"},
		{name: "bad file from YAML names the key", command: "owner", args: owner,
			yaml: "fluxkv_spec: {cluster_secret_files: [" + open + "]}", wantErr: "fluxkv_spec.cluster_secret_files (--cluster-secret-file): cluster secret file"},
		{name: "flag replaces the file's list", command: "master", args: []string{"--cluster-secret-file", good},
			yaml: "master: {cluster_secret_files: [" + open + "]}", wantPaths: []string{good}},
		{name: "rotation: two files", command: "owner", args: append([]string{"--cluster-secret-file", good, "--cluster-secret-file", other}, owner...),
			wantPaths: []string{good, other}},
		{name: "insecure", command: "master", args: []string{"--insecure-cluster"}},
		{name: "insecure from YAML", command: "owner", args: owner, yaml: "fluxkv_spec: {insecure_cluster: true}"},
		{name: "insecure and a file", command: "master", args: []string{"--insecure-cluster", "--cluster-secret-file", good},
			wantErr: "--cluster-secret-file and --insecure-cluster contradict each other"},
		{name: "insecure and a file in YAML name the keys", command: "owner", args: owner,
			yaml:    "fluxkv_spec: {insecure_cluster: true, cluster_secret_files: [" + good + "]}",
			wantErr: "fluxkv_spec.cluster_secret_files (--cluster-secret-file) and fluxkv_spec.insecure_cluster (--insecure-cluster) contradict each other"},
		{name: "a file flag over YAML's insecure", command: "master", args: []string{"--cluster-secret-file", good},
			yaml: "master: {insecure_cluster: true}", wantPaths: []string{good}},
		{name: "up: sections differ", command: "up", args: []string{"--dir", t.TempDir()},
			yaml:    "fluxkv_spec: {cluster_secret_files: [" + good + "]}\nmaster: {cluster_secret_files: [" + other + "]}",
			wantErr: "differ: up's master and owner share one secret"},
		{name: "up: the master section's file", command: "up", args: []string{"--dir", t.TempDir()},
			yaml: "master: {cluster_secret_files: [" + good + "]}", wantPaths: []string{good}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := runCluster(t, tc.command, tc.yaml, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if ec, ok := err.(cli.ExitCoder); !ok || ec.ExitCode() != 2 {
					t.Fatalf("error %v is not exit status 2", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantPaths == nil {
				if s != nil {
					t.Fatalf("secrets %v, want none (insecure)", s.Paths())
				}
				return
			}
			if strings.Join(s.Paths(), ",") != strings.Join(tc.wantPaths, ",") {
				t.Fatalf("paths %v, want %v", s.Paths(), tc.wantPaths)
			}
		})
	}
}

// up without a secret creates DIR/cluster.secret (0600, in a directory that may not
// exist yet) and uses the same one on the next start.
func TestUpCreatesSecret(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	s1, err := runCluster(t, "up", "", "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "cluster.secret")
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", p, fi, err)
	}
	b1, _ := os.ReadFile(p)
	s2, err := runCluster(t, "up", "", "--dir", dir)
	b2, _ := os.ReadFile(p)
	if err != nil || string(b1) != string(b2) || s1.Paths()[0] != p || s2.Paths()[0] != p {
		t.Fatalf("second start: %v; secret changed: %v", err, string(b1) != string(b2))
	}
}
