// Package deploy holds what runs fluxkv outside a checkout: the container image
// (Containerfile, built by `make image`), the Kubernetes manifests, the Grafana dashboard
// and the Prometheus rules, and the tests that check them against the code (the ports,
// flags and metrics they name). It has no Go code of its own: this file only gives the
// tests a package.
package deploy
