package master

import (
	"os"
	"testing"

	"github.com/cloudwego/kitex/pkg/klog"
)

// TestMain keeps Kitex's logging to warnings, as the programs do: the package sets
// no log level itself.
func TestMain(m *testing.M) {
	klog.SetLevel(klog.LevelWarn)
	os.Exit(m.Run())
}
