package metrics

import (
	"errors"
	"testing"
)

func TestReadiness(t *testing.T) {
	r := NewReadiness("master", "owner")
	check := func(want string) {
		t.Helper()
		err := r.Check()
		switch {
		case want == "" && err != nil:
			t.Errorf("Check = %v, want ready", err)
		case want != "" && (err == nil || err.Error() != want):
			t.Errorf("Check = %v, want %q", err, want)
		}
	}
	check("master: starting")
	r.Up("master", nil)
	check("owner: starting")
	registered := false
	r.Up("owner", func() error {
		if !registered {
			return errors.New("not registered with a master")
		}
		return nil
	})
	check("owner: not registered with a master")
	registered = true
	check("")
	r.Down("owner")
	check("owner: stopping")
	r.Down("master")
	check("master: stopping") // the first component in creation order

	var none *Readiness
	if err := none.Check(); err != nil {
		t.Errorf("nil Readiness: %v, want ready", err)
	}
	none.Up("x", nil)
	none.Down("x")
}
