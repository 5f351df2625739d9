package fluxkv

import (
	"fmt"
	"testing"
)

// BenchmarkPut40x8MiB puts 40 values of 8 MiB on a 256 MiB node (1.25× the segment), as
// one BatchPut and as 40 Puts: the batch's waves must cost about what the single puts do.
//
//	FLUXKV_BIN=$PWD/bin/fluxkv go test ./clients/go/fluxkv -run '^$' -bench Put40x8MiB -benchtime 3x
func BenchmarkPut40x8MiB(b *testing.B) {
	n := startNode(b, "256MiB")
	c := n.connect(b)
	value := make([]byte, 8<<20)
	for i := range value {
		value[i] = byte(i * 7)
	}
	items := make([]PutItem, 40)
	for i := range items {
		items[i] = PutItem{Key: fmt.Sprintf("bench/%d", i), Value: value}
	}
	for _, it := range items { // fault the segment's pages in before either is timed
		if err := c.Put(it.Key, it.Value); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("batch", func(b *testing.B) {
		b.SetBytes(int64(len(items) * len(value)))
		for b.Loop() {
			errs, err := c.BatchPut(items, PutOptions{})
			if err != nil {
				b.Fatal(err)
			}
			for i, e := range errs {
				if e != nil {
					b.Fatalf("item %d: %v", i, e)
				}
			}
		}
	})
	b.Run("single", func(b *testing.B) {
		b.SetBytes(int64(len(items) * len(value)))
		for b.Loop() {
			for _, it := range items {
				if err := c.Put(it.Key, it.Value); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
