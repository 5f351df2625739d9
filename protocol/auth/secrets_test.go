package auth

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

func TestLoadSecrets(t *testing.T) {
	good := strings.Repeat("s", 40)
	a := writeFile(t, "a", "  "+good+"\n", 0o600)
	b := writeFile(t, "b", strings.Repeat("t", 32), 0o400)
	s, err := LoadSecrets([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if string(s.keys[0]) != good || len(s.keys) != 2 || s.Paths()[1] != b {
		t.Fatalf("keys %q paths %v", s.keys, s.Paths())
	}
	ownGroup := writeFile(t, "g", good, 0o640)
	if err := os.Chown(ownGroup, -1, os.Getegid()); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSecrets([]string{ownGroup}); err != nil {
		t.Fatalf("group-readable by the process's own group: %v", err)
	}

	dir := t.TempDir()
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "nope"), "does not exist; make one with: (umask 077; head -c 32 /dev/urandom | base64"},
		{"empty", writeFile(t, "e", " \n\t", 0o600), "is empty"},
		{"short", writeFile(t, "s", "0123456789", 0o600), "holds 10 bytes, want at least 32"},
		{"other-readable", writeFile(t, "o", good, 0o604), "is readable by others (mode 0604)"},
		{"a directory", dir, "is not a regular file"},
		{"too large", writeFile(t, "l", strings.Repeat("x", 5000), 0o600), "larger than 4096 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadSecrets([]string{a, tc.path})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("got %v, want %q naming %s", err, tc.want, tc.path)
			}
		})
	}
	if _, err := LoadSecrets(nil); err == nil {
		t.Fatal("no files accepted")
	}
}

// A file readable by a group this process is not in is refused (needs root to chown).
func TestLoadSecretsForeignGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: chgrp to a group this process is not in needs root")
	}
	const nogroup = 65534
	if inGroup(nogroup) {
		t.Skip("skipped: this process is in group 65534")
	}
	p := writeFile(t, "f", strings.Repeat("s", 40), 0o640)
	if err := os.Chown(p, -1, nogroup); err != nil {
		t.Fatal(err)
	}
	_, err := LoadSecrets([]string{p})
	if err == nil || !strings.Contains(err.Error(), "readable by group 65534, which this process") {
		t.Fatalf("got %v", err)
	}
}

func TestGenerateSecretFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cluster.secret")
	if err := GenerateSecretFile(p); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	s, err := LoadSecrets([]string{p})
	if err != nil || len(s.keys[0]) != 44 {
		t.Fatalf("%v, %d bytes", err, len(s.keys[0]))
	}
	if err := GenerateSecretFile(p); err == nil {
		t.Fatal("overwrote an existing secret")
	}
}

// trustFile is a file of whom a node trusts, and how it is loaded.
type trustFile struct {
	name, path string
	load       func(string) error
}

// trustFiles writes a cluster secret and a master key pair (mode 0600, 0600, 0644).
func trustFiles(t *testing.T) []trustFile {
	t.Helper()
	d := t.TempDir()
	key, pub := filepath.Join(d, "master.key"), filepath.Join(d, "master.pub")
	if err := GenerateMasterKeyFiles(key, pub); err != nil {
		t.Fatal(err)
	}
	secret := writeFile(t, "secret", strings.Repeat("s", 40), 0o600)
	return []trustFile{
		{name: "cluster secret", path: secret, load: func(p string) error { _, err := LoadSecrets([]string{p}); return err }},
		{name: "master key", path: key, load: func(p string) error { _, err := LoadMasterKey(p); return err }},
		{name: "master public key", path: pub, load: func(p string) error { _, err := LoadMasterPubKeys([]string{p}); return err }},
	}
}

// TestTrustFilesWritableByOthers: a file anyone may write is refused, whatever it
// holds: whoever rewrites a cluster secret, a master key or an accepted master public
// key chooses who this node trusts from its next start (a public key file is public,
// but it is the anchor of the master proof).
func TestTrustFilesWritableByOthers(t *testing.T) {
	modes := map[string]os.FileMode{"cluster secret": 0o602, "master key": 0o602, "master public key": 0o646}
	for _, tc := range trustFiles(t) {
		mode := modes[tc.name]
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Chmod(tc.path, mode); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("is writable by others (mode %04o)", mode)
			if err := tc.load(tc.path); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("mode %04o: got %v, want %q", mode, err, want)
			}
		})
	}
}

// TestTrustFilesOwnedByOthers: a secret or key file owned by another user than this
// process's (or root) is refused whatever its mode: its owner may rewrite it (a
// directory under /tmp another user made first, with its own files in it).
func TestTrustFilesOwnedByOthers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another user takes root")
	}
	const nobody = 65534
	for _, tc := range trustFiles(t) {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.load(tc.path); err != nil {
				t.Fatalf("owned by this process's user: %v", err)
			}
			if err := os.Chown(tc.path, nobody, -1); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("is owned by uid %d", nobody)
			if err := tc.load(tc.path); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("owned by uid %d: got %v, want %q", nobody, err, want)
			}
		})
	}
}
