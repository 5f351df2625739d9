package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testMasterKey(t testing.TB) *MasterKey {
	t.Helper()
	k, err := GenerateMasterKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testPubKeys(t testing.TB, keys ...*MasterKey) *MasterPubKeys {
	t.Helper()
	var pubs []ed25519.PublicKey
	for _, k := range keys {
		pubs = append(pubs, k.Public())
	}
	p, err := NewMasterPubKeys(pubs...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// roleHandshake runs both sides over a pipe: the server checks master claims with
// check, the client claims a master with key for the server named identity (nil key:
// a member).
func roleHandshake(t *testing.T, s *Secrets, check *MasterCheck, key *MasterKey, identity string) (Role, error, error) {
	t.Helper()
	return roleHandshakeAt(t, s, check, key, identity, "test-owner")
}

// roleHandshakeAt is roleHandshake with the server's connection at local (the client
// dials "test-owner").
func roleHandshakeAt(t *testing.T, s *Secrets, check *MasterCheck, key *MasterKey, identity, local string) (Role, error, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(5 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	type result struct {
		role Role
		err  error
	}
	done := make(chan result, 1)
	go func() {
		role, err := serverRoleHandshake(a, s, PurposePeer, local, check)
		a.Close()
		done <- result{role, err}
	}()
	var proof *masterProof
	if key != nil {
		proof = &masterProof{key: key, identity: func(string) string { return identity }}
	}
	nonce, cerr := readHello(b, PurposePeer, "test-owner")
	if cerr == nil {
		cerr = answerHello(b, s, PurposePeer, "test-owner", nonce, proof)
	}
	b.Close()
	r := <-done
	return r.role, r.err, cerr
}

func TestMasterRoleProof(t *testing.T) {
	s := testSecrets(t, "cluster")
	masterOld, masterNew, stranger := testMasterKey(t), testMasterKey(t), testMasterKey(t)
	owner := NewMasterCheck(testPubKeys(t, masterOld), "n1")
	rotating := NewMasterCheck(testPubKeys(t, masterNew, masterOld), "n1")
	for _, tc := range []struct {
		name      string
		check     *MasterCheck
		key       *MasterKey
		identity  string
		wantRole  Role
		wantError string // the client's; "" = success
	}{
		{"member", owner, nil, "", RoleMember, ""},
		{"master", owner, masterOld, "n1", RoleMaster, ""},
		{"forged: a key the owner does not accept", owner, stranger, "n1", RoleMember, "refused this master's proof"},
		{"relayed: the proof names another node", owner, masterOld, "n2", RoleMember, `it is not node "n2"`},
		{"rotation: old key while owners accept both", rotating, masterOld, "n1", RoleMaster, ""},
		{"rotation: new key while owners accept both", rotating, masterNew, "n1", RoleMaster, ""},
		{"rotation: new key before owners accept it", owner, masterNew, "n1", RoleMember, "refused this master's proof"},
		{"a server that checks no roles records a member", nil, masterOld, "n1", RoleMember, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			role, serr, cerr := roleHandshake(t, s, tc.check, tc.key, tc.identity)
			if tc.wantError == "" {
				if serr != nil || cerr != nil {
					t.Fatalf("server %v, client %v", serr, cerr)
				}
			} else {
				if cerr == nil || !strings.Contains(cerr.Error(), tc.wantError) {
					t.Fatalf("client got %v, want %q", cerr, tc.wantError)
				}
				if serr == nil || !strings.Contains(serr.Error(), "master proof refused") {
					t.Fatalf("server got %v, want a refused master proof", serr)
				}
			}
			if role != tc.wantRole {
				t.Fatalf("role %v, want %v", role, tc.wantRole)
			}
		})
	}
}

// A member cannot turn its handshake into a master's: flipping the role byte breaks
// the MAC (it covers the role), a signature of zeros or of another message fails, and
// a recorded master answer does not verify on a fresh server nonce.
func TestMasterRoleForgery(t *testing.T) {
	s := testSecrets(t, "cluster")
	k := testMasterKey(t)
	check := NewMasterCheck(testPubKeys(t, k), "n1")

	// Hello from a real server, then a crafted answer.
	craft := func(build func(serverNonce []byte) []byte) (Role, error, byte) {
		a, b := net.Pipe()
		defer b.Close()
		a.SetDeadline(time.Now().Add(5 * time.Second))
		b.SetDeadline(time.Now().Add(5 * time.Second))
		type result struct {
			role Role
			err  error
		}
		done := make(chan result, 1)
		go func() {
			role, err := serverRoleHandshake(a, s, PurposePeer, "test-owner", check)
			a.Close()
			done <- result{role, err}
		}()
		var hello [helloLen]byte
		if _, err := b.Read(hello[:]); err != nil {
			t.Fatal(err)
		}
		go b.Write(build(hello[headerLen+purposeLen:])) // a pipe has no buffer: the server may refuse before reading it all
		var v [verdictLen]byte
		b.Read(v[:])
		r := <-done
		return r.role, r.err, v[0]
	}
	answer := func(serverNonce []byte, macRole, wireRole Role, sig []byte) []byte {
		p := purposeField(PurposePeer)
		clientNonce := make([]byte, nonceLen)
		rand.Read(clientNonce)
		out := append([]byte(magic), version, byte(wireRole))
		out = append(out, clientNonce...)
		out = append(out, mac(s.keys[0], clientLabel, p, macRole, serverNonce, clientNonce)...)
		if sig == nil {
			sig = k.sign(masterMessage(p, "n1", "test-owner", serverNonce, clientNonce))
		}
		return append(out, sig...)
	}
	for _, tc := range []struct {
		name    string
		build   func(serverNonce []byte) []byte
		verdict byte
	}{
		{"role flipped after a member's MAC", func(n []byte) []byte { return answer(n, RoleMember, RoleMaster, nil) }, verdictWrongSecret},
		{"zero signature", func(n []byte) []byte { return answer(n, RoleMaster, RoleMaster, make([]byte, sigLen)) }, verdictRole},
		{"signature over another nonce", func(n []byte) []byte {
			other := bytes.Clone(n)
			other[0] ^= 1
			p := purposeField(PurposePeer)
			return answer(n, RoleMaster, RoleMaster, k.sign(masterMessage(p, "n1", "test-owner", other, make([]byte, nonceLen))))
		}, verdictRole},
		{"unknown role", func(n []byte) []byte { return answer(n, 2, 2, nil) }, verdictRole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			role, err, v := craft(tc.build)
			if err == nil || role != RoleMember || v != tc.verdict {
				t.Fatalf("role %v, err %v, verdict %d; want refused with verdict %d", role, err, v, tc.verdict)
			}
		})
	}

	t.Run("replayed master answer", func(t *testing.T) {
		var recorded []byte
		role, err, _ := craft(func(n []byte) []byte {
			recorded = answer(n, RoleMaster, RoleMaster, nil)
			return recorded
		})
		if err != nil || role != RoleMaster {
			t.Fatalf("the genuine answer: role %v, %v", role, err)
		}
		role, err, v := craft(func([]byte) []byte { return recorded })
		if err == nil || role != RoleMember || v != verdictWrongSecret {
			t.Fatalf("replay: role %v, err %v, verdict %d", role, err, v)
		}
	})
}

func TestMasterKeyFiles(t *testing.T) {
	dir := t.TempDir()
	key, pub := filepath.Join(dir, "master.key"), filepath.Join(dir, "master.pub")
	if err := GenerateMasterKeyFiles(key, pub); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{key: 0o600, pub: 0o644} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want mode %04o", p, fi, err, want)
		}
	}
	k, err := LoadMasterKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := LoadMasterPubKeys([]string{pub})
	if err != nil {
		t.Fatal(err)
	}
	if msg := []byte("m"); !pubs.verify(msg, k.sign(msg)) {
		t.Fatal("the public key does not verify the private key's signature")
	}
	// Both present: nothing to do. Only the key: its public half is written again.
	if err := GenerateMasterKeyFiles(key, pub); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second generate: %v, want ErrExist", err)
	}
	os.Remove(pub)
	if err := GenerateMasterKeyFiles(key, pub); err != nil {
		t.Fatal(err)
	}
	if again, err := LoadMasterPubKeys([]string{pub}); err != nil || !again.keys[0].Equal(k.Public()) {
		t.Fatalf("rewritten public key: %v", err)
	}
	// Only the public key: refused, a new key would not match it.
	os.Remove(key)
	if err := GenerateMasterKeyFiles(key, pub); err == nil || !strings.Contains(err.Error(), "exists without its private key") {
		t.Fatalf("public key alone: %v", err)
	}

	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		load          func(string) error
		want          string
	}{
		{"readable private key", "", 0o644, func(p string) error { _, err := LoadMasterKey(p); return err }, "is readable by others (mode 0644)"},
		{"public key as private", "pub", 0o600, func(p string) error { _, err := LoadMasterKey(p); return err }, `want one PEM "PRIVATE KEY" block`},
		{"private key as public", "key", 0o600, func(p string) error { _, err := LoadMasterPubKeys([]string{p}); return err }, `want one PEM "PUBLIC KEY" block`},
		{"missing", "missing", 0, func(p string) error { _, err := LoadMasterKey(p); return err }, "does not exist; make a pair with: fluxkv gen-master-key"},
		{"garbage", "garbage", 0o600, func(p string) error { _, err := LoadMasterKey(p); return err }, `want one PEM "PRIVATE KEY" block`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			k2, p2 := filepath.Join(d, "k"), filepath.Join(d, "p")
			if err := GenerateMasterKeyFiles(k2, p2); err != nil {
				t.Fatal(err)
			}
			path := k2
			switch tc.content {
			case "pub":
				path = p2
			case "key":
				path = k2
			case "missing":
				path = filepath.Join(d, "nope")
			case "garbage":
				path = filepath.Join(d, "g")
				os.WriteFile(path, []byte("not a key\n"), 0o600)
			}
			if tc.mode != 0 {
				os.Chmod(path, tc.mode)
			}
			if err := tc.load(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestMasterProofBoundToAddress: a master's proof names the address it dialled; a
// server reached at another address (a relay by the owner the master dialled) refuses
// it, unless that is the address it advertises (address translation).
func TestMasterProofBoundToAddress(t *testing.T) {
	s := testSecrets(t, "cluster")
	k := testMasterKey(t)
	check := NewMasterCheck(testPubKeys(t, k), "n1")
	role, serr, cerr := roleHandshakeAt(t, s, check, k, "n1", "10.0.0.2:7701")
	if role != RoleMember || serr == nil || cerr == nil {
		t.Fatalf("proof for another address: role %v, server %v, client %v; want refused", role, serr, cerr)
	}
	check.Advertise("test-owner")
	role, serr, cerr = roleHandshakeAt(t, s, check, k, "n1", "10.0.0.2:7701")
	if role != RoleMaster || serr != nil || cerr != nil {
		t.Fatalf("proof for the advertised address: role %v, server %v, client %v", role, serr, cerr)
	}
}
