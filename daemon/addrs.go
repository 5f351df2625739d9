package daemon

import (
	"fmt"
	"net"
	"strconv"
)

// Addresses an owner registers (docs/architecture.md §10): the peer service's and the data plane's,
// as other hosts reach them. A wildcard listener ("0.0.0.0", "[::]", "") is never
// registered as such: the advertised host is --advertise-host, else the listener's own
// address when it names one, else this host's address on the route to the master.

// advertise returns the address to register for a listener bound to bound.
func advertise(bound net.Addr, advertiseHost, masterAddr string) (string, error) {
	tcp, ok := bound.(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("advertise %v: not a TCP address", bound)
	}
	port := strconv.Itoa(tcp.Port)
	switch {
	case advertiseHost != "":
		return net.JoinHostPort(advertiseHost, port), nil
	case tcp.IP != nil && !tcp.IP.IsUnspecified():
		return net.JoinHostPort(tcp.IP.String(), port), nil
	}
	ip, err := routeIP(masterAddr)
	if err != nil {
		return "", fmt.Errorf("listener %v is a wildcard and the address towards the master %s is unknown (%v): set --advertise-host", bound, masterAddr, err)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// routeIP is this host's source address on the route to addr: a UDP "connect" picks
// it without sending anything.
func routeIP(addr string) (net.IP, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}

// isLoopbackHost reports whether host (a literal address or "localhost") is loopback.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckListenReachable is checkReachable before the listener is bound: flag (named
// as the refusal should name it) listens on listen, and the owner registers with the
// master at masterAddr. fluxkv refuses such settings at start.
func CheckListenReachable(flag, listen, masterAddr string) error {
	return checkReachable(flag, listen, "", masterAddr)
}

// checkReachable refuses a listener other hosts could not reach: an owner whose master
// is not on loopback is part of a cluster, so its peer and data listeners must not be
// bound to loopback, nor advertised as it.
func checkReachable(flag, listen, advertised, masterAddr string) error {
	mhost, _, err := net.SplitHostPort(masterAddr)
	if err != nil || isLoopbackHost(mhost) {
		return nil
	}
	lhost, _, err := net.SplitHostPort(listen)
	if err == nil && isLoopbackHost(lhost) {
		return fmt.Errorf("%s %s is a loopback address but the master %s is not on loopback: other owners could not reach it; listen on a reachable address (or 0.0.0.0 with --advertise-host)", flag, listen, masterAddr)
	}
	if ahost, _, err := net.SplitHostPort(advertised); err == nil && isLoopbackHost(ahost) {
		return fmt.Errorf("%s would be advertised as %s (loopback) but the master %s is not on loopback: set --advertise-host", flag, advertised, masterAddr)
	}
	return nil
}
