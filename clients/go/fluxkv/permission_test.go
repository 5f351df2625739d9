package fluxkv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// permGID is the group the test gives the node's sockets; it needs no entry in /etc/group.
const permGID = 4242

// permChildEnv names the socket TestPermissionChild attaches to.
const permChildEnv = "FLUXKV_PERM_CHILD_SOCKET"

// TestPermissions attaches from processes of another uid (setpriv): a member of the
// socket's group, by supplementary or by primary group, attaches and round-trips a
// value; a non-member gets ErrPermissionDenied, from connect(2) (EACCES) while the
// socket is 0660 and from the owner's PERMISSION_DENIED once the socket lets anyone in.
func TestPermissions(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: clients of other uids are run with setpriv")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed (util-linux)")
	}
	n := startNode(t, "16MiB")
	for _, d := range []string{filepath.Dir(n.dir), n.dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	socks := []string{n.socket(), wire.RPCSocketPath(n.socket())}
	for _, s := range socks {
		if err := os.Chown(s, -1, permGID); err != nil {
			t.Fatal(err)
		}
	}
	exe := proctest.SelfCopy(t)
	for _, tc := range []struct {
		name string
		args []string
		mode os.FileMode
		want string // "" = attached; else a substring of the refusal
	}{
		{"supplementary group", []string{"--regid=65534", fmt.Sprintf("--groups=%d", permGID)}, 0o660, ""},
		{"primary group", []string{fmt.Sprintf("--regid=%d", permGID), "--clear-groups"}, 0o660, ""},
		{"no group, socket refuses", []string{"--regid=65534", "--clear-groups"}, 0o660, "cannot connect"},
		{"no group, owner refuses", []string{"--regid=65534", "--clear-groups"}, 0o666, "may not attach"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, s := range socks {
				if err := os.Chmod(s, tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			args := append([]string{"--reuid=65534"}, tc.args...)
			args = append(args, exe, "-test.run=^TestPermissionChild$", "-test.v")
			cmd := exec.Command("setpriv", args...)
			cmd.Env = append(os.Environ(), permChildEnv+"="+n.socket(), "FLUXKV_BIN=/bin/true", "TMPDIR=/tmp")
			out, _ := cmd.CombinedOutput()
			got := string(out)
			t.Logf("child: %s", strings.TrimSpace(got))
			switch {
			case tc.want == "" && !strings.Contains(got, "CHILD attached"):
				t.Fatalf("child did not attach:\n%s", got)
			case tc.want != "" && !strings.Contains(got, "CHILD denied"):
				t.Fatalf("child was not refused with ErrPermissionDenied:\n%s", got)
			case tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "usermod -aG")):
				t.Fatalf("refusal does not say %q and how to grant access:\n%s", tc.want, got)
			}
		})
	}
}

// TestPermissionChild is TestPermissions' client in another uid: it attaches to the
// socket named by permChildEnv and prints what happened.
func TestPermissionChild(t *testing.T) {
	sock := os.Getenv(permChildEnv)
	if sock == "" {
		t.Skip("the client TestPermissions runs as another uid")
	}
	c, err := Connect(Options{Socket: sock, Name: "perm-child"})
	if errors.Is(err, ErrPermissionDenied) {
		fmt.Printf("CHILD denied uid=%d: %v\n", os.Getuid(), err)
		return
	}
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	defer c.Close()
	val := bytes.Repeat([]byte("p"), 10000)
	if err := c.Put(fmt.Sprintf("perm-%d-%d", os.Getuid(), os.Getgid()), val); err != nil {
		t.Fatalf("put: %v", err)
	}
	fmt.Printf("CHILD attached uid=%d gid=%d\n", os.Getuid(), os.Getgid())
}
