package metrics

import "testing"

// Every labelled counter exists at 0 from the start, so increase() and rate() see the
// first event; the traffic counters count per key and bytes.
func TestPreinitialisedAndTraffic(t *testing.T) {
	m := New()
	srv := serve(t, m)
	got := scrape(t, srv)
	want := map[string][]string{
		"fluxkv_get_hits_total": {
			"locality=local,source=memory", "locality=remote,source=memory",
			"locality=local,source=ssd", "locality=remote,source=ssd",
		},
		"fluxkv_get_misses_total":    {""},
		"fluxkv_client_bytes_total":  {"dir=in", "dir=out"},
		"fluxkv_conn_refused_total":  {"reason=cap,socket=attach", "reason=cap,socket=rpc", "reason=cap,socket=data", "reason=auth,socket=master"},
		"fluxkv_conn_timeouts_total": {"kind=hello,socket=attach", "kind=auth,socket=peer"},
		"fluxkv_ssd_corrupt_total":   {""},
	}
	for name, keys := range want {
		f := got[name]
		if f == nil {
			t.Errorf("%s missing before any event", name)
			continue
		}
		for _, k := range keys {
			if v, ok := f.samples[k]; !ok || v != 0 {
				t.Errorf("%s{%s} = %v (present %v), want 0", name, k, v, ok)
			}
		}
	}
	if n, w := len(got["fluxkv_conn_refused_total"].samples), len(sockets)*len(refuseReasons); n != w {
		t.Errorf("%d fluxkv_conn_refused_total series, want %d (every socket × reason)", n, w)
	}

	m.GetHit(false, false, 100)
	m.GetHit(false, false, 50)
	m.GetHit(true, true, 1000)
	m.GetHit(false, true, 0)
	m.GetMiss()
	m.PutBytes(4096)
	m.PutBytes(-1) // ignored
	got = scrape(t, srv)
	for k, w := range map[string]float64{
		"locality=local,source=memory":  2,
		"locality=remote,source=memory": 1,
		"locality=local,source=ssd":     0,
		"locality=remote,source=ssd":    1,
	} {
		if v := got["fluxkv_get_hits_total"].samples[k]; v != w {
			t.Errorf("fluxkv_get_hits_total{%s} = %v, want %v", k, v, w)
		}
	}
	if v := got["fluxkv_get_misses_total"].samples[""]; v != 1 {
		t.Errorf("fluxkv_get_misses_total = %v, want 1", v)
	}
	if v := got["fluxkv_client_bytes_total"].samples["dir=out"]; v != 1150 {
		t.Errorf("fluxkv_client_bytes_total{out} = %v, want 1150", v)
	}
	if v := got["fluxkv_client_bytes_total"].samples["dir=in"]; v != 4096 {
		t.Errorf("fluxkv_client_bytes_total{in} = %v, want 4096", v)
	}

	var none *Metrics
	none.GetHit(true, false, 1)
	none.GetMiss()
	none.PutBytes(1)
}

// The leadership and transfer counters, registered on first use, carry every label
// value from then on.
func TestLazyCountersPreinitialised(t *testing.T) {
	m := New()
	srv := serve(t, m)
	m.Leading(false)
	m.Transfer()
	got := scrape(t, srv)
	for _, k := range []string{"change=won", "change=lost"} {
		if v, ok := got["fluxkv_master_leadership_changes_total"].samples[k]; !ok || v != 0 {
			t.Errorf("fluxkv_master_leadership_changes_total{%s} = %v (present %v), want 0", k, v, ok)
		}
	}
	if f := got["fluxkv_transfer_errors_total"]; f == nil || len(f.samples) != 2*len(transferErrKinds) {
		t.Errorf("fluxkv_transfer_errors_total: %+v, want every dir × kind at 0", f)
	}
}
