package wire

// SkippedTerm reports whether an owner registering with the master of epoch now, after
// the one of epoch prev (0: none), missed the HA term that served last before now's
// (last, RegisterResponse.last_term_epoch; 0: unknown or not HA): it never registered
// with that term, which may have deleted or overwritten what it holds. The owner then
// reports nothing and forgets its replicas, and the master refuses its report whole.
// A registration with the same master again (prev == now) skipped nothing.
func SkippedTerm(prev, now, last int64) bool {
	return prev != 0 && last != 0 && prev != last && prev != now
}
