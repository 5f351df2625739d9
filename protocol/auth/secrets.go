package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// MinSecretLen is the shortest secret accepted, in bytes after trimming whitespace.
const MinSecretLen = 32

// maxSecretFile bounds what is read of a secret file.
const maxSecretFile = 4096

// makeSecretHint tells users how to make a secret file.
const makeSecretHint = "make one with: (umask 077; head -c 32 /dev/urandom | base64 > FILE)"

// Secrets are the cluster secrets of a process: the first signs this process's
// handshakes, any of them is accepted from a peer. Rotation thus takes three rolling
// restarts: old then new everywhere, new then old everywhere, new alone (a node that
// signs with new is refused by one that holds old alone). A nil *Secrets means the
// process runs without cluster authentication (--insecure-cluster).
type Secrets struct {
	keys  [][]byte
	paths []string // where each key came from; empty for NewSecrets
}

// NewSecrets returns secrets from raw keys, the first signing; each must be at least
// MinSecretLen bytes. LoadSecrets is the way for files; this one is for tests and
// generated keys.
func NewSecrets(keys ...[]byte) (*Secrets, error) {
	if len(keys) == 0 {
		return nil, errors.New("cluster secrets: none given")
	}
	s := &Secrets{}
	for i, k := range keys {
		if len(k) < MinSecretLen {
			return nil, fmt.Errorf("cluster secret %d: %d bytes, want at least %d", i, len(k), MinSecretLen)
		}
		s.keys = append(s.keys, bytes.Clone(k))
	}
	return s, nil
}

// Paths are the files the secrets were loaded from, the signing one first.
func (s *Secrets) Paths() []string { return s.paths }

// LoadSecrets reads one secret from each file, the first signing. A file is refused
// when it is missing, not a regular file, empty or shorter than MinSecretLen bytes
// after trimming whitespace, readable or writable by others, or readable by a group this process
// is not in (its effective gid or a supplementary group: the service may share a
// secret with the group it runs as, never with one it does not belong to).
func LoadSecrets(paths []string) (*Secrets, error) {
	if len(paths) == 0 {
		return nil, errors.New("cluster secrets: no file given")
	}
	s := &Secrets{}
	for _, p := range paths {
		k, err := loadSecret(p)
		if err != nil {
			return nil, err
		}
		s.keys = append(s.keys, k)
		s.paths = append(s.paths, p)
	}
	return s, nil
}

func loadSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("cluster secret file %s does not exist; %s", path, makeSecretHint)
		}
		return nil, fmt.Errorf("cluster secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cluster secret file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("cluster secret file %s is not a regular file", path)
	}
	if err := checkMode(path, fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("cluster secret file %s: %w", path, err)
	}
	if len(data) > maxSecretFile {
		return nil, fmt.Errorf("cluster secret file %s is larger than %d bytes: one secret per file", path, maxSecretFile)
	}
	k := bytes.TrimSpace(data)
	if len(k) == 0 {
		return nil, fmt.Errorf("cluster secret file %s is empty; %s", path, makeSecretHint)
	}
	if len(k) < MinSecretLen {
		return nil, fmt.Errorf("cluster secret file %s holds %d bytes, want at least %d; %s", path, len(k), MinSecretLen, makeSecretHint)
	}
	return k, nil
}

// checkMode refuses a secret others may read.
func checkMode(path string, fi os.FileInfo) error {
	return checkFileMode("cluster secret file", path, fi)
}

// checkWritable refuses a file (what names it in errors) anyone may write: whoever
// rewrites a secret or a key chooses whom this node trusts from its next start. So
// does its owner, whatever its mode: it must be this process's user or root.
func checkWritable(what, path string, fi os.FileInfo) error {
	if perm := fi.Mode().Perm(); perm&0o002 != 0 {
		return fmt.Errorf("%s %s is writable by others (mode %04o): chmod o-w %s", what, path, perm, path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s %s: cannot read its owner", what, path)
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%s %s is owned by uid %d, neither root nor this process's user (uid %d), who could rewrite it: chown it",
			what, path, uid, os.Geteuid())
	}
	return nil
}

// checkFileMode refuses a private file (what names it in errors) others may read or
// write.
func checkFileMode(what, path string, fi os.FileInfo) error {
	if err := checkWritable(what, path, fi); err != nil {
		return err
	}
	perm := fi.Mode().Perm()
	if perm&0o004 != 0 {
		return fmt.Errorf("%s %s is readable by others (mode %04o): chmod 600 %s", what, path, perm, path)
	}
	if perm&0o040 == 0 {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s %s: cannot read its group", what, path)
	}
	if inGroup(int(st.Gid)) {
		return nil
	}
	return fmt.Errorf("%s %s is readable by group %d, which this process (gid %d) is not in: chmod 600 %s, or chgrp it to the service's group",
		what, path, st.Gid, os.Getegid(), path)
}

// inGroup reports whether gid is this process's effective gid or a supplementary group.
func inGroup(gid int) bool {
	if gid == os.Getegid() {
		return true
	}
	groups, _ := os.Getgroups()
	for _, g := range groups {
		if g == gid {
			return true
		}
	}
	return false
}

// GenerateSecretFile creates path (which must not exist) with mode 0600 holding a
// new random secret: 32 random bytes, base64-encoded.
func GenerateSecretFile(path string) error {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("generate cluster secret: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create cluster secret file: %w", err)
	}
	_, err = f.WriteString(base64.StdEncoding.EncodeToString(raw[:]) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("write cluster secret file %s: %w", path, err)
	}
	return nil
}
