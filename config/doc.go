// Package config loads the YAML files that configure fluxkv's long-running roles:
// the owner (section fluxkv_spec, the seed's fluxonkv_spec), the master (section
// master) and the single-node `up` (both sections). It only parses and validates;
// cmd/fluxkv merges the result with its flags (a flag set on the command line wins)
// and turns it into daemon and master options.
//
// The parser is strict, because a typo in a service's config should stop the
// service at start rather than silently run it with a default: an unknown key, a
// duplicated key, a value of the wrong shape or a bad size is an error that names
// the key and its line ("owner.yaml:3: fluxkv_spec.dram: invalid size "12XB": ...").
// Sizes are integers (bytes) or strings with binary units ("512MiB", "1.5GiB",
// "4GB" = 4 GiB), parsed by ssd.ParseSize; large_file_paths and large_limit_size
// follow the seed's rules through ssd.Config, except that paths without a
// large_limit_size key are refused (a forgotten key would silently run without SSD;
// large_limit_size: null stays the explicit "off"). Durations must be positive,
// counts non-negative, ports numeric; cache_grace takes a duration ≥ 0 or off, and
// hot_set a fraction 0 < x ≤ 1 of the memory pool, or 0 or off; uid_share a fraction
// 0 < x ≤ 1, or off (1).
package config
