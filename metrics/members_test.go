package metrics

import (
	"sync/atomic"
	"testing"
)

// The membership gauges appear only once a role installs them, read its function at
// each scrape, and go when it is removed.
func TestMembershipGauges(t *testing.T) {
	m := New()
	srv := serve(t, m)
	got := scrape(t, srv)
	for _, name := range []string{"fluxkv_master_members", "fluxkv_owner_registered"} {
		if got[name] != nil {
			t.Errorf("%s present before its role installed it", name)
		}
	}
	var members atomic.Int64
	var registered atomic.Bool
	m.SetMembersFunc(func() int { return int(members.Load()) })
	m.SetRegisteredFunc(registered.Load)
	members.Store(3)
	got = scrape(t, srv)
	if v := got["fluxkv_master_members"].samples[""]; v != 3 {
		t.Errorf("fluxkv_master_members = %v, want 3", v)
	}
	if v := got["fluxkv_owner_registered"].samples[""]; v != 0 {
		t.Errorf("fluxkv_owner_registered = %v, want 0", v)
	}
	registered.Store(true)
	members.Store(2)
	got = scrape(t, srv)
	if v := got["fluxkv_master_members"].samples[""]; v != 2 {
		t.Errorf("fluxkv_master_members = %v, want 2", v)
	}
	if v := got["fluxkv_owner_registered"].samples[""]; v != 1 {
		t.Errorf("fluxkv_owner_registered = %v, want 1", v)
	}
	m.SetMembersFunc(nil)
	m.SetRegisteredFunc(nil)
	got = scrape(t, srv)
	for _, name := range []string{"fluxkv_master_members", "fluxkv_owner_registered"} {
		if got[name] != nil {
			t.Errorf("%s present after its function was removed", name)
		}
	}
	// Installing again after a removal does not register twice.
	m.SetMembersFunc(func() int { return 1 })
	if v := scrape(t, srv)["fluxkv_master_members"].samples[""]; v != 1 {
		t.Errorf("fluxkv_master_members = %v after reinstalling, want 1", v)
	}

	var none *Metrics
	none.SetMembersFunc(func() int { return 1 })
	none.SetRegisteredFunc(func() bool { return true })
}
