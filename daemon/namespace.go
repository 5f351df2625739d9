package daemon

import (
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Namespaces (protocol/external.thrift NAMESPACE_SEPARATOR): the master indexes the
// keys of each namespace, so the owner only forwards. A namespace delete is one
// NamespaceDelete call per mp.BATCH keys. This owner learns no key from the answers:
// the master invalidates it, as it does every owner that may hold a deleted version,
// before it answers each call, so its hot set, replica index and SSD entries of those
// keys are gone by then (st.invalidate, as for a delete), a lost answer included.

// deleteNamespace deletes every key of namespace name; it returns how many existed.
// On an error, the count is of the keys deleted before it.
func (o *Owner) deleteNamespace(name string) (int64, error) {
	if err := wire.ValidateNamespace(name); err != nil {
		return 0, err
	}
	var deleted int64
	// After the first answer, the keys it left take left/BATCH calls, one more for slack:
	// keys put meanwhile may survive, and a stream of puts never keeps this looping.
	for call, calls := int64(0), int64(1); call < calls; call++ {
		ctx, cancel := o.master.ctx()
		resp, err := o.master.cl().NamespaceDelete(ctx, &mp.NamespaceRequest{Node: o.master.ref(), Name: name})
		cancel()
		if err := o.master.check(respCode(resp, err)); err != nil {
			return deleted, err
		}
		deleted += resp.Deleted
		if resp.Left <= 0 {
			break
		}
		if call == 0 {
			calls = 2 + (resp.Left+int64(mp.BATCH)-1)/int64(mp.BATCH)
		}
	}
	return deleted, nil
}

// namespaceStat is the master's count of namespace name's keys and their bytes.
func (o *Owner) namespaceStat(name string) (keys, bytes int64, err error) {
	if err := wire.ValidateNamespace(name); err != nil {
		return 0, 0, err
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().NamespaceStat(ctx, &mp.NamespaceRequest{Node: o.master.ref(), Name: name})
	if err := o.master.check(respCode(resp, err)); err != nil {
		return 0, 0, err
	}
	return resp.Keys, resp.Bytes, nil
}
