package daemon

import (
	"time"
)

// A reply the client never read leaves the owner holding what it handed out: the
// holders of a Get or BatchGet and the started puts of a PutStart or BatchPutStart,
// whose ids the client learns only from that reply. A client whose call timed out (or
// whose connection broke) closes the connection and, for a get, asks again on another
// one; the first holder would stay held, and the put pending, until the session ends.
// The RPC server sees such a loss: the write of the reply fails (the client closed the
// connection before it was written), or the client closed it with the reply unread
// (on a Unix stream socket the server's next read then fails ECONNRESET, where a
// client that read everything leaves a plain EOF). It then hands the reply's grant to
// Owner.lostReply, which releases the holders and aborts the puts.
//
// A reply counts as read once the connection's next request arrives: clients send one
// call at a time on a connection. A client that pipelined requests would at worst keep
// an earlier lost reply's grant, as before; what is taken back is always the last
// reply's, which an unread tail always includes.

// grant is what one reply handed session client: holder ids and started puts.
type grant struct {
	client  int64
	holders []int64
	puts    []grantedPut
}

// reset empties g, keeping small backing arrays for the connection's next reply.
func (g *grant) reset() {
	g.client = 0
	clear(g.puts)
	if cap(g.holders) > keepGrant {
		g.holders = nil
	}
	if cap(g.puts) > keepGrant {
		g.puts = nil
	}
	g.holders, g.puts = g.holders[:0], g.puts[:0]
}

// keepGrant: a grant's backing array larger than this (a big batch's) is not kept by
// its connection.
const keepGrant = 64

// grantedPut is a put a reply started (its key and put id).
type grantedPut struct {
	key   string
	putID int64
}

// lostReply takes back what a lost reply granted, if its session still lives (the
// session's end takes back everything).
func (o *Owner) lostReply(g grant) {
	st := o.lock()
	c := st.sessions[g.client]
	if c == nil || c.closed {
		o.unlock()
		return
	}
	released, now := 0, time.Now()
	for _, id := range g.holders {
		if st.release(c, id, now) {
			released++
		}
	}
	var aborted []*pendingPut
	for _, gp := range g.puts {
		if p, err := o.takePutLocked(st, c, gp.key, gp.putID); err == nil {
			aborted = append(aborted, p)
		}
	}
	o.unlock()
	// Revoked as a failed batch's puts are (a lost BatchPutStart reply may have granted
	// thousands): in parallel, and left to the master's TTL once it is out of reach.
	o.abandonPuts(aborted)
	o.opts.Metrics.LostReply()
	o.log.Info().Int64("client", g.client).Str("name", c.name).Int("holders_released", released).Int("puts_aborted", len(aborted)).
		Msg("a reply was lost (the client closed the connection before reading it): what it handed out is taken back")
}
