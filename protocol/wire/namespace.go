package wire

import (
	"strings"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// NamespaceSeparator ends a key's namespace (protocol/external.thrift, NAMESPACE_SEPARATOR).
const NamespaceSeparator = external.NAMESPACE_SEPARATOR

// KeyNamespace is key's namespace: the text before its last NamespaceSeparator; ok is
// false for a key without one, or whose only one is its first byte (no namespace).
func KeyNamespace(key string) (ns string, ok bool) {
	i := strings.LastIndex(key, NamespaceSeparator)
	if i <= 0 {
		return "", false
	}
	return key[:i], true
}

// ValidateNamespace checks a namespace named in a call: 1..MaxKeyBytes bytes. It may
// end with NamespaceSeparator: "a//x" is in namespace "a/".
func ValidateNamespace(ns string) error {
	switch {
	case len(ns) == 0:
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "empty namespace")
	case len(ns) > MaxKeyBytes:
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "namespace of %d bytes exceeds the limit of %d", len(ns), MaxKeyBytes)
	}
	return nil
}
