package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The systemd units and install script in scripts/.

const scriptsDir = "../../scripts"

// unitDirectives reads KEY=VALUE lines of a unit file (comments skipped); a key
// given several times keeps every value.
func unitDirectives(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=VALUE", path, line)
		}
		out[k] = append(out[k], v)
	}
	return out
}

// unitKeyFlag is the master key flag each unit gives: the master signs, owners verify.
var unitKeyFlag = map[string]string{
	"master": " --master-key-file /etc/fluxkv/master.key",
	"owner":  " --master-pubkey-file /etc/fluxkv/master.pub",
}

func TestSystemdUnits(t *testing.T) {
	for _, role := range []string{"master", "owner"} {
		t.Run(role, func(t *testing.T) {
			d := unitDirectives(t, filepath.Join(scriptsDir, "fluxkv-"+role+".service"))
			want := map[string]string{
				"ExecStart":      "/usr/local/bin/fluxkv " + role + " --config /etc/fluxkv/" + role + ".yaml --cluster-secret-file /etc/fluxkv/cluster.secret" + unitKeyFlag[role],
				"User":           "fluxkv",
				"Group":          "fluxkv",
				"Restart":        "on-failure",
				"KillSignal":     "SIGTERM",
				"LimitMEMLOCK":   "infinity",
				"LimitNOFILE":    "1048576",
				"TimeoutStopSec": "20s",
				"WantedBy":       "multi-user.target",
			}
			if role == "owner" {
				// The socket directory of fluxkv_spec.socket_dir in the example config.
				want["RuntimeDirectory"] = "fluxkv"
				// Kept across a restart: a client container bind-mounting it keeps seeing it.
				want["RuntimeDirectoryPreserve"] = "restart"
			}
			for k, v := range want {
				if got := d[k]; len(got) != 1 || got[0] != v {
					t.Errorf("%s=%q, want %q", k, got, v)
				}
			}
			if role == "master" && len(d["RuntimeDirectory"]) != 0 {
				t.Errorf("the master unit must not own /run/fluxkv (stopping it would remove the owner's socket)")
			}
		})
	}
}

// systemd-analyze verify accepts both units (ExecStart pointed at an existing
// executable, since verify checks that it exists).
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian package systemd); cannot verify the units here")
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no `true` executable to stand in for the fluxkv binary")
	}
	dir := t.TempDir()
	var units []string
	for _, role := range []string{"master", "owner"} {
		name := "fluxkv-" + role + ".service"
		b, err := os.ReadFile(filepath.Join(scriptsDir, name))
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/fluxkv"), []byte(truePath))
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, p)
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// verify exits 0 on unknown keys and bad values, warning on stderr.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "fluxkv-") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
}

func TestInstallScript(t *testing.T) {
	if _, err := exec.LookPath("install"); err != nil {
		t.Skip("coreutils install(1) is missing")
	}
	dest := t.TempDir()
	bin := filepath.Join(t.TempDir(), "fluxkv")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func() string {
		t.Helper()
		cmd := exec.Command("bash", filepath.Join(scriptsDir, "install.sh"))
		cmd.Env = append(os.Environ(), "DESTDIR="+dest, "PREFIX=/opt/fk", "BIN="+bin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	run()
	fi, err := os.Stat(filepath.Join(dest, "opt/fk/bin/fluxkv"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("binary: %v %v", fi, err)
	}
	for _, role := range []string{"master", "owner"} {
		d := unitDirectives(t, filepath.Join(dest, "lib/systemd/system", "fluxkv-"+role+".service"))
		if want := "/opt/fk/bin/fluxkv " + role + " --config /etc/fluxkv/" + role + ".yaml --cluster-secret-file /etc/fluxkv/cluster.secret" + unitKeyFlag[role]; len(d["ExecStart"]) != 1 || d["ExecStart"][0] != want {
			t.Errorf("installed %s unit ExecStart=%q, want %q", role, d["ExecStart"], want)
		}
	}
	for _, cfg := range []string{"master.yaml", "owner.yaml", "up.yaml"} {
		got, err := os.ReadFile(filepath.Join(dest, "etc/fluxkv", cfg))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(filepath.Join(scriptsDir, "examples", cfg))
		if !bytes.Equal(got, want) {
			t.Errorf("installed %s differs from scripts/examples/%s", cfg, cfg)
		}
	}
	// A staged install never ships a secret or a master key: each site makes its own.
	for _, f := range []string{"master.key", "master.pub"} {
		if _, err := os.Stat(filepath.Join(dest, "etc/fluxkv", f)); err == nil {
			t.Errorf("install staged %s under DESTDIR", f)
		}
	}
	if _, err := os.Stat(filepath.Join(dest, "etc/fluxkv/cluster.secret")); err == nil {
		t.Errorf("install staged a cluster secret under DESTDIR")
	}
	// A second install keeps the operator's edited config.
	owner := filepath.Join(dest, "etc/fluxkv/owner.yaml")
	if err := os.WriteFile(owner, []byte("fluxkv_spec: {dram: 2GiB}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run()
	if b, _ := os.ReadFile(owner); string(b) != "fluxkv_spec: {dram: 2GiB}\n" {
		t.Errorf("install overwrote an existing config: %q", b)
	}
	if !strings.Contains(out, "kept existing") {
		t.Errorf("install did not say it kept the config:\n%s", out)
	}
	if !strings.Contains(out, "/etc/fluxkv/cluster.secret") {
		t.Errorf("a staged install did not say how to make the cluster secret:\n%s", out)
	}
}

// demo.sh (make run) stops as soon as `up` exits without its socket, with up's exit
// status and error, instead of waiting out its start budget for a socket that cannot
// come.
func TestDemoScriptStopsWhenUpFails(t *testing.T) {
	cmd := exec.Command("bash", filepath.Join(scriptsDir, "demo.sh"))
	cmd.Env = append(os.Environ(), "BIN="+fluxkvBin(t), "DIR="+t.TempDir(), "DRAM=12XB")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("demo.sh: %v, want up's exit status 2\n%s", err, out)
	}
	for _, want := range []string{`--dram: size "12XB"`, "fluxkv up exited (status 2) before its socket appeared"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo.sh output lacks %q:\n%s", want, out)
		}
	}
}

// The README's first commands (make run, make test) build with the go tool: before
// them it names the Go release go.mod requires, which a fresh Debian does not have
// (its golang-go is older), so they do not end in "go: command not found" unexplained.
func TestReadmeNamesGoRelease(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var release string
	for _, l := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(l, "go "); ok {
			parts := strings.SplitN(strings.TrimSpace(v), ".", 3)
			if len(parts) >= 2 {
				release = parts[0] + "." + parts[1]
			}
		}
	}
	if release == "" {
		t.Fatal("go.mod has no go directive")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(string(readme), "\n## ")
	if !strings.Contains(head, "Go "+release) {
		t.Errorf("README.md before its first section does not name Go %s (go.mod: go %s...): make run and make test need it", release, release)
	}
}
