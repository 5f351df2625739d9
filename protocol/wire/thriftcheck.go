package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

// Bounds of CheckStruct and CheckMessage.
const (
	// maxVarElems bounds, on the owner's RPC socket, the elements of a container whose
	// elements have no fixed size (strings, structs, containers): decoding one costs far
	// more memory than its wire bytes (a 1-byte empty struct becomes a pointer and an
	// allocation), so the frame limit alone does not bound it. Four times the batch
	// limit: a batch slightly over MaxBatch still decodes and gets INVALID_ARGUMENT from
	// the handler.
	maxVarElems = 4 * MaxBatch
	// ClusterMaxElems is that bound on the cluster ports (master, peer, and their
	// replies), where lists are not batches: a Register after a master restart pins
	// every holder and write in flight on the owner, any number of them. 2^20 elements
	// is more than a 32 MiB frame holds of any real list element (a pinned range is ~30
	// bytes), and decoding 2^20 empty structs costs ~100 MiB at most.
	ClusterMaxElems = 1 << 20
	// maxDepth bounds nesting (our IDL nests four deep at most).
	maxDepth = 16
	// MaxMethodNameBytes bounds a request's method name on the owner's RPC socket (the
	// longest is 20 bytes): a reply to an unknown method repeats its name twice, so a
	// frame-long name made a reply four times the frame, held outside the frame budget
	// for as long as the client did not read it.
	MaxMethodNameBytes = 128
)

var errTruncated = errors.New("truncated")

// CheckMessage checks one binary-thrift message (the body of a frame): its header
// (version, method name, type, sequence id) and the struct that follows, as
// CheckStruct does but with at most maxElems elements of a variable-size type in one
// container. A message that passes decodes within memory proportional to its size.
func CheckMessage(msg []byte, maxElems int) error {
	_, _, _, off, err := thrift.Binary.ReadMessageBegin(msg)
	if err != nil {
		return fmt.Errorf("malformed thrift message header: %w", err)
	}
	return checkStruct(msg[off:], maxElems, 0)
}

// fixedSize is the wire size of thrift's fixed-size types, 0 for the others.
func fixedSize(t thrift.TType) int {
	switch t {
	case thrift.BOOL, thrift.BYTE:
		return 1
	case thrift.I16:
		return 2
	case thrift.I32:
		return 4
	case thrift.DOUBLE, thrift.I64:
		return 8
	}
	return 0
}

// CheckStruct walks a binary-thrift struct without decoding it, before FastRead does:
// every string and container must fit in the bytes present, the containers of
// variable-size elements hold at most maxVarElems together, nesting is at most maxDepth and
// every type byte is known. Decoding a struct that passes allocates in proportion to
// its bytes (the generated code sizes slices by the announced count: 2^31 ids in a
// 60-byte frame would be a 16 GiB slice). Every port runs it before decoding: the
// owner's RPC socket in its framed server, the Kitex-served master and peer ports
// through GuardListener, their clients' replies through GuardReader.
//
// The bound is on the whole struct, not on each container: a request's items may each
// hold a list (PutEndItem.copies), and 2,000 items of 16,000 empty structs each (one
// byte apiece on the wire) passed a bound per container and decoded a 31 MiB frame into
// about 1 GiB. Every request of the owner's RPC socket holds at most two batches of
// elements (items, and at most MAX_BATCH copies over all of them).
func CheckStruct(body []byte) error {
	return checkStruct(body, maxVarElems, maxVarElems)
}

// checkStruct is CheckStruct with at most maxElems variable-size elements in one
// container and, when maxTotal > 0, at most maxTotal in all of them.
func checkStruct(body []byte, maxElems, maxTotal int) error {
	w := sizeWalker{b: body, maxElems: maxElems, maxTotal: maxTotal}
	if err := w.value(thrift.STRUCT, maxDepth); err != nil {
		return fmt.Errorf("malformed thrift at byte %d: %w", w.off, err)
	}
	return nil
}

// LengthOffsets returns the offsets in body (a binary-thrift struct that passes
// CheckStruct) of every announced length: string lengths and container counts, each a
// big-endian int32. Tests patch them to build length-bombed frames of real requests.
func LengthOffsets(body []byte) ([]int, error) {
	w := sizeWalker{b: body, maxElems: maxVarElems, marks: []int{}}
	if err := w.value(thrift.STRUCT, maxDepth); err != nil {
		return nil, fmt.Errorf("malformed thrift at byte %d: %w", w.off, err)
	}
	return w.marks, nil
}

type sizeWalker struct {
	b        []byte
	off      int
	maxElems int // elements of a variable-size type in one container
	maxTotal int // in all containers (0: no bound)
	total    int
	marks    []int // non-nil: record the offset of every length (LengthOffsets)
}

// mark records that a length starts at off.
func (w *sizeWalker) mark(off int) {
	if w.marks != nil {
		w.marks = append(w.marks, off)
	}
}

func (w *sizeWalker) take(n int) ([]byte, error) {
	if n < 0 || n > len(w.b)-w.off {
		return nil, errTruncated
	}
	p := w.b[w.off : w.off+n]
	w.off += n
	return p, nil
}

// count checks a container's element count against the bytes left and maxElems.
func (w *sizeWalker) count(n int32, elemTypes ...thrift.TType) (int, error) {
	if n < 0 {
		return 0, fmt.Errorf("negative container size %d", n)
	}
	fixed := 0
	for _, t := range elemTypes {
		s := fixedSize(t)
		if s == 0 {
			if int(n) > w.maxElems {
				return 0, fmt.Errorf("container of %d elements exceeds %d", n, w.maxElems)
			}
			if w.total += int(n); w.maxTotal > 0 && w.total > w.maxTotal {
				return 0, fmt.Errorf("containers of more than %d elements of a variable-size type in all", w.maxTotal)
			}
			s = 1 // at least one byte each (an empty struct's STOP)
		}
		fixed += s
	}
	if int64(n)*int64(fixed) > int64(len(w.b)-w.off) {
		return 0, fmt.Errorf("container of %d elements: %w", n, errTruncated)
	}
	return int(n), nil
}

func (w *sizeWalker) value(t thrift.TType, depth int) error {
	if depth == 0 {
		return fmt.Errorf("nesting deeper than %d", maxDepth)
	}
	if s := fixedSize(t); s > 0 {
		_, err := w.take(s)
		return err
	}
	switch t {
	case thrift.STRING:
		w.mark(w.off)
		p, err := w.take(4)
		if err != nil {
			return err
		}
		n := int32(binary.BigEndian.Uint32(p))
		if n < 0 {
			return fmt.Errorf("negative string length %d", n)
		}
		_, err = w.take(int(n))
		return err
	case thrift.STRUCT:
		for {
			p, err := w.take(1)
			if err != nil {
				return err
			}
			ft := thrift.TType(p[0])
			if ft == thrift.STOP {
				return nil
			}
			if _, err := w.take(2); err != nil { // field id
				return err
			}
			if err := w.value(ft, depth-1); err != nil {
				return err
			}
		}
	case thrift.MAP:
		w.mark(w.off + 2)
		p, err := w.take(6)
		if err != nil {
			return err
		}
		kt, vt := thrift.TType(p[0]), thrift.TType(p[1])
		n, err := w.count(int32(binary.BigEndian.Uint32(p[2:])), kt, vt)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := w.value(kt, depth-1); err != nil {
				return err
			}
			if err := w.value(vt, depth-1); err != nil {
				return err
			}
		}
		return nil
	case thrift.SET, thrift.LIST:
		w.mark(w.off + 1)
		p, err := w.take(5)
		if err != nil {
			return err
		}
		et := thrift.TType(p[0])
		n, err := w.count(int32(binary.BigEndian.Uint32(p[1:])), et)
		if err != nil {
			return err
		}
		if s := fixedSize(et); s > 0 {
			_, err := w.take(n * s)
			return err
		}
		for i := 0; i < n; i++ {
			if err := w.value(et, depth-1); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown thrift type %d", t)
}
