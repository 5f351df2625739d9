package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
)

// Master keys (docs/architecture.md §11): the cluster secret makes a process a member; a master
// also holds an Ed25519 private key, whose public half every owner is given, and
// proves it in the handshake of each connection it opens to an owner's peer port
// (role.go). An owner cannot forge that proof, so master-only calls (PullPut,
// BatchSsdReplicaPersist, InvalidateCachedInfo, ReleaseHotSet) are answered only on a
// master's connection.
//
// Files are PEM, as openssl writes them: the private key a "PRIVATE KEY" block
// (PKCS#8; mode 0600, or 0640 with a group this process is in, like the secret), the
// public key a "PUBLIC KEY" block (PKIX; any mode). `fluxkv up` and `make install`
// create the pair; by hand: fluxkv gen-master-key, or
//
//	openssl genpkey -algorithm ed25519 -out master.key && openssl pkey -in master.key -pubout -out master.pub

// maxKeyFile bounds what is read of a key file.
const maxKeyFile = 4096

// makeKeyHint tells users how to make a key pair.
const makeKeyHint = "make a pair with: fluxkv gen-master-key --master-key-file KEY --master-pubkey-file PUB"

// MasterKey is a master's signing key. A nil *MasterKey signs nothing: the process
// connects as a plain member.
type MasterKey struct {
	priv ed25519.PrivateKey
	path string // where it came from; empty for NewMasterKey
}

// NewMasterKey wraps a private key (tests and generated keys; LoadMasterKey reads files).
func NewMasterKey(priv ed25519.PrivateKey) (*MasterKey, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("master key: %d bytes, want an Ed25519 private key (%d)", len(priv), ed25519.PrivateKeySize)
	}
	return &MasterKey{priv: priv}, nil
}

// GenerateMasterKey returns a new random key (tests; files: GenerateMasterKeyFiles).
func GenerateMasterKey() (*MasterKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate master key: %w", err)
	}
	return &MasterKey{priv: priv}, nil
}

// Public is the key's public half, what owners are given.
func (k *MasterKey) Public() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }

// Path is the file the key was loaded from ("" when it was not).
func (k *MasterKey) Path() string { return k.path }

func (k *MasterKey) sign(msg []byte) []byte { return ed25519.Sign(k.priv, msg) }

// MasterPubKeys are the master public keys an owner accepts: any of them proves a
// master (rotation: give owners the new key beside the old one, switch the masters to
// the new key, then drop the old one).
type MasterPubKeys struct {
	keys  []ed25519.PublicKey
	paths []string // where each came from; empty for NewMasterPubKeys
}

// NewMasterPubKeys returns the accepted keys (tests, and up's own master's key).
func NewMasterPubKeys(keys ...ed25519.PublicKey) (*MasterPubKeys, error) {
	if len(keys) == 0 {
		return nil, errors.New("master public keys: none given")
	}
	p := &MasterPubKeys{}
	for i, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("master public key %d: %d bytes, want an Ed25519 public key (%d)", i, len(k), ed25519.PublicKeySize)
		}
		p.keys = append(p.keys, k)
	}
	return p, nil
}

// Paths are the files the keys were loaded from.
func (p *MasterPubKeys) Paths() []string { return p.paths }

// With returns p and more (up's owner accepts its own master's key and any given ones).
func (p *MasterPubKeys) With(more ...ed25519.PublicKey) *MasterPubKeys {
	out := &MasterPubKeys{}
	if p != nil {
		out.keys, out.paths = append(out.keys, p.keys...), append(out.paths, p.paths...)
	}
	out.keys = append(out.keys, more...)
	return out
}

func (p *MasterPubKeys) verify(msg, sig []byte) bool {
	for _, k := range p.keys {
		if ed25519.Verify(k, msg, sig) {
			return true
		}
	}
	return false
}

// LoadMasterKey reads a master's private key. The file is refused when it is missing,
// not a regular file, readable or writable by others, readable by a group this process is not in, or not
// one PEM "PRIVATE KEY" block holding an Ed25519 key.
func LoadMasterKey(path string) (*MasterKey, error) {
	data, err := readKeyFile("master key file", path, true)
	if err != nil {
		return nil, err
	}
	b, rest := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("master key file %s: want one PEM \"PRIVATE KEY\" block (PKCS#8 Ed25519); %s", path, makeKeyHint)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("master key file %s: %v", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("master key file %s holds a %T, want an Ed25519 key; %s", path, k, makeKeyHint)
	}
	return &MasterKey{priv: priv, path: path}, nil
}

// LoadMasterPubKeys reads one public key from each file (PEM "PUBLIC KEY", PKIX Ed25519);
// a file others may write is refused.
func LoadMasterPubKeys(paths []string) (*MasterPubKeys, error) {
	if len(paths) == 0 {
		return nil, errors.New("master public keys: no file given")
	}
	p := &MasterPubKeys{}
	for _, path := range paths {
		k, err := loadMasterPubKey(path)
		if err != nil {
			return nil, err
		}
		p.keys = append(p.keys, k)
		p.paths = append(p.paths, path)
	}
	return p, nil
}

func loadMasterPubKey(path string) (ed25519.PublicKey, error) {
	data, err := readKeyFile("master public key file", path, false)
	if err != nil {
		return nil, err
	}
	b, rest := pem.Decode(data)
	if b == nil || b.Type != "PUBLIC KEY" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("master public key file %s: want one PEM \"PUBLIC KEY\" block (PKIX Ed25519); %s", path, makeKeyHint)
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("master public key file %s: %v", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("master public key file %s holds a %T, want an Ed25519 key", path, k)
	}
	return pub, nil
}

// readKeyFile reads a small regular file that others may not write; private ones must
// pass checkFileMode.
func readKeyFile(what, path string, private bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s %s does not exist; %s", what, path, makeKeyHint)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, path)
	}
	check := checkWritable // a public key is the anchor of the master proof: no one else may write it
	if private {
		check = checkFileMode
	}
	if err := check(what, path, fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("%s %s is larger than %d bytes: one key per file", what, path, maxKeyFile)
	}
	return data, nil
}

// GenerateMasterKeyFiles makes a new key pair: keyPath (which must not exist, mode
// 0600) and pubPath (0644). With keyPath present and pubPath missing it writes the
// existing key's public half; with both present it returns an error wrapping
// os.ErrExist and changes nothing; with only pubPath present it refuses (a new key
// would not match the public key owners may hold).
func GenerateMasterKeyFiles(keyPath, pubPath string) error {
	var k *MasterKey
	switch _, err := os.Stat(keyPath); {
	case err == nil:
		if _, err := os.Stat(pubPath); err == nil {
			return fmt.Errorf("master key files %s and %s: %w", keyPath, pubPath, os.ErrExist)
		}
		if k, err = LoadMasterKey(keyPath); err != nil {
			return err
		}
	case errors.Is(err, os.ErrNotExist):
		if _, err := os.Stat(pubPath); err == nil {
			// A new key would not match it: owners may already accept it.
			return fmt.Errorf("master public key file %s exists without its private key %s: restore the key, or remove the public key to make a new pair",
				pubPath, keyPath)
		}
		if k, err = GenerateMasterKey(); err != nil {
			return err
		}
		der, err := x509.MarshalPKCS8PrivateKey(k.priv)
		if err != nil {
			return fmt.Errorf("encode master key: %w", err)
		}
		if err := writeNewFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return fmt.Errorf("create master key file: %w", err)
		}
	default:
		return fmt.Errorf("master key file: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return fmt.Errorf("encode master public key: %w", err)
	}
	if err := writeNewFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("create master public key file: %w", err)
	}
	return nil
}

// writeNewFile creates path (it must not exist) with mode and data; it removes a
// partly written file.
func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
