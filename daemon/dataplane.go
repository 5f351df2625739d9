package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/peerclient"
)

// The data plane's serving side: other owners pull from this segment (gets of replicas
// here, puts staged in the transfer area, SSD refills staged by the stager). The
// pulling side is get_remote.go and put_remote.go.

// pullClient is what an owner pulls with: a *transfer.Client (Options.testPuller wraps
// it to break a connection where the real one cannot be broken on demand).
type pullClient interface {
	Pull(ctx context.Context, addr string, f transfer.Fence, offset int64, dst []byte) error
	PullMany(ctx context.Context, addr string, items []transfer.PullItem) []error
	Close() error
}

// startDataPlane serves pulls from the segment, makes the puller, and fixes the
// advertised peer and data addresses (refusing loopback ones in a cluster whose master
// is not on loopback).
func (o *Owner) startDataPlane() error {
	var err error
	o.peerAddr, err = advertise(o.peer.ln.Addr(), o.opts.AdvertiseHost, o.opts.MasterAddr)
	if err != nil {
		return err
	}
	// A master names the address it dials in its proof: this one, or the local address.
	o.peer.check.Advertise(o.peerAddr)
	if err := checkReachable("--peer-listen", o.opts.PeerListen, o.peerAddr, o.opts.MasterAddr); err != nil {
		return err
	}
	o.data, err = transfer.Listen(o.opts.DataListen, segmentSource{o}, transfer.ServerOptions{
		Secrets: o.opts.Secrets, Logger: &o.log, Metrics: o.opts.Metrics, MaxConns: dataPlaneConnections(nofileLimit())})
	if err != nil {
		return fmt.Errorf("data plane: %w", err)
	}
	o.dataAddr, err = advertise(o.data.Addr(), o.opts.AdvertiseHost, o.opts.MasterAddr)
	if err != nil {
		return err
	}
	if err := checkReachable("--data-listen", o.opts.DataListen, o.dataAddr, o.opts.MasterAddr); err != nil {
		return err
	}
	o.puller = transfer.NewClient(transfer.ClientOptions{Secrets: o.opts.Secrets, Logger: &o.log, Metrics: o.opts.Metrics,
		MaxIdle: dataPlaneConnections(nofileLimit())})
	if o.opts.testPuller != nil {
		o.puller = o.opts.testPuller(o.puller)
	}
	o.peers = peerclient.New(o.opts.Secrets, time.Second)
	o.log.Info().Str("peer", o.peerAddr).Str("data", o.dataAddr).Msg("peer service and data plane serving")
	return nil
}

// stopDataPlane stops serving and making pulls (a get pulling meanwhile fails and
// revokes); later calls do nothing more. The fields stay set: gets may still read them.
func (o *Owner) stopDataPlane() {
	if o.data != nil {
		o.data.Close()
	}
	if o.puller != nil {
		o.puller.Close()
	}
}

// useSegment admits a peer call that reads or writes the segment outside an RPC call
// (PullPut, BatchSsdReplicaPersist); false once Stop is unmapping it. doneSegment ends it.
func (o *Owner) useSegment() bool {
	st := o.lock()
	defer o.unlock()
	if st.segClosed {
		return false
	}
	st.segUsers++
	return true
}

func (o *Owner) doneSegment() {
	st := o.lock()
	st.segUsers--
	o.copied.Broadcast()
	o.unlock()
}

// closeSegmentUsers admits no more segment users and waits for those running.
func (o *Owner) closeSegmentUsers() {
	st := o.lock()
	st.segClosed = true
	for st.segUsers > 0 {
		o.copied.Wait()
	}
	o.unlock()
}

// segmentSource serves other owners' pulls from this owner's segment: the fence must
// name this owner's registration (Owner.nodeGen), and the range must lie in the segment. The master retains the
// range for the transfer (until its GetDone or GetRevoke), so it holds the value. A
// staged pull (Fence.Staged) is served from the stager instead.
type segmentSource struct{ o *Owner }

var _ transfer.WaitingSource = segmentSource{}

func (s segmentSource) Open(f transfer.Fence, offset, length int64) ([]byte, func(), error) {
	return s.OpenWaiting(f, offset, length, nil)
}

// OpenWaiting implements transfer.WaitingSource: a staged pull waits for its chunk on
// the serving goroutine, calling alive every transfer.WaitInterval (nil: never).
func (s segmentSource) OpenWaiting(f transfer.Fence, offset, length int64, alive func() error) ([]byte, func(), error) {
	o := s.o
	if gen := o.nodeGen(); f.SourceNode != o.opts.NodeID || f.SourceGeneration != gen {
		return nil, nil, fmt.Errorf("%w: pull for node %q generation %d reached node %q generation %d",
			transfer.ErrFenced, f.SourceNode, f.SourceGeneration, o.opts.NodeID, gen)
	}
	if f.Staged {
		if o.stager == nil {
			return nil, nil, fmt.Errorf("%w: node %q has no SSD tier to stage from", transfer.ErrFenced, o.opts.NodeID)
		}
		return o.stager.open(f.TransferID, offset, length, alive)
	}
	seg := o.seg.Bytes()
	if offset < 0 || length <= 0 || offset > int64(len(seg))-length {
		return nil, nil, fmt.Errorf("%w: range [%d,+%d) outside the %d-byte segment", transfer.ErrFenced, offset, length, len(seg))
	}
	st := o.lock()
	err := st.checkPutSource(f.TransferID, offset, length)
	o.unlock()
	if err != nil {
		return nil, nil, err
	}
	return seg[offset : offset+length], func() {}, nil
}
