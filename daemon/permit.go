package daemon

import (
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"syscall"

	"github.com/fluxkv/fluxkv/shm"
)

// permitAttach admits root, the owner's own uid, the listed uids, and any caller whose
// primary or supplementary groups (SO_PEERGROUPS) include the attach socket's group.
// The refusal says who may attach and how to grant it.
func (o *Owner) permitAttach(c shm.Cred) error {
	if c.Uid == 0 || c.Uid == uint32(os.Getuid()) || slices.Contains(o.opts.AllowedUIDs, c.Uid) {
		return nil
	}
	path := o.opts.SocketPath()
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("permission denied: cannot check the group of %s: %v", path, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("permission denied: cannot check the group of %s", path)
	}
	if c.InGroup(st.Gid) {
		return nil
	}
	group := groupName(st.Gid)
	return fmt.Errorf("permission denied: uid %d (groups %s) may not attach to %s: it admits %s and members of group %s; "+
		"add the user with `usermod -aG %s USER` (it takes effect at the user's next login)",
		c.Uid, groupList(c), path, o.admittedUIDs(), group, group)
}

// admittedUIDs names the uids admitted whatever their groups.
func (o *Owner) admittedUIDs() string {
	s := "root"
	if uid := os.Getuid(); uid != 0 {
		s = fmt.Sprintf("uid %d (the owner's), root", uid)
	}
	for _, u := range o.opts.AllowedUIDs {
		s += fmt.Sprintf(", uid %d", u)
	}
	return s
}

// groupName is gid's name, or the number when it has none.
func groupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(id); err == nil {
		return g.Name
	}
	return id
}

// groupList renders a caller's primary and supplementary groups for a refusal.
func groupList(c shm.Cred) string {
	gs := []uint32{c.Gid}
	for _, g := range c.Groups {
		if g != c.Gid {
			gs = append(gs, g)
		}
	}
	return fmt.Sprint(gs)
}
