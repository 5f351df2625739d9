package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// POSIX access ACL as the kernel reads it from the system.posix_acl_access extended
// attribute (include/uapi/linux/posix_acl_xattr.h): a little-endian version, then
// entries of tag, permission and id, ordered by tag and, for named users, by uid.
const (
	aclXattr      = "system.posix_acl_access"
	aclVersion    = 2
	aclUserObj    = 0x01
	aclUser       = 0x02
	aclGroupObj   = 0x04
	aclMask       = 0x10
	aclOther      = 0x20
	aclUndefined  = ^uint32(0)
	aclReadWrite  = 6
	aclEntryBytes = 8
)

// GrantUsers lets each of uids read and write the file at path (a socket: connecting
// needs write permission) through a POSIX access ACL, beside what its mode gives the
// file's owner, group and others, which the ACL keeps (its mask is the group's
// permission plus read and write). A daemon's sockets are 0660: the users it admits by
// uid (--allow-uid) are in no group of them, and without the ACL their connect fails
// with EACCES before the daemon sees them. No uids: nothing changes.
func GrantUsers(path string, uids []uint32) error {
	if len(uids) == 0 {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("grant uids access to %s: %w", path, err)
	}
	perm := uint16(fi.Mode().Perm())
	users := slices.Clone(uids)
	slices.Sort(users)
	users = slices.Compact(users)
	acl := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+(4+len(users))*aclEntryBytes), aclVersion)
	entry := func(tag, perm uint16, id uint32) {
		acl = binary.LittleEndian.AppendUint16(acl, tag)
		acl = binary.LittleEndian.AppendUint16(acl, perm)
		acl = binary.LittleEndian.AppendUint32(acl, id)
	}
	entry(aclUserObj, perm>>6&7, aclUndefined)
	for _, u := range users {
		entry(aclUser, aclReadWrite, u)
	}
	entry(aclGroupObj, perm>>3&7, aclUndefined)
	entry(aclMask, perm>>3&7|aclReadWrite, aclUndefined)
	entry(aclOther, perm&7, aclUndefined)
	if err := unix.Setxattr(path, aclXattr, acl, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("grant uids %v access to %s: its file system does not support POSIX ACLs: add those users to the socket's group instead", users, path)
		}
		return fmt.Errorf("grant uids %v access to %s (POSIX ACL): %w", users, path, err)
	}
	return nil
}
