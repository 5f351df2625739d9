package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fluxkv/fluxkv/config"
)

// The reference in README.md and docs/*.md, checked against the tree: the tests it
// cites exist, and running.md lists every fluxkv_spec key.

const repoRoot = "../.."

// referenceDocs are README.md and docs/*.md but the dated logs (benchmarks.md's
// measurements and departures.md's history may name what is gone).
func referenceDocs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range append(paths, filepath.Join(repoRoot, "README.md")) {
		if b := filepath.Base(p); b == "benchmarks.md" || b == "departures.md" {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, p)
		out[rel] = string(data)
	}
	return out
}

// TestDocsCiteExistingTests: every Go test or fuzz target (TestX, TestX/sub: TestX),
// pytest function (test_x), test file (test_x.py) and scenario script
// (dir/testdata/x.txt, testdata/x.txt of master or daemon) a doc cites exists.
func TestDocsCiteExistingTests(t *testing.T) {
	goFuncs, pyFuncs, files := map[string]bool{}, map[string]bool{}, map[string]bool{}
	goFunc := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	pyFunc := regexp.MustCompile(`(?m)^\s*(?:async )?def (test_\w+)\(`)
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != repoRoot && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "__pycache__") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(repoRoot, p)
		files[filepath.ToSlash(rel)] = true
		files[d.Name()] = true
		switch {
		case strings.HasSuffix(p, "_test.go"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range goFunc.FindAllStringSubmatch(string(b), -1) {
				goFuncs[m[1]] = true
			}
		case strings.HasSuffix(p, ".py"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range pyFunc.FindAllStringSubmatch(string(b), -1) {
				pyFuncs[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(goFuncs) < 100 || len(pyFuncs) < 50 {
		t.Fatalf("found %d Go and %d Python tests: not the repository's tree?", len(goFuncs), len(pyFuncs))
	}

	citedGo := regexp.MustCompile(`\b(?:Test|Fuzz)[A-Z]\w*`)
	citedPy := regexp.MustCompile(`\btest_\w+(?:\.py)?`)
	citedScript := regexp.MustCompile(`\b(?:[\w/]+/)?testdata/[\w/]+\.txt\b`)
	for doc, text := range referenceDocs(t) {
		for _, name := range citedGo.FindAllString(text, -1) {
			if !goFuncs[name] {
				t.Errorf("%s cites %s: no func %s in any _test.go", doc, name, name)
			}
		}
		for _, name := range citedPy.FindAllString(text, -1) {
			if strings.HasSuffix(name, ".py") {
				if !files[name] {
					t.Errorf("%s cites %s: no such file", doc, name)
				}
			} else if !pyFuncs[name] {
				t.Errorf("%s cites %s: no def %s in any .py", doc, name, name)
			}
		}
		for _, path := range citedScript.FindAllString(text, -1) {
			if strings.HasPrefix(path, "testdata/") {
				if !files["master/"+path] && !files["daemon/"+path] {
					t.Errorf("%s cites %s: in neither master/ nor daemon/", doc, path)
				}
			} else if !files[path] {
				t.Errorf("%s cites %s: no such file", doc, path)
			}
		}
	}
}

// TestRunningDocListsOwnerKeys: docs/running.md's list of the fluxkv_spec keys names
// every key an owner's file takes (the parser's own list, from its unknown-key error).
func TestRunningDocListsOwnerKeys(t *testing.T) {
	_, err := config.Parse([]byte("fluxkv_spec: {no_such_key: 1}\n"), config.RoleOwner)
	if err == nil {
		t.Fatal("an unknown fluxkv_spec key was accepted")
	}
	_, known, ok := strings.Cut(err.Error(), "(known: ")
	known, _, ok2 := strings.Cut(known, ")")
	if !ok || !ok2 {
		t.Fatalf("the unknown-key error lists no known keys: %v", err)
	}
	doc := referenceDocs(t)[filepath.Join("docs", "running.md")]
	_, list, ok := strings.Cut(doc, "Owner keys live under")
	list, _, ok2 = strings.Cut(list, "master keys under")
	if !ok || !ok2 {
		t.Fatal("docs/running.md: no \"Owner keys live under `fluxkv_spec:` (...), master keys under\" list")
	}
	for _, key := range strings.Split(known, ", ") {
		if !strings.Contains(list, "`"+key+"`") {
			t.Errorf("docs/running.md: the fluxkv_spec keys do not list `%s`", key)
		}
	}
}
