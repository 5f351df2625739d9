package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
)

// The Grafana dashboard and the Prometheus rules, checked against the code: both files
// parse with the structure Grafana and Prometheus need, and every metric their
// expressions name is served by a real `fluxkv up` node, so renaming a metric in the
// code fails here rather than in someone's empty panel.

const (
	metricsDashboard = "grafana/fluxkv.json"
	metricsRules     = "prometheus/fluxkv-rules.yaml"
	// metricsReadyBudget bounds how long a started node may take to answer /readyz 200
	// (a deadline on two busy cores, not an expected speed).
	metricsReadyBudget = 30 * time.Second
)

// metricNameRE finds the fluxkv metric names in a PromQL expression: fluxkv_*, and the
// capacity gauges whose names docs/architecture.md §7 fixes (kvcache_segment_*, kv_ssd_*).
var metricNameRE = regexp.MustCompile(`\b(?:fluxkv|kvcache|kv_ssd)_[A-Za-z0-9_]+`)

// metricExprNames is the sorted set of metric names in exprs.
func metricExprNames(exprs []string) []string {
	var names []string
	for _, e := range exprs {
		names = append(names, metricNameRE.FindAllString(e, -1)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// grafanaDashboard is what the test reads of the dashboard JSON.
type grafanaDashboard struct {
	Title         string         `json:"title"`
	UID           string         `json:"uid"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Inputs []grafanaInput `json:"__inputs"`
}

// grafanaInput is what the import dialog asks for (a data source).
type grafanaInput struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	PluginID string `json:"pluginId"`
}

type grafanaPanel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource *grafanaDatasource `json:"datasource"`
	Targets    []struct {
		Expr       string             `json:"expr"`
		RefID      string             `json:"refId"`
		Datasource *grafanaDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// dashboardPanels is every panel, those inside collapsed rows too, rows left out.
func (d *grafanaDashboard) dashboardPanels() []grafanaPanel {
	var out []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// readDashboard parses the dashboard and fails t unless every panel queries Prometheus
// through the ${DS_PROMETHEUS} data source; it returns the dashboard's expressions.
func readDashboard(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(metricsDashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", metricsDashboard, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("%s: title %q, uid %q: both are needed to import it", metricsDashboard, d.Title, d.UID)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("%s: schemaVersion %d, want ≥ 36 (Grafana 9+ data source references)", metricsDashboard, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"DS_PROMETHEUS": "datasource", "job": "query", "instance": "query"} {
		if vars[name] != typ {
			t.Errorf("%s: template variable %s is %q, want a %s variable", metricsDashboard, name, vars[name], typ)
		}
	}
	if !slices.Contains(d.Inputs, grafanaInput{Name: "DS_PROMETHEUS", Type: "datasource", PluginID: "prometheus"}) {
		t.Errorf("%s: no __inputs entry DS_PROMETHEUS (a Prometheus data source chosen at import)", metricsDashboard)
	}
	isProm := func(ds *grafanaDatasource) bool {
		return ds != nil && ds.Type == "prometheus" && ds.UID == "${DS_PROMETHEUS}"
	}
	var exprs []string
	ids := map[int]string{}
	panels := d.dashboardPanels()
	if len(panels) == 0 {
		t.Fatalf("%s: no panels", metricsDashboard)
	}
	for _, p := range panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: panels %q and %q share id %d", metricsDashboard, prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("%s: panel %d has no title", metricsDashboard, p.ID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no targets", metricsDashboard, p.Title)
		}
		if !isProm(p.Datasource) {
			t.Errorf("%s: panel %q: data source %+v, want prometheus ${DS_PROMETHEUS}", metricsDashboard, p.Title, p.Datasource)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: panel %q: a target without expr", metricsDashboard, p.Title)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: panel %q: refId %q missing or repeated", metricsDashboard, p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && !isProm(tg.Datasource) {
				t.Errorf("%s: panel %q: target data source %+v, want prometheus ${DS_PROMETHEUS}", metricsDashboard, p.Title, tg.Datasource)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if s, ok := q["query"].(string); ok {
				exprs = append(exprs, s)
			}
		}
	}
	return exprs
}

// promRules is a Prometheus rule file (groups: format), unknown fields refused.
type promRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         *string           `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// readRules parses the rule file and fails t unless every rule is an alert with an
// expr, a for, a severity and a summary and description; it returns the expressions.
func readRules(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(metricsRules)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f promRules
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", metricsRules, err)
	}
	if len(f.Groups) == 0 {
		t.Fatalf("%s: no groups", metricsRules)
	}
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range f.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("%s: group %q: a name and rules are needed", metricsRules, g.Name)
		}
		for i, r := range g.Rules {
			what := fmt.Sprintf("%s: group %q rule %d (%s)", metricsRules, g.Name, i, r.Alert)
			if r.Alert == "" || r.Record != "" {
				t.Errorf("%s: want an alerting rule (alert:, no record:)", what)
			}
			if alerts[r.Alert] {
				t.Errorf("%s: alert name repeated", what)
			}
			alerts[r.Alert] = true
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: no expr", what)
			}
			if r.For == nil {
				t.Errorf("%s: no for", what)
			} else if _, err := model.ParseDuration(*r.For); err != nil {
				t.Errorf("%s: for %q: %v", what, *r.For, err)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: labels.severity %q, want critical, warning or info", what, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no annotations.%s", what, a)
				}
			}
			exprs = append(exprs, r.Expr)
		}
	}
	return exprs
}

func TestMetricsDashboardFile(t *testing.T) {
	exprs := readDashboard(t)
	names := metricExprNames(exprs)
	if len(names) < 10 {
		t.Errorf("the dashboard names %d fluxkv metrics (%v): the extraction is broken or panels are missing", len(names), names)
	}
	// The panels' PromQL, with Grafana's variables filled in, as recording rules for
	// promtool to parse.
	vars := strings.NewReplacer("$__rate_interval", "1m", "$job", ".*", "$instance", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		if strings.HasPrefix(e, "label_values(") {
			continue // a variable's query, not PromQL
		}
		q, _ := json.Marshal(vars.Replace(e)) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: dashboard:expr_%d\n        expr: %s\n", i, q)
	}
	promtoolCheckRules(t, "dashboard expressions", b.String())
}

func TestMetricsRulesFile(t *testing.T) {
	names := metricExprNames(readRules(t))
	if len(names) < 4 {
		t.Errorf("the rules name %d fluxkv metrics (%v): the extraction is broken or rules are missing", len(names), names)
	}
	data, err := os.ReadFile(metricsRules)
	if err != nil {
		t.Fatal(err)
	}
	promtoolCheckRules(t, metricsRules, string(data))
}

// promtoolCheckRules runs `promtool check rules` (Debian package prometheus) on a rule
// file's text where promtool is installed: it parses the PromQL and the templates.
func promtoolCheckRules(t *testing.T, what, rules string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Logf("promtool not installed: the PromQL of %s is not parsed", what)
		return
	}
	f := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (%s): %v\n%s", what, err, out)
	}
}

// TestMetricsServed starts `fluxkv up`, puts and gets a few keys, and requires every
// metric the dashboard and the rules name in its /metrics; /healthz answers 200 from
// the start and /readyz 200 once the node is up.
func TestMetricsServed(t *testing.T) {
	want := metricExprNames(append(readDashboard(t), readRules(t)...))
	if t.Failed() {
		t.FailNow()
	}
	node := startMetricsNode(t)

	if code, body := metricsGet(t, node.addr, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 \"ok\\n\"", code, body)
	}
	waitReady(t, node)

	c, err := fluxkv.Connect(fluxkv.Options{Socket: node.socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("fluxkv"), 10<<10)
	keys := []string{"metrics-a", "metrics-b", "metrics-c"}
	for _, k := range keys {
		if err := c.Put(k, value); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	for _, k := range keys {
		h, err := c.Get(k)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		h.Release()
	}
	if _, err := c.Get("metrics-absent"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("get of an absent key: %v, want ErrKeyNotFound", err)
	}
	hs, errs, err := c.BatchGet(keys)
	if err != nil {
		t.Fatalf("batch get: %v", err)
	}
	for i, h := range hs {
		if errs[i] != nil {
			t.Fatalf("batch get %s: %v", keys[i], errs[i])
		}
		h.Release()
	}
	c.Flush()
	c.Close()

	// The capacity gauges come with the first capacity reading after the owner
	// started (a master call): scrape until every name is there.
	var fams map[string]scrapedFamily
	var missing []string
	deadline := time.Now().Add(proctest.StartBudget)
	for {
		fams = scrapeFamilies(t, node.addr)
		missing = missing[:0]
		for _, name := range want {
			if !servedMetric(fams, name) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(missing) > 0 {
		var served []string
		for name := range fams {
			if strings.HasPrefix(name, "fluxkv_") || strings.HasPrefix(name, "kv") {
				served = append(served, name)
			}
		}
		sort.Strings(served)
		t.Errorf("the dashboard or the rules name metrics `fluxkv up` does not serve:\n  %s\nserved:\n  %s",
			strings.Join(missing, "\n  "), strings.Join(served, "\n  "))
	}
	t.Logf("%d metric names of the dashboard and the rules served: %s", len(want), strings.Join(want, " "))

	// What was done shows in the counters the dashboard's hit rate and throughput read.
	for name, min := range map[string]float64{
		`fluxkv_get_hits_total{locality="local",source="memory"}`: 6, // 3 gets + 3 in the batch
		`fluxkv_get_misses_total`:                                 1,
		`fluxkv_client_bytes_total{dir="in"}`:                     float64(3 * len(value)),
		`fluxkv_client_bytes_total{dir="out"}`:                    float64(6 * len(value)),
		`fluxkv_owner_registered`:                                 1,
		`fluxkv_master_leader`:                                    1,
		`fluxkv_master_members`:                                   1,
	} {
		if v, ok := sampleValue(fams, name); !ok || v < min {
			t.Errorf("%s = %v (served %v), want ≥ %v", name, v, ok, min)
		}
	}

	if err := node.p.Stop(proctest.StopBudget); err != nil {
		t.Fatal(err)
	}
}

// metricsNode is a running `fluxkv up`.
type metricsNode struct {
	p      *proctest.Proc
	socket string
	addr   string // its metrics server
}

// startMetricsNode runs `fluxkv up` with its metrics on a free port and waits until its
// log names the metrics address. When the test ends the process is killed, and a race
// in it fails the test.
func startMetricsNode(t *testing.T) *metricsNode {
	t.Helper()
	bin := metricsBinary(t)
	dir := t.TempDir()
	var mu sync.Mutex // protects addr
	var addr string
	p, err := proctest.Start(proctest.Options{
		Name: "fluxkv up (metrics)",
		Args: []string{bin, "--log-format", "json", "up", "--dir", dir, "--dram", "64MiB", "--metrics-addr", "127.0.0.1:0"},
		Env:  []string{proctest.RaceEnv},
		OnLogLine: func(line []byte) {
			var l struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal(line, &l) == nil && l.Message == "metrics serving on /metrics" {
				mu.Lock()
				addr = l.Addr
				mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if msg := p.RaceFailure(); msg != "" {
			t.Error(msg)
		}
	})
	n := &metricsNode{p: p, socket: filepath.Join(dir, "fluxkv.sock")}
	if err := p.WaitFor(proctest.StartBudget, "the metrics address in the log", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n.addr = addr
		return addr != ""
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// metricsBinary is $FLUXKV_BIN, else cmd/fluxkv built for this test and removed after it.
func metricsBinary(t *testing.T) string {
	t.Helper()
	if os.Getenv(proctest.BinEnv) == "" {
		t.Cleanup(proctest.RemoveBuilt)
	}
	bin, err := proctest.Binary(false)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// waitReady polls /readyz until it answers 200, for metricsReadyBudget.
func waitReady(t *testing.T, n *metricsNode) {
	t.Helper()
	var code int
	var body string
	err := n.p.WaitFor(metricsReadyBudget, "/readyz to answer 200", func() bool {
		code, body = metricsGet(t, n.addr, "/readyz")
		return code == http.StatusOK
	})
	if err != nil {
		t.Fatalf("%v\nlast /readyz: %d %q", err, code, body)
	}
	if body != "ok\n" {
		t.Errorf("/readyz body %q, want \"ok\\n\"", body)
	}
	if !proctest.Accepts("unix", n.socket) {
		t.Errorf("/readyz answered 200 but %s does not accept", n.socket)
	}
}

// metricsGet fetches path from the metrics server at addr: its status and body.
func metricsGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	cl := http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// scrapedFamily is one metric family of a scrape: its type and its samples by label
// string (`l1="v1",l2="v2"`, labels in name order; histograms: the sample count).
type scrapedFamily struct {
	typ     string // COUNTER, GAUGE, HISTOGRAM, SUMMARY, UNTYPED, ...
	samples map[string]float64
}

// scrapeFamilies fetches and parses /metrics.
func scrapeFamilies(t *testing.T, addr string) map[string]scrapedFamily {
	t.Helper()
	code, body := metricsGet(t, addr, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, proctest.Tail(body, 2000))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]scrapedFamily{}
	for name, f := range fams {
		sf := scrapedFamily{typ: f.GetType().String(), samples: map[string]float64{}}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := strings.Join(ls, ",")
			switch {
			case m.Counter != nil:
				sf.samples[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				sf.samples[key] = m.Gauge.GetValue()
			case m.Untyped != nil:
				sf.samples[key] = m.Untyped.GetValue()
			case m.Histogram != nil:
				sf.samples[key] = float64(m.Histogram.GetSampleCount())
			case m.Summary != nil:
				sf.samples[key] = float64(m.Summary.GetSampleCount())
			}
		}
		out[name] = sf
	}
	return out
}

// servedMetric reports whether name is a family with samples in fams, or a
// histogram's (or summary's) _bucket, _sum or _count series.
func servedMetric(fams map[string]scrapedFamily, name string) bool {
	if len(fams[name].samples) > 0 {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok || len(fams[base].samples) == 0 {
			continue
		}
		switch fams[base].typ {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			return true
		case "SUMMARY":
			return suffix != "_bucket"
		}
	}
	return false
}

// sampleValue is the value of the sample written like `name{l1="v1",...}` (labels in
// name order) or `name`.
func sampleValue(fams map[string]scrapedFamily, sample string) (float64, bool) {
	name, labels, _ := strings.Cut(sample, "{")
	v, ok := fams[name].samples[strings.TrimSuffix(labels, "}")]
	return v, ok
}
