// Package wire holds what every fluxkv role shares about the wire protocol beyond the
// generated code: errors that carry an ErrorCode, request validation limits and the
// socket path conventions. Servers validate every request with these helpers
// themselves; client-side checks are a convenience only.
package wire
