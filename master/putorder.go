package master

// A key's put_id never moves backwards (docs/architecture.md §5): owners drop cached,
// indexed and SSD versions of a key "up to" a put_id. A put started before a later put of
// its key and done after that later version's route was dropped (deleted, evicted) found
// no route to compare with and was published under the lower id, while its owners had
// been told to drop everything up to the higher one: they forgot the copies the master
// went on routing to (a review). The master remembers, per key with puts in flight, the
// highest put_id whose route was dropped, and publishes no put below it.

// addPutLocked records in-flight put id of key.
func (s *State) addPutLocked(id int64, p *inflightPut) {
	s.puts[id] = p
	s.putsOfKey[p.key]++
}

// forgetPutLocked drops in-flight put id of p.key from the records (its ranges are the
// caller's to free); with the key's last put in flight goes its dropped put_id.
func (s *State) forgetPutLocked(id int64, p *inflightPut) {
	delete(s.puts, id)
	if n := s.putsOfKey[p.key] - 1; n > 0 {
		s.putsOfKey[p.key] = n
	} else {
		delete(s.putsOfKey, p.key)
		delete(s.droppedPutID, p.key)
	}
}

// routeDroppedLocked notes that key's route of put_id putID is gone, for the puts of key
// in flight.
func (s *State) routeDroppedLocked(key string, putID int64) {
	if s.putsOfKey[key] > 0 {
		s.droppedPutID[key] = max(s.droppedPutID[key], putID)
	}
}

// newerPutIDLocked is the put_id of key's version newer than putID (its route, or the
// last one dropped while puts of key were in flight), or 0 when there is none.
func (s *State) newerPutIDLocked(key string, putID int64) int64 {
	if r := s.routes[key]; r != nil && r.putID > putID {
		return r.putID
	}
	if d := s.droppedPutID[key]; d > putID {
		return d
	}
	return 0
}
