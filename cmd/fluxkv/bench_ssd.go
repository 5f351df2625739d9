package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/ssd"
)

// benchSSDCommand is `fluxkv bench ssd`: the owner's SSD cache (ring + io engine +
// O_DIRECT shard files) measured on one directory: writes, then reads verified as the
// owner does them, then the same reads without verification.
func benchSSDCommand() *cli.Command {
	return &cli.Command{
		Name:  "ssd",
		Usage: "measure the SSD cache: persist random values for N seconds, then load random resident ones (verified, then unverified)",
		Description: "Opens a cache root under --dir (which must support O_DIRECT), runs --callers callers\n" +
			"persisting --size values for --seconds (the ring wraps and evicts as in production), then\n" +
			"loading random resident values into aligned memory for --seconds, with the engine keeping\n" +
			"--depth IOs in flight, in alternating rounds: verified as the owner reads (record header and\n" +
			"CRC32C, the header read as a separate IO or in one READV with the first chunk) and without\n" +
			"verification, so the cost of verification comes from one run over the same data. The root\n" +
			"is removed afterwards. Compare with fio on the same disk, e.g.\n" +
			"  fio --name=w --filename=DIR/w --direct=1 --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --size=2G --runtime=10 --time_based\n" +
			"  fio --name=r --filename=DIR/f --direct=1 --rw=randread --bs=1M --iodepth=8 --ioengine=io_uring --size=2G --runtime=10 --time_based\n" +
			"(the read file fully written first: fio lays it out; the write file fresh, as the ring's fallocated shards are).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Required: true, Usage: "directory on the disk to measure (must support O_DIRECT)"},
			&cli.StringFlag{Name: "size", Value: "1MiB", Usage: "value size: bytes or a size such as 512KiB, 1MiB, 4MiB"},
			&cli.Float64Flag{Name: "seconds", Value: 10, Usage: "length of the write phase and of each read mode's phase, in seconds"},
			&cli.Int64Flag{Name: "writes", Usage: "run this many persists instead of --seconds of them (0: timed)"},
			&cli.Int64Flag{Name: "reads", Usage: "run this many loads in each read mode instead of --seconds of them (0: timed)"},
			&cli.StringFlag{Name: "engine", Value: ssd.EngineUring, Usage: "io engine: uring or psync (pread/pwrite)"},
			&cli.IntFlag{Name: "depth", Value: 8, Usage: "io depth of the engine (IOs in flight on the device)"},
			&cli.IntFlag{Name: "callers", DefaultText: "2 × depth", Usage: "concurrent callers (their buffer copies overlap the others' IO)"},
			&cli.StringFlag{Name: "limit", Value: "2GiB", Usage: "ring space (the large_limit_size of the one path)"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON on stdout"},
		},
		Action: func(c *cli.Context) error {
			size, err := ssd.ParseSize(c.String("size"))
			if err != nil {
				return cli.Exit("--size: "+err.Error(), 2)
			}
			limit, err := ssd.ParseSize(c.String("limit"))
			if err != nil {
				return cli.Exit("--limit: "+err.Error(), 2)
			}
			switch c.String("engine") {
			case ssd.EngineUring, ssd.EnginePsync:
			default:
				return cli.Exit("--engine must be uring or psync", 2)
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := ssd.RunBench(ctx, ssd.BenchOptions{
				Dir:      c.String("dir"),
				Size:     size,
				Seconds:  c.Float64("seconds"),
				Writes:   c.Int64("writes"),
				Reads:    c.Int64("reads"),
				Engine:   c.String("engine"),
				Depth:    c.Int("depth"),
				Callers:  c.Int("callers"),
				Limit:    limit,
				Progress: os.Stderr,
			})
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			if c.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			fmt.Printf("engine %s, depth %d, O_DIRECT %v, value %s, ring %s on %s, records on %s blocks\n",
				res.Engine, res.Depth, res.ODirect, ssd.FormatSize(res.ValueBytes), ssd.FormatSize(res.LimitBytes), res.Dir,
				ssd.FormatSize(res.AlignBytes))
			fmt.Printf("write: %d values, %.2f GiB/s, p50 %.0f us, p99 %.0f us, %d evictions\n",
				res.Writes, res.WriteGiBs, res.WriteP50us, res.WriteP99us, res.Evictions)
			fmt.Printf("read:  %d resident values, read modes alternating in rounds (the first is the owner's):\n", res.ReadSetKeys)
			for _, m := range res.ReadModes {
				fmt.Printf("  %-10s %7d values (%d misses), %.2f GiB/s, p50 %.0f us, p99 %.0f us\n",
					m.Mode, m.Reads, m.Misses, m.GiBs, m.P50us, m.P99us)
			}
			fmt.Printf("verification costs %.1f%% of unverified read bandwidth\n", 100*(1-res.ReadGiBs/max(res.ReadUnverifiedGiBs, 1e-9)))
			return nil
		},
	}
}
