package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/internal/proctest"
)

// The container image: deploy/Containerfile read as text and checked against the code
// (always, in milliseconds), and built and run where podman or docker answers.

// containerfileInstr is one instruction of a Containerfile, continuation lines joined.
type containerfileInstr struct {
	line int    // where it starts
	cmd  string // FROM, RUN, ... (upper case)
	args string
}

// containerfileStage is a FROM and the instructions under it.
type containerfileStage struct {
	from, name string // the base image; the AS name ("" without one)
	instrs     []containerfileInstr
}

// all is the stage's instructions named cmd.
func (s *containerfileStage) all(cmd string) []containerfileInstr {
	var out []containerfileInstr
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// parseContainerfile splits path into stages: comment lines dropped (also inside a
// continuation, as the builders do), lines ending in a backslash joined.
func parseContainerfile(t *testing.T, path string) []*containerfileStage {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		stages []*containerfileStage
		cur    strings.Builder
		start  int
	)
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := containerfileInstr{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := &containerfileStage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"): // --platform=...
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				case st.from == "":
					st.from = f[i]
				}
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s:%d: %s before the first FROM", path, in.line, in.cmd)
			}
			return
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
	}
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

// fluxkvBin is the plain fluxkv binary: $FLUXKV_BIN_NORACE or $FLUXKV_BIN (`make
// test` sets both), else cmd/fluxkv built into the test's temporary directory.
func fluxkvBin(t *testing.T) string {
	t.Helper()
	for _, env := range []string{proctest.NoRaceBinEnv, proctest.BinEnv} {
		if p := os.Getenv(env); p != "" {
			return p
		}
	}
	bin := filepath.Join(t.TempDir(), "fluxkv")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fluxkv/fluxkv/cmd/fluxkv").CombinedOutput(); err != nil {
		t.Fatalf("build fluxkv: %v\n%s", err, out)
	}
	return bin
}

// imageDocumentedPorts is every port the project gives a listener by default or in its
// examples, with where it was found: the non-zero ports of the flag defaults of `fluxkv
// master` and `fluxkv owner` (--help), the listen and metrics addresses of
// scripts/examples/*.yaml, and the --listen/--peer-listen/--data-listen/--metrics-addr
// arguments in README.md and docs/*.md (but the image's own page).
func imageDocumentedPorts(t *testing.T) map[int][]string {
	t.Helper()
	ports := map[int][]string{}
	add := func(port, where string) {
		if p, _ := strconv.Atoi(port); p != 0 && !slices.Contains(ports[p], where) {
			ports[p] = append(ports[p], where)
		}
	}
	bin := fluxkvBin(t)
	helpDefault := regexp.MustCompile(`(?m)^\s*(--[a-z-]+).*\(default: "[^"]*:(\d+)"\)`)
	for _, role := range []string{"master", "owner"} {
		out, err := exec.Command(bin, role, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("fluxkv %s --help: %v\n%s", role, err, out)
		}
		for _, m := range helpDefault.FindAllStringSubmatch(string(out), -1) {
			add(m[2], fmt.Sprintf("fluxkv %s %s default", role, m[1]))
		}
	}
	yamlAddr := regexp.MustCompile(`(?m)^\s*(listen|peer_listen|data_listen|metrics_addr):\s*\S*:(\d+)\s*$`)
	examples, _ := filepath.Glob("../scripts/examples/*.yaml")
	flagAddr := regexp.MustCompile(`(--(?:listen|master-listen|peer-listen|data-listen|metrics-addr))[ =]\S*:(\d+)`)
	docs, _ := filepath.Glob("../docs/*.md")
	for _, tc := range []struct {
		files []string
		re    *regexp.Regexp
	}{{examples, yamlAddr}, {append([]string{"../README.md"}, docs...), flagAddr}} {
		for _, f := range tc.files {
			if filepath.Base(f) == "container-image.md" {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				continue // a doc moved: the others still count
			}
			for _, m := range tc.re.FindAllStringSubmatch(string(data), -1) {
				add(m[2], strings.TrimPrefix(f, "../")+" "+m[1])
			}
		}
	}
	return ports
}

// versionVars is the package-level string variables of cmd/fluxkv/version.go: the
// only names -ldflags -X main.NAME can set (the linker ignores any other silently).
func versionVars(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../cmd/fluxkv/version.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "string" && len(vs.Values) == 0 {
				for _, n := range vs.Names {
					vars[n.Name] = true
				}
			}
		}
	}
	return vars
}

// deploy/Containerfile builds a static fluxkv (CGO_ENABLED=0) whose version fields come
// from build args into variables that exist, runs it as a numeric non-root user on a
// base without libc, labels it, and exposes only ports the code or the docs give a
// listener (the master's default among them).
func TestImageContainerfile(t *testing.T) {
	stages := parseContainerfile(t, "Containerfile")
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a run stage", len(stages))
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") && final.from != "scratch" {
		t.Errorf("final stage FROM %s: want gcr.io/distroless/static-* or scratch (a static binary needs no libc)", final.from)
	}

	users := final.all("USER")
	if len(users) == 0 {
		t.Fatal("the final stage sets no USER: the image would run as root")
	}
	u := users[len(users)-1]
	name, _, _ := strings.Cut(u.args, ":")
	if uid, err := strconv.Atoi(name); err != nil || uid == 0 {
		t.Errorf("line %d: USER %s: want a numeric uid other than 0 (a runtime checks runAsNonRoot by number)", u.line, u.args)
	}

	eps := final.all("ENTRYPOINT")
	if len(eps) != 1 {
		t.Fatalf("final stage has %d ENTRYPOINTs, want 1", len(eps))
	}
	var ep []string
	if err := json.Unmarshal([]byte(eps[0].args), &ep); err != nil || len(ep) == 0 {
		t.Fatalf("line %d: ENTRYPOINT %s: want the exec form, a JSON array (there is no shell): %v", eps[0].line, eps[0].args, err)
	}
	if path.Base(ep[0]) != "fluxkv" || !path.IsAbs(ep[0]) {
		t.Errorf("ENTRYPOINT runs %q, want an absolute path to fluxkv", ep[0])
	}

	// The binary the entrypoint runs is copied from a stage that builds it statically.
	var build *containerfileStage
	for _, c := range final.all("COPY") {
		f := strings.Fields(c.args)
		if len(f) >= 2 && f[len(f)-1] == ep[0] {
			for _, opt := range f[:len(f)-2] {
				if from, ok := strings.CutPrefix(opt, "--from="); ok {
					for _, s := range stages[:len(stages)-1] {
						if s.name == from {
							build = s
						}
					}
				}
			}
		}
	}
	if build == nil {
		t.Fatalf("no COPY --from=<build stage> ... %s in the final stage", ep[0])
	}
	var goBuild *containerfileInstr
	for _, r := range build.all("RUN") {
		if strings.Contains(r.args, "go build") && strings.Contains(r.args, "./cmd/fluxkv") {
			goBuild = &r
		}
	}
	if goBuild == nil {
		t.Fatalf("build stage %q has no RUN ... go build ... ./cmd/fluxkv", build.name)
	}
	if !regexp.MustCompile(`(^|\s)CGO_ENABLED=0\s`).MatchString(goBuild.args) {
		t.Errorf("line %d: the go build does not set CGO_ENABLED=0: the binary would need libc, which %s lacks", goBuild.line, final.from)
	}
	if !strings.Contains(goBuild.args, "-trimpath") {
		t.Errorf("line %d: the go build lacks -trimpath (paths of the build machine in the binary)", goBuild.line)
	}
	args := map[string]bool{}
	for _, a := range build.all("ARG") {
		n, _, _ := strings.Cut(a.args, "=")
		args[n] = true
	}
	vars := versionVars(t)
	setX := regexp.MustCompile(`-X\s+main\.(\w+)=\$\{?(\w+)\}?`)
	set := map[string]bool{}
	for _, m := range setX.FindAllStringSubmatch(goBuild.args, -1) {
		set[m[1]] = true
		if !vars[m[1]] {
			t.Errorf("line %d: -X main.%s: cmd/fluxkv/version.go has no such string variable (the linker would ignore it)", goBuild.line, m[1])
		}
		if !args[m[2]] {
			t.Errorf("line %d: -X main.%s=${%s}: no ARG %s in the build stage", goBuild.line, m[1], m[2], m[2])
		}
	}
	for v := range vars {
		if !set[v] {
			t.Errorf("line %d: the go build does not set main.%s with -X (the image has no .git to read it from)", goBuild.line, v)
		}
	}
	if len(vars) == 0 {
		t.Error("cmd/fluxkv/version.go declares no -ldflags -X variables")
	}

	labels := map[string]string{}
	labelKV := regexp.MustCompile(`(org\.opencontainers\.image\.[a-z.]+)=("(?:[^"\\]|\\.)*"|\S+)`)
	for _, l := range final.all("LABEL") {
		for _, m := range labelKV.FindAllStringSubmatch(l.args, -1) {
			labels[m[1]] = strings.Trim(m[2], `"`)
		}
	}
	for _, k := range []string{"title", "description", "source", "version", "revision", "created"} {
		if labels["org.opencontainers.image."+k] == "" {
			t.Errorf("no LABEL org.opencontainers.image.%s in the final stage", k)
		}
	}
	if !strings.Contains(labels["org.opencontainers.image.revision"], "${") {
		t.Errorf("LABEL org.opencontainers.image.revision=%q: want it from the commit build arg", labels["org.opencontainers.image.revision"])
	}

	documented := imageDocumentedPorts(t)
	var exposed []int
	for _, e := range final.all("EXPOSE") {
		for _, f := range strings.Fields(e.args) {
			p, err := strconv.Atoi(strings.TrimSuffix(f, "/tcp"))
			if err != nil {
				t.Errorf("line %d: EXPOSE %s: want a TCP port", e.line, f)
				continue
			}
			exposed = append(exposed, p)
			if where := documented[p]; len(where) == 0 {
				t.Errorf("line %d: EXPOSE %d: no flag default, example config or doc gives a listener this port", e.line, p)
			} else {
				t.Logf("EXPOSE %d: %s", p, strings.Join(where, "; "))
			}
		}
	}
	for p, where := range documented {
		for _, w := range where {
			if strings.HasSuffix(w, " default") && !slices.Contains(exposed, p) {
				t.Errorf("port %d (%s) is not EXPOSEd", p, w)
			}
		}
	}
}

// The build context is the repository root: /.dockerignore keeps the binaries, test
// output and git history (hundreds of MiB) out of it.
func TestImageDockerignore(t *testing.T) {
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf("the image's build context is the repository root: %v", err)
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, strings.TrimSuffix(strings.TrimPrefix(l, "/"), "/"))
		}
	}
	for _, want := range []string{".git", "bin", "out"} {
		if !slices.Contains(patterns, want) {
			t.Errorf(".dockerignore does not exclude %s (patterns: %v)", want, patterns)
		}
	}
}

// imageBuilder is the first of podman and docker that is installed and whose daemon
// (or, for podman, storage) answers `info`; else "" and why not.
func imageBuilder() (string, string) {
	var why []string
	for _, name := range []string{"podman", "docker"} {
		p, err := exec.LookPath(name)
		if err != nil {
			why = append(why, name+" is not installed")
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, p, "info").CombinedOutput()
		cancel()
		if err != nil {
			why = append(why, fmt.Sprintf("%s is installed but `%s info` fails (%v): %s", name, name, err, strings.Join(proctest.TailLines(string(out), 2), " ")))
			continue
		}
		return p, ""
	}
	return "", strings.Join(why, "; ")
}

// `make image` builds the image with the builder there is; the image runs as 65532 and
// `<image> --version` names the commit it was built from.
func TestImageBuild(t *testing.T) {
	builder, why := imageBuilder()
	if builder == "" {
		t.Skip("no container builder to build the image with: " + why)
	}
	if testing.Short() {
		t.Skip("builds the image (minutes)")
	}
	const image = "fluxkv-imagetest"
	tag := fmt.Sprintf("t%d", time.Now().UnixNano())
	t.Cleanup(func() {
		exec.Command(builder, "rmi", image+":"+tag, image+":latest").Run()
	})
	mk := exec.Command("make", "-C", "..", "image", "CONTAINER_BUILDER="+builder, "IMAGE="+image, "VERSION="+tag)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, proctest.Tail(string(out), 8000))
	}
	out, err := exec.Command(builder, "run", "--rm", image+":"+tag, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s run %s:%s --version: %v\n%s", builder, image, tag, err, out)
	}
	t.Logf("%s --version:\n%s", image, out)
	fields := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			fields[k] = v
		}
	}
	if !strings.HasPrefix(string(out), "fluxkv version "+tag+"\n") {
		t.Errorf("--version does not start with %q", "fluxkv version "+tag)
	}
	c := fields["commit"]
	if c == "" || c == "unknown" {
		t.Errorf("--version names no commit (%q)", c)
	}
	if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		if h := strings.TrimSpace(string(head)); strings.TrimSuffix(c, "-dirty") != h {
			t.Errorf("commit %q, want %s (git rev-parse HEAD), with -dirty for a modified tree", c, h)
		}
	}
	user, err := exec.Command(builder, "image", "inspect", "--format", "{{.Config.User}}", image+":"+tag).Output()
	if err != nil {
		t.Fatalf("image inspect: %v", err)
	}
	if u := strings.TrimSpace(string(user)); u != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532", u)
	}
}
