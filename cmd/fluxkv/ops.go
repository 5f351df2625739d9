package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

func socketFlag() cli.Flag {
	return &cli.StringFlag{Name: "socket", Value: wire.DefaultSocket(), Usage: "the owner's socket (DIR/fluxkv.sock)", EnvVars: []string{"FLUXKV_SOCKET"}}
}

func connect(c *cli.Context) (*fluxkv.Client, error) {
	cl, err := fluxkv.Connect(fluxkv.Options{Socket: c.String("socket"), Name: "fluxkv-cli"})
	if err != nil {
		return nil, cli.Exit(err.Error(), 2)
	}
	return cl, nil
}

// clientCommand builds an operator command: it checks the argument count, attaches to
// the owner, runs fn and detaches.
func clientCommand(name, usage, argsUsage string, minArgs, maxArgs int, flags []cli.Flag,
	fn func(c *cli.Context, cl *fluxkv.Client, a []string) error) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: argsUsage,
		Flags: append([]cli.Flag{socketFlag()}, flags...),
		Action: func(c *cli.Context) error {
			a, err := args(c, minArgs, maxArgs, argsUsage)
			if err != nil {
				return err
			}
			cl, err := connect(c)
			if err != nil {
				return err
			}
			defer cl.Close()
			return fn(c, cl, a)
		},
	}
}

// args checks the positional arguments.
func args(c *cli.Context, min, max int, usage string) ([]string, error) {
	a := c.Args().Slice()
	if len(a) < min || len(a) > max {
		return nil, cli.Exit("usage: fluxkv "+c.Command.Name+" "+usage+" (flags go before the key)", 2)
	}
	return a, nil
}

func failure(err error) error {
	if errors.Is(err, fluxkv.ErrKeyNotFound) {
		return cli.Exit("not found", 1)
	}
	return cli.Exit(err.Error(), 2)
}

func putCommand() *cli.Command {
	return clientCommand("put", "store a value: put KEY [FILE|-] (default: standard input)", "KEY [FILE|-]", 1, 2,
		[]cli.Flag{&cli.BoolFlag{Name: "nx", Usage: "fail if the key already exists"}},
		func(c *cli.Context, cl *fluxkv.Client, a []string) error {
			opts := fluxkv.PutOptions{RejectIfExists: c.Bool("nx")}
			var in io.Reader = os.Stdin
			if len(a) == 2 && a[1] != "-" {
				f, err := os.Open(a[1])
				if err != nil {
					return cli.Exit(err.Error(), 2)
				}
				defer f.Close()
				fi, err := f.Stat()
				if err != nil {
					return cli.Exit(err.Error(), 2)
				}
				if fi.Mode().IsRegular() && fi.Size() > 0 {
					// Read the file straight into the shared segment: no intermediate buffer.
					err = cl.PutWith(a[0], fi.Size(), opts, fileFill(f, a[1]))
					if err != nil {
						return failure(err)
					}
					return nil
				}
				// A FIFO, a shell's <(command), a device, a /proc or /sys file (regular,
				// of size 0): its size is no length; read it to its end as standard input.
				in = f
			}
			data, err := io.ReadAll(in)
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			err = cl.PutWith(a[0], int64(len(data)), opts, func(dst []byte) error { copy(dst, data); return nil })
			if err != nil {
				return failure(err)
			}
			return nil
		})
}

// fileFill is a put's fill from the regular file f (named name): the file's bytes from
// its start, at every run (the client runs fill again when it redoes a put whose
// outcome became unknown: reading on from where the first run stopped failed with EOF).
func fileFill(f *os.File, name string) func(dst []byte) error {
	return func(dst []byte) error {
		n, err := f.ReadAt(dst, 0)
		if n == len(dst) {
			return nil
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // (it shrank since its size was read)
		}
		return fmt.Errorf("read %s: %w", name, err)
	}
}

func getCommand() *cli.Command {
	return clientCommand("get", "fetch a value: get [-o FILE|-] KEY; a miss exits 1", "[-o FILE|-] KEY", 1, 1,
		[]cli.Flag{&cli.StringFlag{Name: "o", Aliases: []string{"output"}, Value: "-", Usage: "write the value to FILE (- = standard output)"}},
		func(c *cli.Context, cl *fluxkv.Client, a []string) error {
			h, err := cl.Get(a[0])
			if err != nil {
				return failure(err)
			}
			defer h.Release()
			out := os.Stdout
			if p := c.String("o"); p != "-" {
				f, err := os.Create(p)
				if err != nil {
					return cli.Exit(err.Error(), 2)
				}
				defer f.Close()
				out = f
			}
			if _, err := out.Write(h.Bytes()); err != nil {
				return cli.Exit(err.Error(), 2)
			}
			if out != os.Stdout {
				// (A write error the file system reports only at close: NFS, quotas.)
				if err := out.Close(); err != nil {
					return cli.Exit(err.Error(), 2)
				}
			}
			return nil
		})
}

func delCommand() *cli.Command {
	return clientCommand("del", "delete a key: del KEY", "KEY", 1, 1, nil,
		func(c *cli.Context, cl *fluxkv.Client, a []string) error {
			ok, err := cl.Delete(a[0])
			if err != nil {
				return failure(err)
			}
			if ok {
				fmt.Println("deleted")
			} else {
				fmt.Println("not found")
			}
			return nil
		})
}

func existsCommand() *cli.Command {
	return clientCommand("exists", "exit 0 if KEY has a value, 1 if not", "KEY", 1, 1, nil,
		func(c *cli.Context, cl *fluxkv.Client, a []string) error {
			ok, err := cl.Exists(a[0])
			if err != nil {
				return failure(err)
			}
			if !ok {
				return cli.Exit("", 1)
			}
			return nil
		})
}

type capacityJSON struct {
	CapacityBytes int64 `json:"capacity_bytes"`
	UsedBytes     int64 `json:"used_bytes"`
}

type memberJSON struct {
	NodeID         string       `json:"node_id"`
	Generation     int64        `json:"generation"`
	Alive          bool         `json:"alive"`
	PeerAddr       string       `json:"peer_addr"`
	DataAddr       string       `json:"data_addr"`
	MemorySegment  capacityJSON `json:"memory_segment"`
	KvSsd          capacityJSON `json:"kv_ssd"`
	MemoryReplicas int64        `json:"memory_replicas"`
	SsdReplicas    int64        `json:"ssd_replicas"`
	Holders        int64        `json:"holders"`
	// SsdPersists, SsdPersistsDropped, SsdPersistsPending: SSD persists the master
	// asked this owner for, those that left the value memory-only, and those running.
	SsdPersists        int64 `json:"ssd_persists"`
	SsdPersistsDropped int64 `json:"ssd_persists_dropped"`
	SsdPersistsPending int64 `json:"ssd_persists_pending"`
	// SsdUnwritten: KV pages of this owner's memory the SSD write-back gave up on
	// (--ssd-admit evict): left memory dirty, or memory-only after failed write-backs.
	SsdUnwritten int64 `json:"ssd_unwritten"`
	// TransferArea: the area outside memory_segment (values on their way to another
	// owner, gets' ranges, and the TransferAreaReplicas the pool borrowed it for).
	TransferArea         capacityJSON `json:"transfer_area"`
	TransferAreaReplicas int64        `json:"transfer_area_replicas"`
	// LandingArea: the area beyond the pool and the transfer area for the gets of
	// values held elsewhere that are not promoted (--landing-reserve; 0 without one).
	LandingArea capacityJSON `json:"landing_area"`
}

// masterJSON is one master: its address, whether it leads, and the epoch of its
// leadership (0 for a follower). A standalone master is the one leader.
type masterJSON struct {
	Addr   string `json:"addr"`
	Leader bool   `json:"leader"`
	Epoch  int64  `json:"epoch"`
}

type statusJSON struct {
	Members []memberJSON `json:"members"`
	Masters []masterJSON `json:"masters"`
	Keys    int64        `json:"keys"`
	// MemoryValues: keys with a memory replica (distinct values in memory);
	// MemoryDuplicateBytes: the bytes of their other memory replicas.
	MemoryValues         int64 `json:"memory_values"`
	MemoryDuplicateBytes int64 `json:"memory_duplicate_bytes"`
}

func statusCommand() *cli.Command {
	return clientCommand("status", "members, memory and SSD capacity/used, masters and the leader, keys", "", 0, 0,
		[]cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		func(c *cli.Context, cl *fluxkv.Client, _ []string) error {
			// A status poll leaves the owner's hot set alone (its gets stay local).
			st, err := cl.StatWith(fluxkv.StatOptions{KeepHotSet: true})
			if err != nil {
				return failure(err)
			}
			out := statusOf(st)
			if c.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				return enc.Encode(out)
			}
			printStatus(os.Stdout, out)
			return nil
		})
}

// statusOf is the owner's Stat answer as `fluxkv status` prints it; members and
// masters are arrays even when empty.
func statusOf(st *external.StatResponse) statusJSON {
	out := statusJSON{Members: []memberJSON{}, Masters: []masterJSON{}, Keys: st.Keys,
		MemoryValues: st.MemoryValues, MemoryDuplicateBytes: st.MemoryDuplicateBytes}
	for _, m := range st.Members {
		mj := memberJSON{NodeID: m.NodeId, Generation: m.Generation, Alive: m.Alive, PeerAddr: m.PeerAddr, DataAddr: m.DataAddr,
			MemoryReplicas: m.MemoryReplicas, SsdReplicas: m.SsdReplicas, Holders: m.Holders,
			SsdPersists: m.SsdPersists, SsdPersistsDropped: m.SsdPersistsDropped, SsdPersistsPending: m.SsdPersistsPending,
			SsdUnwritten: m.SsdUnwritten}
		if m.MemorySegment != nil {
			mj.MemorySegment = capacityJSON{m.MemorySegment.CapacityBytes, m.MemorySegment.UsedBytes}
		}
		if m.KvSsd != nil {
			mj.KvSsd = capacityJSON{m.KvSsd.CapacityBytes, m.KvSsd.UsedBytes}
		}
		if m.TransferArea != nil {
			mj.TransferArea = capacityJSON{m.TransferArea.CapacityBytes, m.TransferArea.UsedBytes}
			mj.TransferAreaReplicas = m.TransferAreaReplicas
		}
		if m.LandingArea != nil {
			mj.LandingArea = capacityJSON{m.LandingArea.CapacityBytes, m.LandingArea.UsedBytes}
		}
		out.Members = append(out.Members, mj)
	}
	for _, m := range st.Masters {
		if m != nil {
			out.Masters = append(out.Masters, masterJSON{Addr: m.Addr, Leader: m.Leader, Epoch: m.Epoch})
		}
	}
	return out
}

// areaUse is an area's "used/size", or - for none.
func areaUse(a capacityJSON) string {
	if a.CapacityBytes <= 0 {
		return "-"
	}
	return fmt.Sprintf("%s/%s", approxSize(a.UsedBytes), humanSize(a.CapacityBytes))
}

// printStatus prints status as tables: the members, then the masters (when the
// owner reported any), then the key count.
func printStatus(w io.Writer, out statusJSON) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGENERATION\tPEER\tDATA\tMEMORY USED\tMEMORY CAPACITY\tSSD USED\tSSD CAPACITY\tREPLICAS (MEM/SSD)\tHOLDERS\tTRANSFER AREA (USED/SIZE)\tLANDING AREA (USED/SIZE)")
	for _, m := range out.Members {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", m.NodeID, m.Generation, orDash(m.PeerAddr), orDash(m.DataAddr),
			approxSize(m.MemorySegment.UsedBytes), humanSize(m.MemorySegment.CapacityBytes),
			approxSize(m.KvSsd.UsedBytes), humanSize(m.KvSsd.CapacityBytes), m.MemoryReplicas, m.SsdReplicas, m.Holders,
			areaUse(m.TransferArea), areaUse(m.LandingArea))
	}
	tw.Flush()
	if len(out.Masters) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MASTER\tLEADER\tEPOCH")
		for _, m := range out.Masters {
			leader := "no"
			if m.Leader {
				leader = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\n", orDash(m.Addr), leader, m.Epoch)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "keys: %d (in memory: %d, duplicate bytes: %s)\n", out.Keys, out.MemoryValues, approxSize(out.MemoryDuplicateBytes))
}

// orDash prints an empty field as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
