package auth

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/cloudwego/kitex/pkg/remote"
)

// Role is what a connection proved in its handshake: every authenticated connection
// is a member (it holds the cluster secret); a master's connection to an owner's peer
// port also proved it holds a master key (masterkey.go).
type Role byte

const (
	RoleMember Role = 0
	RoleMaster Role = 1
)

func (r Role) String() string {
	switch r {
	case RoleMember:
		return "member"
	case RoleMaster:
		return "master"
	}
	return fmt.Sprintf("role(%d)", byte(r))
}

// masterLabel starts the message a master signs (handshake.go).
const masterLabel = "fluxkv-auth v2 master\x00"

// maxIdentity bounds a server identity (a node id) in the signed message.
const maxIdentity = 1<<16 - 1

// masterMessage is what a master signs for one handshake: the purpose, the identity
// of the server it means to reach (an owner's node id), the address it dialled (IP and
// port) and both nonces. Identity and address bind the proof to that server: an owner
// the master connects to cannot relay the handshake to another owner and keep a
// master's connection to it, not even after registering under that owner's node id
// (the master then dials the relaying owner's address, which the other does not have).
func masterMessage(purpose []byte, identity, target string, serverNonce, clientNonce []byte) []byte {
	m := make([]byte, 0, len(masterLabel)+len(purpose)+4+len(identity)+len(target)+len(serverNonce)+len(clientNonce))
	m = append(m, masterLabel...)
	m = append(m, purpose...)
	m = binary.BigEndian.AppendUint16(m, uint16(len(identity)))
	m = append(m, identity...)
	m = binary.BigEndian.AppendUint16(m, uint16(len(target)))
	m = append(m, target...)
	m = append(m, serverNonce...)
	return append(m, clientNonce...)
}

// MasterCheck is how a server verifies a master's claim: the master public keys it
// accepts, its own identity (the owner's node id) the master must have named, and the
// addresses it may have been dialled at: the connection's local address, or the one
// it advertises (Advertise; behind address translation the two differ).
type MasterCheck struct {
	keys       *MasterPubKeys
	identity   string
	advertised atomic.Pointer[string]
}

// Advertise adds addr (the peer address the owner registers) to the addresses a
// master may name; call it before registering.
func (m *MasterCheck) Advertise(addr string) {
	if m != nil {
		m.advertised.Store(&addr)
	}
}

// NewMasterCheck verifies master claims against keys for the server named identity.
// A nil keys returns nil: such a server reads a claim and records a member.
func NewMasterCheck(keys *MasterPubKeys, identity string) *MasterCheck {
	if keys == nil {
		return nil
	}
	if len(identity) > maxIdentity {
		panic(fmt.Sprintf("BUG: auth identity of %d bytes", len(identity)))
	}
	return &MasterCheck{keys: keys, identity: identity}
}

// verify checks sig for a connection whose local address is local.
func (m *MasterCheck) verify(purpose []byte, local string, serverNonce, clientNonce, sig []byte) bool {
	if local != "" && m.keys.verify(masterMessage(purpose, m.identity, local, serverNonce, clientNonce), sig) {
		return true
	}
	a := m.advertised.Load()
	return a != nil && *a != local && m.keys.verify(masterMessage(purpose, m.identity, *a, serverNonce, clientNonce), sig)
}

// masterProof is a master client's side: its key and the identity of the server at
// each address it dials.
type masterProof struct {
	key      *MasterKey
	identity func(addr string) string
}

func (p *masterProof) sign(purpose []byte, addr string, serverNonce, clientNonce []byte) ([]byte, string) {
	id := p.identity(addr)
	if len(id) > maxIdentity {
		id = "" // no node has such an id: the server refuses the proof
	}
	return p.key.sign(masterMessage(purpose, id, addr, serverNonce, clientNonce)), id
}

// NewMasterDialer is NewDialer for a master: its connections also prove they come from
// a master, signing with key for the server identity(address) names (an owner's node
// id). A nil key or nil s makes a plain NewDialer.
func NewMasterDialer(s *Secrets, purpose string, key *MasterKey, identity func(address string) string) *Dialer {
	d := NewDialer(s, purpose)
	if key != nil && s != nil {
		d.master = &masterProof{key: key, identity: identity}
	}
	return d
}

// The connections that proved a master, by their TCP endpoints (unique among live
// connections of this host): the handlers of a Kitex server find theirs through the
// context (ConnRole). Only master connections are recorded; any other is a member.
var masterConns struct {
	mu sync.Mutex // protects m
	m  map[connID]*serverConn
}

type connID struct{ local, remote string }

func idOf(c net.Conn) connID {
	id := connID{}
	if a := c.LocalAddr(); a != nil {
		id.local = a.String()
	}
	if a := c.RemoteAddr(); a != nil {
		id.remote = a.String()
	}
	return id
}

// markMaster records c as a master's connection (its handshake proved it).
func markMaster(c *serverConn) {
	masterConns.mu.Lock()
	defer masterConns.mu.Unlock()
	if masterConns.m == nil {
		masterConns.m = make(map[connID]*serverConn)
	}
	masterConns.m[idOf(c)] = c
}

// unmarkMaster forgets c when it closes.
func unmarkMaster(c *serverConn) {
	masterConns.mu.Lock()
	defer masterConns.mu.Unlock()
	id := idOf(c)
	if masterConns.m[id] == c {
		delete(masterConns.m, id)
	}
}

type connIDKey struct{}

// roleHandler is a Kitex inbound handler that puts the connection's TCP endpoints
// into its context when the connection becomes active, for ConnRole. They come from
// the socket: Kitex's rpcinfo remote address is no substitute, a TTHeader caller may
// set it to anything.
type roleHandler struct{}

var _ remote.InboundHandler = roleHandler{}

func (roleHandler) OnActive(ctx context.Context, conn net.Conn) (context.Context, error) {
	return context.WithValue(ctx, connIDKey{}, idOf(conn)), nil
}
func (roleHandler) OnInactive(ctx context.Context, conn net.Conn) context.Context { return ctx }
func (roleHandler) OnRead(ctx context.Context, conn net.Conn) (context.Context, error) {
	return ctx, nil
}
func (roleHandler) OnMessage(ctx context.Context, args, result remote.Message) (context.Context, error) {
	return ctx, nil
}

// ConnRole is the role the calling connection proved, in a handler of a Kitex server
// started with ServerOptions: RoleMaster only for a master's proof checked by the
// listener's MasterCheck; RoleMember otherwise (no handshake ran for an insecure
// server: the caller decides what that means).
func ConnRole(ctx context.Context) Role {
	id, ok := ctx.Value(connIDKey{}).(connID)
	if !ok {
		return RoleMember
	}
	masterConns.mu.Lock()
	defer masterConns.mu.Unlock()
	if _, ok := masterConns.m[id]; ok {
		return RoleMaster
	}
	return RoleMember
}
