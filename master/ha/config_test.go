package ha

import (
	"slices"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		in, cluster string
		eps         []string
		prefix, err string
	}{
		{in: "etcd://h1:2379,h2:2379", cluster: "prod", eps: []string{"h1:2379", "h2:2379"}, prefix: "/fluxkv/prod/"},
		{in: "etcd://h1:2379/custom/p/", cluster: "prod", eps: []string{"h1:2379"}, prefix: "/custom/p/"},
		{in: "etcd://h1:2379/nodelim", err: "must start and end with /"},
		{in: "etcd://", err: "no etcd endpoints"},
		{in: "etcd://h1", err: "want host:port"},
		{in: "h1:7700", err: "want etcd://"},
	} {
		got, err := ParseURL(c.in, c.cluster)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseURL(%q) = %+v, %v; want error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got.Endpoints, c.eps) || got.Prefix != c.prefix {
			t.Errorf("ParseURL(%q) = %+v, %v; want %v %s", c.in, got, err, c.eps, c.prefix)
		}
	}
}

func TestConfigTLSNeedsBoth(t *testing.T) {
	c := Config{Endpoints: []string{"h:1"}, Prefix: "/p/", TLS: TLS{Cert: "c.pem"}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("cert without key: %v", err)
	}
}

// FuzzParseURL: any input parses into a valid config or fails; a parsed config keeps
// every endpoint and a prefix that starts and ends with "/".
func FuzzParseURL(f *testing.F) {
	f.Add("etcd://h1:2379,h2:2379/fluxkv/x/")
	f.Add("etcd://h1:2379")
	f.Add("etcd://,,/")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseURL(s, "c")
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseURL(%q) = %+v, which does not validate: %v", s, c, err)
		}
		if len(c.Endpoints) == 0 || !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
			t.Fatalf("ParseURL(%q) = %+v", s, c)
		}
	})
}
