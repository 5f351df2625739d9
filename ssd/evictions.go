package ssd

import "time"

// Eviction names an SSD replica the ring overwrote: the owner tells the master,
// which drops it from the route if the key still has that put id.
type Eviction struct {
	Key   string
	PutID int64
	// Seq is the record's number (Entry.Seq): the master keeps a rewrite of the
	// version committed meanwhile, another record; 0 when unknown.
	Seq int64
}

// report queues evictions for the batcher; if the owner does not keep up they are
// dropped and counted (Stats.DroppedEvictions). A dropped report leaves the master
// routing gets to a gone record and counting the version as on SSD (with --ssd-admit
// evict its memory copy then goes without a write-back): the owner drains Evictions
// at once into a queue of its own, whatever its reports wait for.
func (s *Storage) report(evs []Eviction) {
	for i, ev := range evs {
		select {
		case s.evq <- ev:
		default:
			if s.evDropped.Add(uint64(len(evs)-i)) == uint64(len(evs)-i) {
				s.log.Warn().Msg("ssd: eviction queue full, dropping eviction reports (is Evictions() consumed?)")
			}
			return
		}
	}
}

// DroppedEvictions counts n eviction reports the consumer dropped after it took them
// (its own queue overflowed): they show in Stats.DroppedEvictions with the ring's own.
func (s *Storage) DroppedEvictions(n int) { s.evDropped.Add(uint64(n)) }

// Evictions delivers batches of overwritten replicas: a batch is sent when it holds
// EvictionBatch entries or EvictionDelay after its first entry. The channel is closed
// by Close. Reports that the consumer does not take in time are dropped
// (Stats.DroppedEvictions).
func (s *Storage) Evictions() <-chan []Eviction { return s.evOut }

func (s *Storage) batchEvictions() {
	defer close(s.evDone)
	defer close(s.evOut)
	var batch []Eviction
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	flush := func() {
		batch = s.Unrewritten(batch)
		if len(batch) == 0 {
			timer.Stop()
			return
		}
		timer.Stop()
		select {
		case s.evOut <- batch:
			batch = nil
		case <-s.evStop:
		}
	}
	for {
		select {
		case ev := <-s.evq:
			batch = append(batch, ev)
			if len(batch) == 1 {
				timer.Reset(s.opts.EvictionDelay)
			}
			if len(batch) >= s.opts.EvictionBatch {
				flush()
			}
		case <-timer.C:
			flush()
		case <-s.evStop:
		drain:
			for {
				select {
				case ev := <-s.evq:
					batch = append(batch, ev)
				default:
					break drain
				}
			}
			for len(batch) > 0 {
				k := min(len(batch), s.opts.EvictionBatch)
				select {
				case s.evOut <- batch[:k:k]:
					batch = batch[k:]
				default:
					s.evDropped.Add(uint64(len(batch)))
					batch = nil
				}
			}
			return
		}
	}
}

// Unrewritten drops from evs (taking s.mu) the evictions of records whose key and
// put id were written again since (the master's refresh, checkNewerLocked): the record
// overwritten was the old one, and the master, which knows a record by its key and put
// id only, would drop the new one, which lives on, if the report reached it after the
// rewrite's commit (it waits up to EvictionDelay here; in one write run, the record
// before the rewrite's may overwrite the old one). A rewrite that fails leaves the
// master counting the old record no longer: it drops its count of a failed refresh.
func (s *Storage) Unrewritten(evs []Eviction) []Eviction {
	if len(evs) == 0 {
		return evs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := evs[:0]
	for _, ev := range evs {
		if e := s.index[ev.Key]; e != nil && e.putID == ev.PutID {
			continue
		}
		out = append(out, ev)
	}
	return out
}
