package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
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

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// The Kubernetes manifests (deploy/k8s, docs/kubernetes.md), checked against the code
// with no cluster: every YAML document decodes strictly into the k8s.io/api type of its
// kind (an unknown, mis-cased or duplicated field fails, as the API server's strict field
// validation refuses it; so does a kind this test does not know), kustomization.yaml
// lists what exists, the config files in ConfigMaps load with fluxkv's own config loader,
// and the wiring holds: the socket the owner serves is the one the example client dials,
// at the same path; the container ports, Services, probes and scrape annotations name
// the configured ports; Secrets are private; the pods are locked down; the owner's memory
// limit covers its segment. Where kubectl is installed, `kubectl kustomize` builds the
// base and each component and the output is checked too.

// k8sDir holds the manifests, relative to this package.
const k8sDir = "k8s"

// k8sExcluded are the manifest files that kustomization.yaml leaves out on purpose.
// Components (components/*) are opt-in through their own kustomization.yaml.
var k8sExcluded = map[string]string{
	"example-inference.yaml": "an example client pod, applied by hand to check a node",
}

// Sample values for the downward API, to expand $(VAR) in arguments the way kubelet
// does before the values reach fluxkv's own checks.
var k8sFieldSamples = map[string]string{
	"status.podIP":  "10.244.3.17",
	"status.hostIP": "192.0.2.10",
	"spec.nodeName": "gpu-node-1.example.internal",
}

// k8sServiceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) these manifests use, decoded as strictly as the rest. The
// operator's Go types would add a module and its dependency tree for one object; a field
// used in a manifest but missing here fails the test, and is added after checking it
// against the CRD.
type k8sServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port,omitempty"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// k8sKustomization is the part of a kustomization.yaml (Kustomization or Component) that
// these use, decoded strictly: kustomize's own types (sigs.k8s.io/kustomize/api) are a
// large module for a handful of fields.
type k8sKustomization struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string   `json:"namespace,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	Components      []string `json:"components,omitempty"`
	Patches         []struct {
		Path   string `json:"path,omitempty"`
		Patch  string `json:"patch,omitempty"`
		Target *struct {
			Kind string `json:"kind,omitempty"`
			Name string `json:"name,omitempty"`
		} `json:"target,omitempty"`
	} `json:"patches,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// k8sDeletePatch is a strategic merge patch that deletes an object ($patch: delete).
type k8sDeletePatch struct {
	Patch             string `json:"$patch"`
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
}

// k8sKinds maps apiVersion/kind to a new typed object; a kind missing here fails.
var k8sKinds = map[string]func() any{
	"v1/Namespace":                                  func() any { return new(corev1.Namespace) },
	"v1/ServiceAccount":                             func() any { return new(corev1.ServiceAccount) },
	"v1/ConfigMap":                                  func() any { return new(corev1.ConfigMap) },
	"v1/Secret":                                     func() any { return new(corev1.Secret) },
	"v1/Service":                                    func() any { return new(corev1.Service) },
	"v1/Pod":                                        func() any { return new(corev1.Pod) },
	"v1/PersistentVolume":                           func() any { return new(corev1.PersistentVolume) },
	"v1/PersistentVolumeClaim":                      func() any { return new(corev1.PersistentVolumeClaim) },
	"apps/v1/Deployment":                            func() any { return new(appsv1.Deployment) },
	"apps/v1/DaemonSet":                             func() any { return new(appsv1.DaemonSet) },
	"apps/v1/StatefulSet":                           func() any { return new(appsv1.StatefulSet) },
	"policy/v1/PodDisruptionBudget":                 func() any { return new(policyv1.PodDisruptionBudget) },
	"networking.k8s.io/v1/NetworkPolicy":            func() any { return new(networkingv1.NetworkPolicy) },
	"monitoring.coreos.com/v1/ServiceMonitor":       func() any { return new(k8sServiceMonitor) },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return new(k8sKustomization) },
	"kustomize.config.k8s.io/v1alpha1/Component":    func() any { return new(k8sKustomization) },
}

// k8sDoc is one YAML document of a manifest file, decoded.
type k8sDoc struct {
	file  string // relative to deploy/k8s, slash-separated
	n     int    // the document's index in its file
	gvk   string // apiVersion/kind
	obj   any    // a pointer to the typed object
	patch bool   // a component's patch (a partial object), not a resource
}

func (d *k8sDoc) String() string { return fmt.Sprintf("%s#%d (%s)", d.file, d.n, d.gvk) }

func (d *k8sDoc) name() string {
	if m, ok := d.obj.(interface{ GetName() string }); ok {
		return m.GetName()
	}
	return ""
}

// k8sDecode decodes one YAML document strictly: duplicate keys, unknown fields and
// fields in the wrong case fail (sigs.k8s.io/json is case-sensitive, as the API server
// is; encoding/json would accept "hostnetwork" for hostNetwork), and so does a kind
// missing from k8sKinds. An empty document (comments only) gives a nil object.
func k8sDecode(doc []byte) (gvk string, obj any, err error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "", nil, err
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return "", nil, nil
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Patch      string `json:"$patch"`
	}
	if err := sjson.UnmarshalCaseSensitivePreserveInts(js, &head); err != nil {
		return "", nil, err
	}
	if head.APIVersion == "" || head.Kind == "" {
		return "", nil, errors.New("no apiVersion and kind")
	}
	gvk = head.APIVersion + "/" + head.Kind
	mk, ok := k8sKinds[gvk]
	if !ok {
		return gvk, nil, fmt.Errorf("unknown kind %s (add its k8s.io/api type to k8sKinds)", gvk)
	}
	obj = mk()
	if head.Patch != "" {
		if head.Patch != "delete" {
			return gvk, nil, fmt.Errorf("$patch: %q: only delete is used here", head.Patch)
		}
		obj = new(k8sDeletePatch)
	}
	strict, err := sjson.UnmarshalStrict(js, obj, sjson.DisallowDuplicateFields, sjson.DisallowUnknownFields)
	if err != nil {
		return gvk, nil, err
	}
	if len(strict) > 0 {
		return gvk, nil, errors.Join(strict...)
	}
	return gvk, obj, nil
}

// k8sDecodeFile splits data into YAML documents and decodes each.
func k8sDecodeFile(file string, data []byte) ([]*k8sDoc, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []*k8sDoc
	for n := 0; ; n++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		gvk, obj, err := k8sDecode(raw)
		if err != nil {
			return nil, fmt.Errorf("%s#%d: %w", file, n, err)
		}
		if obj != nil {
			docs = append(docs, &k8sDoc{file: file, n: n, gvk: gvk, obj: obj})
		}
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no Kubernetes object", file)
	}
	return docs, nil
}

// k8sManifests is every document under deploy/k8s.
type k8sManifests struct {
	docs  []*k8sDoc
	files []string // every YAML file, relative to deploy/k8s
}

// k8sLoad reads and decodes every YAML file under deploy/k8s, failing the test on any
// that does not decode, and marks the documents of the files components name as patches.
func k8sLoad(t *testing.T) *k8sManifests {
	t.Helper()
	m := &k8sManifests{}
	err := filepath.WalkDir(k8sDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || (!strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml")) {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, k8sDir+string(filepath.Separator)))
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		docs, err := k8sDecodeFile(rel, data)
		if err != nil {
			t.Error(err)
			return nil
		}
		m.files = append(m.files, rel)
		m.docs = append(m.docs, docs...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, k := range m.kustomizations() {
		dir := path.Dir(k.file)
		for _, p := range k.obj.(*k8sKustomization).Patches {
			for _, d := range m.docs {
				if p.Path != "" && d.file == path.Join(dir, p.Path) {
					d.patch = true
				}
			}
		}
	}
	return m
}

func (m *k8sManifests) kustomizations() []*k8sDoc {
	var out []*k8sDoc
	for _, d := range m.docs {
		if _, ok := d.obj.(*k8sKustomization); ok {
			out = append(out, d)
		}
	}
	return out
}

// objects is every document that is a Kubernetes object (no kustomization, no patch).
func (m *k8sManifests) objects() []*k8sDoc {
	var out []*k8sDoc
	for _, d := range m.docs {
		if _, ok := d.obj.(*k8sKustomization); !ok && !d.patch {
			out = append(out, d)
		}
	}
	return out
}

// k8sGet is the one object of type T named name.
func k8sGet[T any](t *testing.T, m *k8sManifests, name string) *T {
	t.Helper()
	var found []*T
	for _, d := range m.objects() {
		if o, ok := d.obj.(*T); ok && d.name() == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %T named %q in %s, found %d", new(T), name, k8sDir, len(found))
	}
	return found[0]
}

// k8sAll is every object of type T.
func k8sAll[T any](m *k8sManifests) []*T {
	var out []*T
	for _, d := range m.objects() {
		if o, ok := d.obj.(*T); ok {
			out = append(out, o)
		}
	}
	return out
}

// k8sPodTemplate is a pod spec with the labels and annotations its pods get.
type k8sPodTemplate struct {
	what string // "DaemonSet fluxkv-owner"
	meta metav1.ObjectMeta
	spec *corev1.PodSpec
}

// k8sPods is every pod template (workloads) and Pod.
func k8sPods(m *k8sManifests) []k8sPodTemplate {
	var out []k8sPodTemplate
	for _, d := range m.objects() {
		switch o := d.obj.(type) {
		case *appsv1.Deployment:
			out = append(out, k8sPodTemplate{"Deployment " + o.Name, o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec})
		case *appsv1.DaemonSet:
			out = append(out, k8sPodTemplate{"DaemonSet " + o.Name, o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec})
		case *appsv1.StatefulSet:
			out = append(out, k8sPodTemplate{"StatefulSet " + o.Name, o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec})
		case *corev1.Pod:
			out = append(out, k8sPodTemplate{"Pod " + o.Name, o.ObjectMeta, &o.Spec})
		}
	}
	return out
}

func k8sContainer(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func k8sVolume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// k8sMountOf is the volume mount of c that holds the in-container path p, and p
// relative to it ("" for the mount point itself).
func k8sMountOf(c *corev1.Container, p string) (*corev1.VolumeMount, string, bool) {
	p = path.Clean(p)
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		mp := path.Clean(vm.MountPath)
		if (p == mp || strings.HasPrefix(p, mp+"/")) && (best == nil || len(mp) > len(path.Clean(best.MountPath))) {
			best = vm
		}
	}
	if best == nil {
		return nil, "", false
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, path.Clean(best.MountPath)), "/")
	return best, rel, true
}

// k8sEnv resolves a container's environment as kubelet would: literal values,
// downward-API fields (k8sFieldSamples) and ConfigMap keys from the manifests.
func k8sEnv(t *testing.T, m *k8sManifests, c *corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			v, ok := k8sFieldSamples[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("container %s: env %s: no sample for field %s", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := k8sGet[corev1.ConfigMap](t, m, ref.Name)
			v, ok := cm.Data[ref.Key]
			if !ok {
				t.Fatalf("container %s: env %s: ConfigMap %s has no key %q", c.Name, e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		default:
			t.Fatalf("container %s: env %s: a source this test does not resolve", c.Name, e.Name)
		}
	}
	return env
}

var k8sVarRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// k8sExpand replaces $(VAR) with env[VAR] as kubelet does in command and args; a
// reference to an undefined variable is an error (kubelet would pass it on literally).
func k8sExpand(s string, env map[string]string) (string, error) {
	var missing []string
	out := k8sVarRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := k8sVarRef.FindStringSubmatch(ref)[1]
		v, ok := env[name]
		if !ok {
			missing = append(missing, name)
			return ref
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%q names undefined env %v", s, missing)
	}
	return out, nil
}

// k8sBoolFlags are the fluxkv flags that take no value.
var k8sBoolFlags = map[string]bool{"insecure-cluster": true, "client-isolation": true, "no-promotion": true, "help": true}

// k8sRole is a fluxkv container: its subcommand, expanded flags and config file.
type k8sRole struct {
	pod   k8sPodTemplate
	c     *corev1.Container
	env   map[string]string
	cmd   string              // master, owner, status, ...
	flags map[string][]string // flag name (no dashes) → values, $(VAR) expanded
	raw   map[string][]string // the same, as written
	file  *config.File        // --config, loaded with fluxkv's loader (nil without)
}

// k8sFluxkvRole is container name of the pod template what, read as a fluxkv command
// line: the image's entrypoint is the binary, so args[0] is the subcommand.
func k8sFluxkvRole(t *testing.T, m *k8sManifests, pod k8sPodTemplate, container string) *k8sRole {
	t.Helper()
	c := k8sContainer(t, pod.spec, container)
	if len(c.Command) != 0 {
		t.Fatalf("%s container %s: command %q replaces the image's fluxkv entrypoint; give args", pod.what, c.Name, c.Command)
	}
	if len(c.Args) == 0 {
		t.Fatalf("%s container %s: no args (the fluxkv subcommand)", pod.what, c.Name)
	}
	r := &k8sRole{pod: pod, c: c, env: k8sEnv(t, m, c), cmd: c.Args[0], flags: map[string][]string{}, raw: map[string][]string{}}
	for i := 1; i < len(c.Args); i++ {
		a := c.Args[i]
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("%s container %s: argument %q is not a --flag", pod.what, c.Name, a)
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !hasVal && !k8sBoolFlags[name] {
			if i+1 >= len(c.Args) {
				t.Fatalf("%s container %s: --%s has no value", pod.what, c.Name, name)
			}
			i++
			val = c.Args[i]
		}
		exp, err := k8sExpand(val, r.env)
		if err != nil {
			t.Fatalf("%s container %s: --%s: %v", pod.what, c.Name, name, err)
		}
		r.raw[name] = append(r.raw[name], val)
		r.flags[name] = append(r.flags[name], exp)
	}
	if p := r.flag("config"); p != "" {
		role := map[string]config.Role{"master": config.RoleMaster, "owner": config.RoleOwner, "up": config.RoleUp}[r.cmd]
		r.file = k8sLoadConfig(t, m, c, pod.spec, p, role)
	}
	return r
}

// flag is the last value of the first of names given (a flag repeated for a list is
// read with flags directly).
func (r *k8sRole) flag(names ...string) string {
	for _, n := range names {
		if v := r.flags[n]; len(v) > 0 {
			return v[len(v)-1]
		}
	}
	return ""
}

// setting is the flag's value if given, else the file's: fluxkv's own precedence.
func (r *k8sRole) setting(file string, names ...string) string {
	if v := r.flag(names...); v != "" {
		return v
	}
	return file
}

// k8sLoadConfig loads the config file the container reads at p: it must be a key of a
// ConfigMap volume mounted there. The key's text is written to a file of the same name
// and read with config.Load, the loader `fluxkv --config` uses, so a typo in the
// ConfigMap fails here as it would fail the pod.
func k8sLoadConfig(t *testing.T, m *k8sManifests, c *corev1.Container, spec *corev1.PodSpec, p string, role config.Role) *config.File {
	t.Helper()
	data := k8sConfigMapFile(t, m, c, spec, p)
	f := filepath.Join(t.TempDir(), path.Base(p))
	if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cf, err := config.Load(f, role)
	if err != nil {
		t.Fatalf("container %s: --config %s: %v", c.Name, p, err)
	}
	return cf
}

// k8sConfigMapFile is the text of the ConfigMap key mounted at p in c.
func k8sConfigMapFile(t *testing.T, m *k8sManifests, c *corev1.Container, spec *corev1.PodSpec, p string) string {
	t.Helper()
	vm, rel, ok := k8sMountOf(c, p)
	if !ok {
		t.Fatalf("container %s: %s is on no volume (the root file system is read-only and holds no config)", c.Name, p)
	}
	v := k8sVolume(spec, vm.Name)
	if v == nil || v.ConfigMap == nil {
		t.Fatalf("container %s: %s is on volume %s, not a ConfigMap", c.Name, p, vm.Name)
	}
	key := rel
	for _, it := range v.ConfigMap.Items {
		if it.Path == rel {
			key = it.Key
		}
	}
	cm := k8sGet[corev1.ConfigMap](t, m, v.ConfigMap.Name)
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("container %s: %s: ConfigMap %s has no key %q", c.Name, p, cm.Name, key)
	}
	return data
}

// k8sWorkloads are the two fluxkv roles of the base.
func k8sWorkloads(t *testing.T, m *k8sManifests) (master, owner *k8sRole) {
	t.Helper()
	d := k8sGet[appsv1.Deployment](t, m, "fluxkv-master")
	ds := k8sGet[appsv1.DaemonSet](t, m, "fluxkv-owner")
	master = k8sFluxkvRole(t, m, k8sPodTemplate{"Deployment " + d.Name, d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec}, "master")
	owner = k8sFluxkvRole(t, m, k8sPodTemplate{"DaemonSet " + ds.Name, ds.Spec.Template.ObjectMeta, &ds.Spec.Template.Spec}, "owner")
	if master.cmd != "master" || master.file == nil || master.file.Master == nil {
		t.Fatalf("master container: want `master --config FILE` with a master: section, got %q", master.c.Args)
	}
	if owner.cmd != "owner" || owner.file == nil || owner.file.Owner == nil {
		t.Fatalf("owner container: want `owner --config FILE` with a fluxkv_spec: section, got %q", owner.c.Args)
	}
	return master, owner
}

// k8sExample is the example inference pod's client container.
func k8sExample(t *testing.T, m *k8sManifests) (*corev1.Pod, *corev1.Container) {
	t.Helper()
	var pods []*corev1.Pod
	for _, d := range m.objects() {
		if p, ok := d.obj.(*corev1.Pod); ok && d.file == "example-inference.yaml" {
			pods = append(pods, p)
		}
	}
	if len(pods) != 1 || len(pods[0].Spec.Containers) != 1 {
		t.Fatalf("example-inference.yaml: want one Pod with one container")
	}
	return pods[0], &pods[0].Spec.Containers[0]
}

// TestK8sManifestsDecode: every file decodes strictly, every object of the base and the
// example lives in the fluxkv namespace (so a file also applies alone with kubectl apply
// -f), and no Secret is committed (they are made from files the user generates).
func TestK8sManifestsDecode(t *testing.T) {
	m := k8sLoad(t)
	if len(m.files) < 5 {
		t.Fatalf("only %d manifest files under %s", len(m.files), k8sDir)
	}
	for _, d := range m.objects() {
		switch o := d.obj.(type) {
		case *corev1.Namespace:
			if o.Name != "fluxkv" {
				t.Errorf("%s: namespace %q, want fluxkv", d, o.Name)
			}
			continue
		case *corev1.Secret:
			t.Errorf("%s: a Secret in the manifests; create Secrets from files instead (docs/kubernetes.md)", d)
		}
		ns := d.obj.(interface{ GetNamespace() string }).GetNamespace()
		if ns != "fluxkv" {
			t.Errorf("%s: metadata.namespace %q, want fluxkv", d, ns)
		}
	}
}

// TestK8sStrictDecoderRefuses proves the decoder the other tests rely on refuses what
// the API server's strict validation refuses: the real owner.yaml and servicemonitor.yaml
// decode, and each mutation of them fails with the reason.
func TestK8sStrictDecoderRefuses(t *testing.T) {
	read := func(p string) string {
		data, err := os.ReadFile(filepath.Join(k8sDir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	owner, sm := read("owner.yaml"), read("components/servicemonitor/servicemonitor.yaml")
	for _, tc := range []struct {
		name, file, text, old, new, want string
	}{
		{"unknown field", "owner.yaml", owner, "      hostPID: false\n", "      hostPID: false\n      hostPIDNamespace: false\n", `unknown field "spec.template.spec.hostPIDNamespace"`},
		{"unknown nested field", "owner.yaml", owner, "            readOnlyRootFilesystem: true\n", "            readOnlyRootFS: true\n", `unknown field "spec.template.spec.initContainers[0].securityContext.readOnlyRootFS"`},
		{"field in the wrong case", "owner.yaml", owner, "      hostNetwork: false\n", "      hostnetwork: false\n", `unknown field "spec.template.spec.hostnetwork"`},
		{"duplicate field", "owner.yaml", owner, "      hostPID: false\n", "      hostPID: false\n      hostPID: true\n", `"hostPID" already set`},
		{"wrong type", "owner.yaml", owner, "  minReadySeconds: 10\n", "  minReadySeconds: ten\n", "minReadySeconds"},
		{"unknown kind", "owner.yaml", owner, "kind: DaemonSet\n", "kind: DaemonSets\n", "unknown kind apps/v1/DaemonSets"},
		{"unknown ServiceMonitor field", "servicemonitor.yaml", sm, "      interval: 15s\n", "      intervall: 15s\n", `unknown field "spec.endpoints[0].intervall"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := k8sDecodeFile(tc.file, []byte(tc.text)); err != nil {
				t.Fatalf("unmodified %s: %v", tc.file, err)
			}
			if !strings.Contains(tc.text, tc.old) {
				t.Fatalf("%s no longer contains %q: update this case", tc.file, tc.old)
			}
			_, err := k8sDecodeFile(tc.file, []byte(strings.Replace(tc.text, tc.old, tc.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// A typo in a config file held by a ConfigMap fails fluxkv's loader (and the test
	// that loads it), not only at the pod's start.
	m := k8sLoad(t)
	cm := k8sGet[corev1.ConfigMap](t, m, "fluxkv-config")
	text := cm.Data["owner.yaml"]
	if !strings.Contains(text, "  dram: ") {
		t.Fatal("owner.yaml in fluxkv-config no longer sets dram: update this case")
	}
	if _, err := config.Parse([]byte(strings.Replace(text, "  dram: ", "  dramm: ", 1)), config.RoleOwner); err == nil ||
		!strings.Contains(err.Error(), "dramm") {
		t.Fatalf("a misspelled key in owner.yaml: got %v, want an error naming it", err)
	}
}

// TestK8sKustomization: kustomization.yaml lists files that exist, every manifest is
// listed or excluded on purpose, each component lists its own files, and every image the
// pods run has an images: entry (so an overlay can point it at a registry).
func TestK8sKustomization(t *testing.T) {
	m := k8sLoad(t)
	var base *k8sKustomization
	listed := map[string]bool{}
	for _, d := range m.kustomizations() {
		k := d.obj.(*k8sKustomization)
		dir := path.Dir(d.file)
		if dir == "." {
			if d.file != "kustomization.yaml" || k.Kind != "Kustomization" {
				t.Errorf("%s: want the base Kustomization in kustomization.yaml", d)
			}
			base = k
		} else if k.Kind != "Component" || !strings.HasPrefix(dir, "components/") || path.Base(d.file) != "kustomization.yaml" {
			t.Errorf("%s: a kustomization below the base must be a Component in components/NAME/kustomization.yaml", d)
		}
		listed[d.file] = true
		for _, r := range k.Resources {
			p := path.Join(dir, r)
			if fi, err := os.Stat(filepath.Join(k8sDir, filepath.FromSlash(p))); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("%s: resource %s: not a file under %s (%v)", d, r, k8sDir, err)
			}
			listed[p] = true
		}
		for _, p := range k.Patches {
			if p.Path == "" {
				continue
			}
			f := path.Join(dir, p.Path)
			if !slices.Contains(m.files, f) {
				t.Errorf("%s: patch %s: no such manifest", d, p.Path)
			}
			listed[f] = true
		}
	}
	if base == nil {
		t.Fatal("no kustomization.yaml")
	}
	if base.Namespace != "fluxkv" {
		t.Errorf("kustomization.yaml: namespace %q, want fluxkv", base.Namespace)
	}
	if len(base.Components) != 0 {
		t.Errorf("kustomization.yaml: components %v: components are opt-in, from an overlay", base.Components)
	}
	for _, f := range m.files {
		why, excluded := k8sExcluded[f]
		switch {
		case listed[f] && excluded:
			t.Errorf("%s is listed in a kustomization and excluded (%s)", f, why)
		case !listed[f] && !excluded:
			t.Errorf("%s is in no kustomization: list it, or add it to k8sExcluded with the reason", f)
		}
	}
	for f := range k8sExcluded {
		if !slices.Contains(m.files, f) {
			t.Errorf("k8sExcluded names %s, which does not exist", f)
		}
	}
	images := map[string]bool{}
	for _, im := range base.Images {
		images[im.Name] = true
	}
	for _, pod := range k8sPods(m) {
		for _, c := range append(slices.Clone(pod.spec.InitContainers), pod.spec.Containers...) {
			name, _, _ := strings.Cut(c.Image, ":")
			if !images[name] {
				t.Errorf("%s container %s: image %s has no images: entry in kustomization.yaml", pod.what, c.Name, c.Image)
			}
		}
	}
}

// TestK8sKustomizeBuild builds the base and each component with `kubectl kustomize`
// (where kubectl is installed) and checks what comes out.
func TestK8sKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed: the kustomizations are checked as files only")
	}
	m := k8sLoad(t)
	build := func(t *testing.T, dir string) *k8sManifests {
		t.Helper()
		out, err := exec.Command(kubectl, "kustomize", dir).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, ee.Stderr)
			}
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		docs, err := k8sDecodeFile("kustomize output", out)
		if err != nil {
			t.Fatal(err)
		}
		return &k8sManifests{docs: docs}
	}
	ids := func(docs []*k8sDoc) []string {
		var s []string
		for _, d := range docs {
			s = append(s, d.gvk+" "+d.name())
		}
		slices.Sort(s)
		return s
	}
	// overlay builds the base with one component, from an overlay in a temporary
	// directory (kustomize refuses absolute paths: it is given relative ones).
	overlay := func(t *testing.T, component string) *k8sManifests {
		t.Helper()
		dir := t.TempDir()
		abs, err := filepath.Abs(k8sDir)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(dir, abs)
		if err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n",
			filepath.ToSlash(rel), filepath.ToSlash(filepath.Join(rel, "components", component)))
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		return build(t, dir)
	}

	var want []*k8sDoc
	for _, d := range m.objects() {
		if path.Dir(d.file) == "." && k8sExcluded[d.file] == "" {
			want = append(want, d)
		}
	}
	base := build(t, k8sDir)
	if got, w := ids(base.docs), ids(want); !slices.Equal(got, w) {
		t.Fatalf("kubectl kustomize %s gives\n%s\nwant the objects of the listed files\n%s", k8sDir, strings.Join(got, "\n"), strings.Join(w, "\n"))
	}
	_, owner := k8sWorkloads(t, base)
	if owner.c.Image != "fluxkv:latest" {
		t.Errorf("built owner image %q, want fluxkv:latest (kustomization.yaml images:)", owner.c.Image)
	}

	t.Run("servicemonitor", func(t *testing.T) {
		b := overlay(t, "servicemonitor")
		if len(k8sAll[k8sServiceMonitor](b)) != 1 || len(b.docs) != len(base.docs)+1 {
			t.Errorf("want the base and one ServiceMonitor, got %v", ids(b.docs))
		}
	})
	t.Run("io-uring", func(t *testing.T) {
		b := overlay(t, "io-uring")
		_, o := k8sWorkloads(t, b)
		sp := o.c.SecurityContext.SeccompProfile
		if sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost || sp.LocalhostProfile == nil || *sp.LocalhostProfile == "" {
			t.Errorf("owner container seccomp %+v, want a Localhost profile", sp)
		}
		if o.pod.spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("the pod's seccomp profile changed too: %+v", o.pod.spec.SecurityContext.SeccompProfile)
		}
	})
	t.Run("host-network", func(t *testing.T) {
		b := overlay(t, "host-network")
		_, o := k8sWorkloads(t, b)
		if !o.pod.spec.HostNetwork || o.pod.spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("owner hostNetwork %v dnsPolicy %q, want true and ClusterFirstWithHostNet", o.pod.spec.HostNetwork, o.pod.spec.DNSPolicy)
		}
		if n := len(k8sAll[networkingv1.NetworkPolicy](b)); n != 0 {
			t.Errorf("%d NetworkPolicies left: their pod selectors do not match the owners' node addresses", n)
		}
	})
	for _, d := range m.kustomizations() {
		if c, ok := strings.CutPrefix(path.Dir(d.file), "components/"); ok && !slices.Contains([]string{"servicemonitor", "io-uring", "host-network"}, c) {
			t.Run(c, func(t *testing.T) { overlay(t, c) })
		}
	}
}

// TestK8sConfigMaps: every config file a ConfigMap holds loads with fluxkv's loader for
// the role its name says, and the etcd endpoints are valid for both roles.
func TestK8sConfigMaps(t *testing.T) {
	m := k8sLoad(t)
	n := 0
	for _, cm := range k8sAll[corev1.ConfigMap](m) {
		for key, text := range cm.Data {
			if !strings.HasSuffix(key, ".yaml") {
				continue
			}
			role, ok := map[string]config.Role{"master.yaml": config.RoleMaster, "owner.yaml": config.RoleOwner, "up.yaml": config.RoleUp}[key]
			if !ok {
				t.Errorf("ConfigMap %s: key %s: name it master.yaml, owner.yaml or up.yaml (the role it configures)", cm.Name, key)
				continue
			}
			f := filepath.Join(t.TempDir(), key)
			if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := config.Load(f, role); err != nil {
				t.Errorf("ConfigMap %s: %v", cm.Name, err)
			}
			n++
		}
	}
	if n < 2 {
		t.Errorf("%d config files in ConfigMaps, want master.yaml and owner.yaml", n)
	}

	master, owner := k8sWorkloads(t, m)
	// One value for both roles, from the ConfigMap fluxkv-etcd.
	etcdVar := func(r *k8sRole, flag, format string) {
		t.Helper()
		raw := r.raw[flag]
		if len(raw) != 1 {
			t.Fatalf("%s: want one --%s, got %q", r.pod.what, flag, raw)
		}
		if raw[0] != fmt.Sprintf(format, "$(ETCD_ENDPOINTS)") {
			t.Fatalf("%s: --%s %q, want %q", r.pod.what, flag, raw[0], fmt.Sprintf(format, "$(ETCD_ENDPOINTS)"))
		}
		for _, e := range r.c.Env {
			if e.Name == "ETCD_ENDPOINTS" {
				if ref := e.ValueFrom; ref == nil || ref.ConfigMapKeyRef == nil || ref.ConfigMapKeyRef.Name != "fluxkv-etcd" || ref.ConfigMapKeyRef.Key != "endpoints" {
					t.Errorf("%s: ETCD_ENDPOINTS must come from ConfigMap fluxkv-etcd, key endpoints (the one place to set)", r.pod.what)
				}
			}
		}
	}
	etcdVar(master, "etcd-endpoints", "%s")
	etcdVar(owner, "master", "etcd://%s")
	for _, e := range strings.Split(master.flag("etcd-endpoints"), ",") {
		if err := config.CheckEtcdEndpoint(strings.TrimSpace(e)); err != nil {
			t.Errorf("ConfigMap fluxkv-etcd endpoints: %v", err)
		}
		if strings.Contains(e, "://") {
			t.Errorf("ConfigMap fluxkv-etcd endpoints: %q: the owners' etcd:// address takes host:port only", e)
		}
	}
	if err := config.CheckMaster(owner.flag("master")); err != nil {
		t.Errorf("owner --master: %v", err)
	}
}

// TestK8sFlags: every flag in the containers' args is one the fluxkv subcommand has
// (its --help), so a misspelled flag fails here, not at the pod's start.
func TestK8sFlags(t *testing.T) {
	m := k8sLoad(t)
	bin := fluxkvBin(t)
	master, owner := k8sWorkloads(t, m)
	ex, _ := k8sExample(t, m)
	client := k8sFluxkvRole(t, m, k8sPodTemplate{"Pod " + ex.Name, ex.ObjectMeta, &ex.Spec}, ex.Spec.Containers[0].Name)
	flagRE, gapRE := regexp.MustCompile(`--([a-z0-9-]+)`), regexp.MustCompile(`\s{2,}`)
	for _, r := range []*k8sRole{master, owner, client} {
		out, err := exec.Command(bin, r.cmd, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("fluxkv %s --help: %v\n%s", r.cmd, err, out)
		}
		// The flags and their aliases: the first column of each option line
		// ("   --listen value, --master-listen value   master TCP address ..."), not
		// the flags that usage texts mention.
		known := map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			spec := gapRE.Split(strings.TrimSpace(line), 2)[0]
			if !strings.HasPrefix(spec, "-") {
				continue
			}
			for _, mm := range flagRE.FindAllStringSubmatch(spec, -1) {
				known[mm[1]] = true
			}
		}
		for name := range r.raw {
			if !known[name] {
				t.Errorf("%s: fluxkv %s has no flag --%s", r.pod.what, r.cmd, name)
			}
		}
	}
}

// TestK8sSocketWiring: the owner serves its socket in a hostPath directory, the example
// pod mounts the same host directory at the same path inside its container (the owner
// announces its RPC socket by absolute path) and its client dials exactly that socket;
// the pod's groups include the socket's group; both land on the same nodes.
func TestK8sSocketWiring(t *testing.T) {
	m := k8sLoad(t)
	_, owner := k8sWorkloads(t, m)
	dir := owner.setting(owner.file.Owner.SocketDir, "dir", "socket-dir")
	if dir == "" || !path.IsAbs(dir) {
		t.Fatalf("owner socket_dir %q: want an absolute path", dir)
	}
	sock := path.Join(dir, wire.SocketName)
	vm, rel, ok := k8sMountOf(owner.c, dir)
	if !ok {
		t.Fatalf("owner socket_dir %s is on no volume", dir)
	}
	v := k8sVolume(owner.pod.spec, vm.Name)
	if v == nil || v.HostPath == nil {
		t.Fatalf("owner socket_dir %s: volume %s is not a hostPath (the inference pods of the node share it)", dir, vm.Name)
	}
	if v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("owner hostPath %s: type %v, want DirectoryOrCreate", v.HostPath.Path, v.HostPath.Type)
	}
	if vm.ReadOnly {
		t.Errorf("owner mount %s is read-only: the owner creates its sockets there", vm.MountPath)
	}
	hostSock := path.Join(v.HostPath.Path, rel, wire.SocketName)

	pod, c := k8sExample(t, m)
	client := k8sFluxkvRole(t, m, k8sPodTemplate{"Pod " + pod.Name, pod.ObjectMeta, &pod.Spec}, c.Name)
	env := client.env["FLUXKV_SOCKET"]
	if env != sock {
		t.Errorf("example pod: FLUXKV_SOCKET %q, want the owner's socket %s", env, sock)
	}
	if s := client.flag("socket"); s != "" && s != sock {
		t.Errorf("example pod: --socket %q, want the owner's socket %s", s, sock)
	}
	cvm, crel, ok := k8sMountOf(c, env)
	if !ok {
		t.Fatalf("example pod: %s is on no volume", env)
	}
	cv := k8sVolume(&pod.Spec, cvm.Name)
	if cv == nil || cv.HostPath == nil {
		t.Fatalf("example pod: %s: volume %s is not a hostPath", env, cvm.Name)
	}
	if got := path.Join(cv.HostPath.Path, crel); got != hostSock {
		t.Errorf("example pod dials host path %s, the owner serves %s", got, hostSock)
	}
	if cvm.MountPath != vm.MountPath {
		t.Errorf("example pod mounts the socket directory at %s, the owner at %s: the RPC socket the owner announces (%s) would not exist in the client",
			cvm.MountPath, vm.MountPath, wire.RPCSocketPath(sock))
	}
	if !cvm.ReadOnly {
		t.Errorf("example pod: mount %s is writable; read-only suffices to connect and keeps the pod from replacing the owner's socket", cvm.MountPath)
	}

	// Who may attach: the socket is 0660 in the owner's group (its runAsGroup).
	ownerUID, ownerGID := k8sRunAs(owner.pod.spec, owner.c)
	if ownerGID == nil {
		t.Fatal("owner: no runAsGroup: the socket's group would be the image's")
	}
	uid, gid := k8sRunAs(&pod.Spec, c)
	var groups []int64
	if pod.Spec.SecurityContext != nil {
		groups = pod.Spec.SecurityContext.SupplementalGroups
	}
	if (gid == nil || *gid != *ownerGID) && !slices.Contains(groups, *ownerGID) {
		t.Errorf("example pod: groups %v / runAsGroup %v lack the socket's group %d (the owner's runAsGroup)", groups, k8sShow(gid), *ownerGID)
	}
	if uid != nil && ownerUID != nil && *uid == *ownerUID {
		t.Errorf("example pod runs as the owner's uid %d: it would be admitted as the owner, not by group", *uid)
	}
	for k, v := range owner.pod.spec.NodeSelector {
		if pod.Spec.NodeSelector[k] != v {
			t.Errorf("example pod: nodeSelector %v lacks the owners' %s=%s: it may land on a node without an owner", pod.Spec.NodeSelector, k, v)
		}
	}
}

// k8sShow prints an optional field: its value, or "unset".
func k8sShow[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// k8sRunAs is the container's effective uid and gid (the container's over the pod's).
func k8sRunAs(spec *corev1.PodSpec, c *corev1.Container) (uid, gid *int64) {
	if p := spec.SecurityContext; p != nil {
		uid, gid = p.RunAsUser, p.RunAsGroup
	}
	if s := c.SecurityContext; s != nil {
		if s.RunAsUser != nil {
			uid = s.RunAsUser
		}
		if s.RunAsGroup != nil {
			gid = s.RunAsGroup
		}
	}
	return uid, gid
}

// TestK8sOwnerDirectories: everything the owner writes is a writable volume (its root
// file system is read-only), the init container hands each hostPath directory to the
// owner's uid and group, and the node identity and address come from the downward API.
func TestK8sOwnerDirectories(t *testing.T) {
	m := k8sLoad(t)
	_, owner := k8sWorkloads(t, m)
	o := owner.file.Owner
	writes := []string{owner.setting(o.SocketDir, "dir", "socket-dir")}
	paths := o.LargeFilePaths
	if v := owner.flags["large-file-paths"]; len(v) > 0 {
		paths = v
	}
	if len(paths) == 0 {
		t.Error("owner: no large_file_paths: the manifests ship the SSD tier on")
	}
	writes = append(writes, paths...)
	hostDirs := map[string]string{} // volume name → mount path
	for _, p := range writes {
		vm, _, ok := k8sMountOf(owner.c, p)
		if !ok {
			t.Errorf("owner writes %s, which is on no volume (read-only root file system)", p)
			continue
		}
		if vm.ReadOnly {
			t.Errorf("owner writes %s, on the read-only mount %s", p, vm.MountPath)
		}
		if v := k8sVolume(owner.pod.spec, vm.Name); v != nil && v.HostPath != nil {
			hostDirs[vm.Name] = vm.MountPath
		}
	}
	var init *corev1.Container
	for i := range owner.pod.spec.InitContainers {
		if owner.pod.spec.InitContainers[i].Name == "prepare-dirs" {
			init = &owner.pod.spec.InitContainers[i]
		}
	}
	if init == nil {
		t.Fatal("owner: no init container prepare-dirs (kubelet creates hostPath directories root:root 0755)")
	}
	uid, gid := k8sRunAs(owner.pod.spec, owner.c)
	env := k8sEnv(t, m, init)
	if uid == nil || gid == nil || env["FLUXKV_UID"] != strconv.FormatInt(*uid, 10) || env["FLUXKV_GID"] != strconv.FormatInt(*gid, 10) {
		t.Errorf("prepare-dirs: FLUXKV_UID %q FLUXKV_GID %q, want the owner's runAsUser %v and runAsGroup %v", env["FLUXKV_UID"], env["FLUXKV_GID"], k8sShow(uid), k8sShow(gid))
	}
	script := strings.Join(append(slices.Clone(init.Command), init.Args...), " ")
	for _, want := range []string{"$FLUXKV_UID", "$FLUXKV_GID"} {
		if !strings.Contains(script, want) {
			t.Errorf("prepare-dirs does not use %s", want)
		}
	}
	for name, mp := range hostDirs {
		ivm, _, ok := k8sMountOf(init, mp)
		if !ok || ivm.Name != name || ivm.MountPath != mp {
			t.Errorf("prepare-dirs does not mount volume %s at %s", name, mp)
		}
		if !strings.Contains(script, mp) {
			t.Errorf("prepare-dirs does not prepare %s", mp)
		}
	}

	for flag, field := range map[string]string{"node-id": "spec.nodeName", "advertise-host": "status.podIP"} {
		raw := owner.raw[flag]
		if len(raw) != 1 || !k8sVarRef.MatchString(raw[0]) || k8sVarRef.FindStringSubmatch(raw[0])[0] != raw[0] {
			t.Errorf("owner: --%s %q, want $(VAR) from the downward API %s", flag, raw, field)
			continue
		}
		name := k8sVarRef.FindStringSubmatch(raw[0])[1]
		for _, e := range owner.c.Env {
			if e.Name == name && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field) {
				t.Errorf("owner: env %s (--%s) must be the field %s", name, flag, field)
			}
		}
	}
	if err := wire.ValidateNodeID(owner.flag("node-id")); err != nil {
		t.Errorf("owner --node-id: %v", err)
	}
	if err := config.CheckHost(owner.flag("advertise-host")); err != nil {
		t.Errorf("owner --advertise-host: %v", err)
	}
}

// k8sPort is the port number of a host:port.
func k8sPort(t *testing.T, what, addr string) int32 {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 || n > 65535 {
		t.Fatalf("%s %q: want a fixed port (the container port and Services name it)", what, addr)
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		t.Errorf("%s %q: loopback: nothing outside the pod (kubelet's probes, other pods) reaches it", what, addr)
	}
	return int32(n)
}

// k8sContainerPort is the named port of c.
func k8sContainerPort(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				t.Errorf("container %s port %s: protocol %s, want TCP", c.Name, name, p.Protocol)
			}
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}

// TestK8sPorts: the container ports are the listen ports of the flags and config, the
// advertised master address has the listen port, and the probes, scrape annotations,
// Services, NetworkPolicies and ServiceMonitor name those ports.
func TestK8sPorts(t *testing.T) {
	m := k8sLoad(t)
	master, owner := k8sWorkloads(t, m)
	mf, of := master.file.Master, owner.file.Owner
	listen := k8sPort(t, "master listen", master.setting(mf.Listen, "listen", "master-listen"))
	want := map[*k8sRole]map[string]int32{
		master: {
			"master":  listen,
			"metrics": k8sPort(t, "master metrics_addr", master.setting(mf.MetricsAddr, "metrics-addr")),
		},
		owner: {
			"peer":    k8sPort(t, "owner peer_listen", owner.setting(of.PeerListen, "peer-listen")),
			"data":    k8sPort(t, "owner data_listen", owner.setting(of.DataListen, "data-listen")),
			"metrics": k8sPort(t, "owner metrics_addr", owner.setting(of.MetricsAddr, "metrics-addr")),
		},
	}
	if adv := master.flag("advertise-addr"); k8sPort(t, "master --advertise-addr", adv) != listen {
		t.Errorf("master --advertise-addr %s: its port is not master.listen's %d", adv, listen)
	} else if err := config.CheckAdvertiseAddr(adv); err != nil {
		t.Errorf("master --advertise-addr: %v", err)
	}
	if raw := master.raw["advertise-addr"]; len(raw) != 1 || !strings.HasPrefix(raw[0], "$(POD_IP):") {
		t.Errorf("master --advertise-addr %q, want $(POD_IP):PORT (the pod IP owners dial)", raw)
	}
	for r, ports := range want {
		if len(r.c.Ports) != len(ports) {
			t.Errorf("%s: container ports %v, want exactly %v", r.pod.what, r.c.Ports, ports)
		}
		for name, n := range ports {
			if got := k8sContainerPort(t, r.c, name); got != n {
				t.Errorf("%s: container port %s = %d, but fluxkv listens on %d", r.pod.what, name, got, n)
			}
		}
		metrics := ports["metrics"]
		for what, p := range map[string]*corev1.Probe{"livenessProbe": r.c.LivenessProbe, "readinessProbe": r.c.ReadinessProbe} {
			path := map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"}[what]
			if p == nil || p.HTTPGet == nil {
				t.Errorf("%s: no httpGet %s", r.pod.what, what)
				continue
			}
			if p.HTTPGet.Path != path || k8sResolvePort(t, r.c, p.HTTPGet.Port) != metrics {
				t.Errorf("%s: %s GET %s on port %s, want %s on the metrics port %d", r.pod.what, what, p.HTTPGet.Path, p.HTTPGet.Port.String(), path, metrics)
			}
		}
		a := r.pod.meta.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(metrics)) || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("%s: scrape annotations %v, want scrape true, port %d, path /metrics", r.pod.what, a, metrics)
		}
	}

	// Every Service selects pods of one role and forwards each port to a container port
	// of the same number.
	for _, s := range k8sAll[corev1.Service](m) {
		var target *k8sRole
		for _, r := range []*k8sRole{master, owner} {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(r.pod.meta.Labels)) {
				target = r
			}
		}
		if len(s.Spec.Selector) == 0 || target == nil {
			t.Errorf("Service %s: selector %v matches neither the masters nor the owners", s.Name, s.Spec.Selector)
			continue
		}
		for _, p := range s.Spec.Ports {
			if got := k8sResolvePort(t, target.c, p.TargetPort); got != p.Port {
				t.Errorf("Service %s port %s: port %d forwards to %d", s.Name, p.Name, p.Port, got)
			}
		}
	}
	// Every NetworkPolicy port is a port of the pods it selects.
	for _, np := range k8sAll[networkingv1.NetworkPolicy](m) {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		var target *k8sRole
		for _, r := range []*k8sRole{master, owner} {
			if sel.Matches(labels.Set(r.pod.meta.Labels)) {
				target = r
			}
		}
		if target == nil {
			t.Errorf("NetworkPolicy %s selects neither the masters nor the owners", np.Name)
			continue
		}
		covered := map[int32]bool{}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil {
					t.Errorf("NetworkPolicy %s: a rule for every port", np.Name)
					continue
				}
				covered[k8sResolvePort(t, target.c, *p.Port)] = true
			}
		}
		for _, cp := range target.c.Ports {
			if !covered[cp.ContainerPort] {
				t.Errorf("NetworkPolicy %s: no ingress rule for %s port %s: it would be closed", np.Name, target.pod.what, cp.Name)
			}
		}
	}
	// The ServiceMonitor (a component) scrapes the metrics port of both Services.
	smDocs, err := k8sDecodeFile("servicemonitor.yaml", k8sRead(t, "components/servicemonitor/servicemonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sm := smDocs[0].obj.(*k8sServiceMonitor)
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	// Without jobLabel the operator names each target's job after its Service:
	// fluxkv-master and fluxkv-owner, the jobs deploy/prometheus/fluxkv-rules.yaml names.
	if sm.Spec.JobLabel != "" {
		t.Errorf("ServiceMonitor: jobLabel %q renames the jobs the alert rules name (fluxkv-master, fluxkv-owner)", sm.Spec.JobLabel)
	}
	if !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, "fluxkv") {
		t.Errorf("ServiceMonitor: namespaceSelector %v lacks fluxkv", sm.Spec.NamespaceSelector)
	}
	for _, name := range []string{"fluxkv-master", "fluxkv-owner"} {
		s := k8sGet[corev1.Service](t, m, name)
		if !sel.Matches(labels.Set(s.Labels)) {
			t.Errorf("ServiceMonitor selector %v misses Service %s", sm.Spec.Selector, name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				t.Errorf("ServiceMonitor endpoint port %q: Service %s has no such port", ep.Port, name)
			}
			if ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoint path %q, want /metrics", ep.Path)
			}
		}
		if !s.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s: publishNotReadyAddresses false: a not-ready pod (when its metrics matter) would not be scraped", name)
		}
	}
	// The PodDisruptionBudget keeps a master.
	pdb := k8sGet[policyv1.PodDisruptionBudget](t, m, "fluxkv-master")
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(labels.Set(master.pod.meta.Labels)) {
		t.Errorf("PodDisruptionBudget fluxkv-master does not select the masters")
	}
}

// k8sResolvePort is the number of a port given by number or by a container port's name.
func k8sResolvePort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	return k8sContainerPort(t, c, p.StrVal)
}

func k8sRead(t *testing.T, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(k8sDir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestK8sSecurity: every pod runs as a fixed non-root uid (the owner's init container as
// root with CAP_CHOWN only), with a read-only root file system, no privilege escalation,
// every capability dropped, RuntimeDefault seccomp, none of the node's namespaces and no
// service account token; the masters spread over nodes.
func TestK8sSecurity(t *testing.T) {
	m := k8sLoad(t)
	pods := k8sPods(m)
	if len(pods) < 3 {
		t.Fatalf("%d pod templates, want the masters, the owners and the example", len(pods))
	}
	for _, pod := range pods {
		s := pod.spec
		if s.HostNetwork || s.HostPID || s.HostIPC {
			t.Errorf("%s: hostNetwork %v hostPID %v hostIPC %v, want none (components/host-network opts the owners in)", pod.what, s.HostNetwork, s.HostPID, s.HostIPC)
		}
		if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
			t.Errorf("%s: automountServiceAccountToken not false: nothing here calls the Kubernetes API", pod.what)
		}
		if s.SecurityContext == nil {
			t.Errorf("%s: no pod securityContext", pod.what)
			continue
		}
		if s.SecurityContext.SeccompProfile == nil || s.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod seccompProfile not RuntimeDefault", pod.what)
		}
		check := func(c *corev1.Container, init bool) {
			what := fmt.Sprintf("%s container %s", pod.what, c.Name)
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", what)
				return
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged", what)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation not false", what)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: readOnlyRootFilesystem not true", what)
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("%s: capabilities.drop %v, want [ALL]", what, sc.Capabilities)
			}
			var add []corev1.Capability
			if sc.Capabilities != nil {
				add = sc.Capabilities.Add
			}
			if sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: seccompProfile %s (components/io-uring opts the owner in)", what, sc.SeccompProfile.Type)
			}
			uid, _ := k8sRunAs(s, c)
			nonRoot := s.SecurityContext.RunAsNonRoot
			if sc.RunAsNonRoot != nil {
				nonRoot = sc.RunAsNonRoot
			}
			if init {
				// chown of the hostPath directories: root, CAP_CHOWN alone.
				if uid == nil || *uid != 0 || !slices.Equal(add, []corev1.Capability{"CHOWN"}) {
					t.Errorf("%s: runAsUser %v, capabilities.add %v: want root with CHOWN only", what, k8sShow(uid), add)
				}
				return
			}
			if len(add) != 0 {
				t.Errorf("%s: capabilities.add %v: memfd, mmap and O_DIRECT need none", what, add)
			}
			if uid == nil || *uid == 0 || nonRoot == nil || !*nonRoot {
				t.Errorf("%s: runAsUser %v runAsNonRoot %v, want a fixed non-root uid", what, k8sShow(uid), k8sShow(nonRoot))
			}
			if c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s: no memory limit", what)
			}
		}
		for i := range s.InitContainers {
			check(&s.InitContainers[i], true)
		}
		for i := range s.Containers {
			check(&s.Containers[i], false)
		}
		for _, c := range append(slices.Clone(s.InitContainers), s.Containers...) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					t.Errorf("%s container %s: env %s from a Secret: fluxkv reads its secrets from files (0600), not the environment", pod.what, c.Name, e.Name)
				}
			}
		}
	}
	d := k8sGet[appsv1.Deployment](t, m, "fluxkv-master")
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("Deployment fluxkv-master: replicas %v, want 2 (one leads, one stands by)", k8sShow(d.Spec.Replicas))
	}
	aff := d.Spec.Template.Spec.Affinity
	spread := aff != nil && aff.PodAntiAffinity != nil &&
		(slices.ContainsFunc(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, func(w corev1.WeightedPodAffinityTerm) bool {
			return w.PodAffinityTerm.TopologyKey == corev1.LabelHostname
		}) || slices.ContainsFunc(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, func(a corev1.PodAffinityTerm) bool {
			return a.TopologyKey == corev1.LabelHostname
		}))
	if !spread {
		t.Error("Deployment fluxkv-master: no pod anti-affinity across hosts")
	}
}

// TestK8sSecrets: the secret volumes are private (no group or other bits in defaultMode
// or any item's mode: kubelet adds group read for fsGroup, which fluxkv accepts for a
// group the process is in), every secret file the config names is a key of a mounted
// Secret, the owners never get the master's private key, and docs/kubernetes.md says how
// to create each Secret.
func TestK8sSecrets(t *testing.T) {
	m := k8sLoad(t)
	for _, pod := range k8sPods(m) {
		for _, v := range pod.spec.Volumes {
			var modes []*int32
			switch {
			case v.Secret != nil:
				modes = append(modes, v.Secret.DefaultMode)
				for _, it := range v.Secret.Items {
					modes = append(modes, it.Mode)
				}
			case v.Projected != nil:
				modes = append(modes, v.Projected.DefaultMode)
				for _, s := range v.Projected.Sources {
					if s.Secret != nil {
						for _, it := range s.Secret.Items {
							modes = append(modes, it.Mode)
						}
					}
				}
			default:
				continue
			}
			if modes[0] == nil {
				t.Errorf("%s volume %s: no defaultMode (the default 0644 lets anyone read the secret)", pod.what, v.Name)
			}
			for _, mode := range modes {
				if mode != nil && *mode&0o077 != 0 {
					t.Errorf("%s volume %s: mode %04o has group or other bits", pod.what, v.Name, *mode)
				}
			}
		}
	}

	master, owner := k8sWorkloads(t, m)
	mf, of := master.file.Master, owner.file.Owner
	list := func(r *k8sRole, flag string, file []string) []string {
		if v := r.flags[flag]; len(v) > 0 {
			return v
		}
		return file
	}
	need := map[*k8sRole][]string{
		master: append(list(master, "cluster-secret-file", mf.ClusterSecretFiles), master.setting(mf.MasterKeyFile, "master-key-file")),
		owner:  append(list(owner, "cluster-secret-file", of.ClusterSecretFiles), list(owner, "master-pubkey-file", of.MasterPubKeyFiles)...),
	}
	secrets := map[string][]string{} // Secret name → keys used
	for r, files := range need {
		if len(files) < 2 || slices.Contains(files, "") {
			t.Errorf("%s: secret files %q: want the cluster secret and the master key (master) or public key (owner)", r.pod.what, files)
		}
		for _, f := range files {
			name, key := k8sSecretAt(t, r, f)
			if name == "" {
				continue
			}
			secrets[name] = append(secrets[name], key)
			if r == owner && strings.HasSuffix(key, ".key") {
				t.Errorf("%s: mounts the master's private key (%s/%s): owners get master.pub only", r.pod.what, name, key)
			}
		}
	}
	docs := string(k8sReadDoc(t))
	for name, keys := range secrets {
		for _, key := range keys {
			if !regexp.MustCompile(`create secret generic ` + regexp.QuoteMeta(name) + `\b[^\n]*--from-file=` + regexp.QuoteMeta(key) + `=`).MatchString(docs) {
				t.Errorf("docs/kubernetes.md: no `kubectl create secret generic %s ... --from-file=%s=...`", name, key)
			}
		}
	}
}

// k8sSecretAt is the Secret and key mounted at the file path p in r's container.
func k8sSecretAt(t *testing.T, r *k8sRole, p string) (name, key string) {
	t.Helper()
	vm, rel, ok := k8sMountOf(r.c, p)
	if !ok {
		t.Errorf("%s: secret file %s is on no volume", r.pod.what, p)
		return "", ""
	}
	v := k8sVolume(r.pod.spec, vm.Name)
	var sources []*corev1.SecretProjection
	switch {
	case v != nil && v.Secret != nil:
		sources = []*corev1.SecretProjection{{LocalObjectReference: corev1.LocalObjectReference{Name: v.Secret.SecretName}, Items: v.Secret.Items}}
	case v != nil && v.Projected != nil:
		for _, s := range v.Projected.Sources {
			if s.Secret != nil {
				sources = append(sources, s.Secret)
			}
		}
	default:
		t.Errorf("%s: secret file %s: volume %s is not a Secret", r.pod.what, p, vm.Name)
		return "", ""
	}
	for _, s := range sources {
		for _, it := range s.Items {
			if it.Path == rel {
				return s.Name, it.Key
			}
		}
	}
	t.Errorf("%s: secret file %s: no item of volume %s has path %s (list items: a Secret's other keys must not appear)", r.pod.what, p, vm.Name, rel)
	return "", ""
}

func k8sReadDoc(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestK8sOwnerResources: the memory limit covers the owner's segment plus its own
// memory, with request = limit; the grace period covers the owner's stop (the systemd
// units' TimeoutStopSec), and an update never runs two owners on one node.
func TestK8sOwnerResources(t *testing.T) {
	m := k8sLoad(t)
	master, owner := k8sWorkloads(t, m)
	of := owner.file.Owner
	dram := of.DRAM
	if v := owner.flag("dram"); v != "" {
		n, err := ssd.ParseSize(v)
		if err != nil {
			t.Fatalf("owner --dram: %v", err)
		}
		dram = n
	}
	if dram <= 0 {
		t.Fatal("owner: no dram in owner.yaml or --dram: the default (1GiB) would not match the memory limit by intent")
	}
	frame := of.FrameMemory
	if v := owner.flag("frame-memory"); v != "" {
		n, err := ssd.ParseSize(v)
		if err != nil {
			t.Fatalf("owner --frame-memory: %v", err)
		}
		frame = n
	}
	if frame == 0 { // the daemon's default: an eighth of the segment, at least 64 MiB
		frame = max(dram/8, 64<<20)
	}
	// The segment, request frames in progress (which the Go heap may hold twice over,
	// README "Frame memory"), and half a GiB for the rest of the process.
	peer := max(frame/4, 64<<20) // the peer port's own frame budget
	need := dram + 2*(frame+peer) + 512<<20
	res := owner.c.Resources
	limit, request := res.Limits.Memory(), res.Requests.Memory()
	if limit.Value() < need {
		t.Errorf("owner memory limit %s < dram %s + 2 x (frame memory %s + the peer port's %s) + 512Mi = %s: the segment is charged to the pod's memory cgroup",
			limit, resource.NewQuantity(dram, resource.BinarySI), resource.NewQuantity(frame, resource.BinarySI),
			resource.NewQuantity(peer, resource.BinarySI), resource.NewQuantity(need, resource.BinarySI))
	}
	if request.Cmp(*limit) != 0 {
		t.Errorf("owner memory request %s != limit %s: the scheduler would not reserve what the owner holds", request, limit)
	}

	for r, unit := range map[*k8sRole]string{master: "fluxkv-master.service", owner: "fluxkv-owner.service"} {
		bound := k8sStopTimeout(t, filepath.Join("..", "scripts", unit))
		g := r.pod.spec.TerminationGracePeriodSeconds
		if g == nil || time.Duration(*g)*time.Second < bound {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want at least %v (TimeoutStopSec of scripts/%s)", r.pod.what, k8sShow(g), bound, unit)
		}
	}
	ds := k8sGet[appsv1.DaemonSet](t, m, "fluxkv-owner")
	if u := ds.Spec.UpdateStrategy; u.Type == appsv1.RollingUpdateDaemonSetStrategyType && u.RollingUpdate != nil && u.RollingUpdate.MaxSurge != nil && u.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Errorf("DaemonSet fluxkv-owner: maxSurge %s: two owners on one node would contend for its socket and node id", u.RollingUpdate.MaxSurge.String())
	}
}

// k8sStopTimeout is the TimeoutStopSec= of a systemd unit.
func k8sStopTimeout(t *testing.T, unit string) time.Duration {
	t.Helper()
	data, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	mm := regexp.MustCompile(`(?m)^TimeoutStopSec=(\S+)$`).FindSubmatch(data)
	if mm == nil {
		t.Fatalf("%s: no TimeoutStopSec=", unit)
	}
	s := string(mm[1])
	if _, err := strconv.Atoi(s); err == nil {
		s += "s"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: TimeoutStopSec=%s: %v", unit, mm[1], err)
	}
	return d
}
