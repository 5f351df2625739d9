package shm

// CreatePutArea creates one client session's put area under client isolation (docs/architecture.md
// §11): a memfd of size bytes sealed against shrink, grow and further seals, mapped
// read-write here. The owner sends its fd to the client, which maps it read-write and
// writes values into it; the owner copies them from its own mapping into the
// write-sealed segment. The shrink seal is what makes that copy safe: a client cannot
// truncate the area under the owner's mapping and turn the owner's reads into SIGBUS.
// Close it when the session ends (clients' mappings stay valid until they unmap).
func CreatePutArea(name string, size int64) (*Segment, error) {
	return CreateSegment(name, size, SegmentOptions{})
}
