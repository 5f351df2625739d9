package metrics

import (
	"errors"
	"fmt"
	"sync"
)

// Readiness is a process's answer to /readyz when it runs several components (a
// master, an owner, both for `fluxkv up`): ready once every component named at
// creation is up and its own check passes. It is safe for concurrent use; a nil
// *Readiness is always ready.
type Readiness struct {
	mu    sync.Mutex // protects comps
	comps []component
}

type component struct {
	name  string
	state string       // "starting", "up" or "stopping"
	check func() error // asked while up; nil: none
}

// NewReadiness returns the readiness of a process that runs components, none up yet.
func NewReadiness(components ...string) *Readiness {
	r := &Readiness{}
	for _, name := range components {
		r.comps = append(r.comps, component{name: name, state: "starting"})
	}
	return r
}

// Up marks component as serving; check, when not nil, is asked at every Check from now
// on and must not block (it runs in the HTTP handler). A component not named at
// creation is added.
func (r *Readiness) Up(name string, check func() error) {
	r.setState(name, "up", check)
}

// Down marks component as no longer serving (it is stopping).
func (r *Readiness) Down(name string) {
	r.setState(name, "stopping", nil)
}

func (r *Readiness) setState(name, state string, check func() error) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.comps {
		if r.comps[i].name == name {
			r.comps[i].state, r.comps[i].check = state, check
			return
		}
	}
	r.comps = append(r.comps, component{name: name, state: state, check: check})
}

// Check returns nil when every component is up and passes its check, else why not:
// the first component, in creation order, that is starting, stopping or failing its
// check ("owner: starting", "owner: not registered with a master").
func (r *Readiness) Check() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	comps := append([]component(nil), r.comps...)
	r.mu.Unlock()
	if len(comps) == 0 {
		return errors.New("no component")
	}
	// The checks run outside the lock: they take the components' own locks.
	for _, c := range comps {
		if c.state != "up" {
			return fmt.Errorf("%s: %s", c.name, c.state)
		}
		if c.check != nil {
			if err := c.check(); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	return nil
}
