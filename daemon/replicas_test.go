package daemon

import (
	"math"
	"testing"
)

// TestReplicaIndexLearnRaces: a record learned from a master answer is kept only when
// nothing since the call started made it doubtful — a drop of its key at or above its
// version, or an open overlapping its range (other than the caller's own target).
func TestReplicaIndexLearnRaces(t *testing.T) {
	x := newReplicaIndex()
	rec := replicaRecord{key: "k", putID: 10, offset: 4096, len: 1000}

	mark := x.mark()
	x.drop("k", 9) // an older version's invalidation does not matter
	if !x.learn(rec, mark, 0) || x.lookup("k") == nil {
		t.Fatal("a record with only an older drop since its call was not learned")
	}

	mark = x.mark()
	x.drop("k", 10) // the answer's version died while the call was out
	x.learn(replicaRecord{key: "k", putID: 10, offset: 8192, len: 1000}, mark, 0)
	if r := x.lookup("k"); r != nil {
		t.Fatalf("a version dropped during its call was learned: %+v", *r)
	}

	mark = x.mark()
	x.open(4096+512, 10) // the range was handed out again meanwhile
	if x.learn(rec, mark, 0) {
		t.Fatal("a record overlapping a range opened during its call was learned")
	}

	mark = x.mark()
	own := x.open(4096, 1000) // the call's own target
	if !x.learn(rec, mark, own) {
		t.Fatal("the call's own target did not count as its own")
	}
	if x.learn(replicaRecord{key: "k", putID: 9, offset: 0, len: 10}, x.mark(), 0) || x.lookup("k").putID != 10 {
		t.Fatal("an older version replaced a newer record")
	}

	mark = x.mark()
	for i := 0; i < indexNotes; i++ {
		x.drop("other", 1)
	}
	if x.learn(replicaRecord{key: "j", putID: 5, offset: 1 << 20, len: 1}, mark, 0) {
		t.Fatal("a record was learned after more changes than the index remembers")
	}

	x.reset()
	if x.len() != 0 || x.learn(rec, mark, 0) {
		t.Fatal("reset left records, or an answer from before it was learned")
	}
}

// TestReplicaIndexOpen: an open forgets exactly the records overlapping its range
// (ranges span whole 512-byte granules).
func TestReplicaIndexOpen(t *testing.T) {
	x := newReplicaIndex()
	for i, off := range []int64{0, 1024, 2048, 8192} {
		if !x.learn(replicaRecord{key: string(rune('a' + i)), putID: 1, offset: off, len: 600}, x.mark(), 0) {
			t.Fatalf("learn %d", i)
		}
	}
	x.open(1500, 600) // [1500, 2100) meets b [1024,2048) and c [2048,3072)
	for key, want := range map[string]bool{"a": true, "b": false, "c": false, "d": true} {
		if got := x.lookup(key) != nil; got != want {
			t.Errorf("after the open: %s recorded = %v, want %v", key, got, want)
		}
	}
	x.drop("d", math.MaxInt64)
	if recs := x.records(); len(recs) != 1 || recs[0].key != "a" {
		t.Fatalf("records = %+v, want only a", recs)
	}
}

// FuzzReplicaIndex checks the index against a plain model: after any sequence of learns
// (with fresh marks), drops and opens, the records are exactly the model's, disjoint.
func FuzzReplicaIndex(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 1, 4, 2, 0, 5, 7, 9, 1, 2, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		x := newReplicaIndex()
		model := map[string]replicaRecord{}
		overlaps := func(a, b replicaRecord) bool { return a.offset < b.end() && b.offset < a.end() }
		for len(ops) >= 4 {
			op, k, a, b := ops[0]%4, string(rune('a'+ops[1]%8)), int64(ops[2]), int64(ops[3])
			ops = ops[4:]
			switch op {
			case 0: // learn key k, version a, at granule b%32, b%5 granules + 1 long, notice bound b%3
				r := replicaRecord{key: k, putID: a, offset: (b % 32) * 512, len: (b%5)*512 + 1,
					notices: noticeBound{reg: 1, seq: b % 3}}
				// A version's length never changes: the same version at the same offset is
				// the same record, already known; its bound rises to the answer's.
				if cur, ok := model[k]; ok && (cur.putID > r.putID || (cur.putID == r.putID && cur.offset == r.offset)) {
					x.learn(r, x.mark(), 0)
					if cur.putID == r.putID && r.notices.seq > cur.notices.seq {
						cur.notices = r.notices
						model[k] = cur
					}
					continue
				}
				x.learn(r, x.mark(), 0)
				delete(model, k)
				for mk, m := range model {
					if overlaps(m, r) {
						delete(model, mk)
					}
				}
				model[k] = r
			case 1: // drop k up to a
				x.drop(k, a)
				if m, ok := model[k]; ok && m.putID <= a {
					delete(model, k)
				}
			case 3: // eviction notice number b%4+1 of k@a: not applied to a record whose bound is at least it
				n := noticeBound{reg: 1, seq: b%4 + 1}
				x.evicted(k, a, n)
				if m, ok := model[k]; ok && m.putID <= a && !(m.notices.seq > 0 && n.seq <= m.notices.seq) {
					delete(model, k)
				}
			case 2: // open granule a%32, b%7 granules + 1
				o := replicaRecord{offset: (a % 32) * 512, len: (b%7)*512 + 1}
				x.open(o.offset, o.len)
				for mk, m := range model {
					if overlaps(m, o) {
						delete(model, mk)
					}
				}
			}
		}
		recs := x.records()
		if len(recs) != len(model) || x.len() != len(model) {
			t.Fatalf("index has %d records (%d by key), model %d", len(recs), x.len(), len(model))
		}
		for i, r := range recs {
			if model[r.key] != r {
				t.Fatalf("record %+v, model %+v", r, model[r.key])
			}
			if i > 0 && recs[i-1].end() > r.offset {
				t.Fatalf("records overlap: %+v %+v", recs[i-1], r)
			}
		}
	})
}
