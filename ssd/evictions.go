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

// report queues one allocation's evictions, together, for the batcher: however many
// records one persist overwrote (a 24 MiB value over 1 KiB records: tens of thousands),
// they take one place in the queue, so they are dropped only when the owner does not
// keep up (and counted: Stats.DroppedEvictions; a review found a large persist's reports
// dropped one by one past the queue's 8,192 entries while the owner kept up). A dropped
// report leaves the master routing gets to a gone record and counting the version as on
// SSD (with --ssd-admit evict its memory copy then goes without a write-back): the owner
// drains Evictions at once into a queue of its own, whatever its reports wait for.
func (s *Storage) report(evs []Eviction) {
	if len(evs) == 0 {
		return
	}
	select {
	case s.evq <- evs:
	default:
		if s.evDropped.Add(uint64(len(evs))) == uint64(len(evs)) {
			s.log.Warn().Msg("ssd: eviction queue full, dropping eviction reports (is Evictions() consumed?)")
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
	// flush sends what is batched, EvictionBatch entries per batch; it returns false when
	// Close began meanwhile (what is left is batch's).
	flush := func() bool {
		timer.Stop()
		batch = s.Unrewritten(batch)
		for len(batch) > 0 {
			k := min(len(batch), s.opts.EvictionBatch)
			select {
			case s.evOut <- batch[:k:k]:
				batch = batch[k:]
			case <-s.evStop:
				return false
			}
		}
		batch = nil
		return true
	}
	for {
		select {
		case evs := <-s.evq:
			if len(batch) == 0 {
				timer.Reset(s.opts.EvictionDelay)
			}
			batch = append(batch, evs...)
			if len(batch) >= s.opts.EvictionBatch && !flush() {
				s.closeEvictions(batch)
				return
			}
		case <-timer.C:
			if !flush() {
				s.closeEvictions(batch)
				return
			}
		case <-s.evStop:
			s.closeEvictions(batch)
			return
		}
	}
}

// closeEvictions hands the consumer, at Close, what batch holds and the queue still
// has, as far as evOut takes it without waiting; the rest is counted dropped.
func (s *Storage) closeEvictions(batch []Eviction) {
drain:
	for {
		select {
		case evs := <-s.evq:
			batch = append(batch, evs...)
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
