// Types shared by the three fluxkv services (external, master, peer).
namespace go common
namespace py fluxkv._gen.common

// Every response carries one of these codes and a human-readable message.
enum ErrorCode {
  OK = 0,
  KEY_NOT_FOUND = 1,
  NO_SPACE = 2,
  INVALID_ARGUMENT = 3,
  ALREADY_EXISTS = 4,
  BUSY = 5,
  STALE_GENERATION = 6,
  UNAVAILABLE = 7,
  INTERNAL = 8,
  // The caller may not do this: an attach by a uid or group the owner does not admit.
  PERMISSION_DENIED = 9,
  // A master that is not the leader (HA on etcd) answers every call with this; the
  // message names the leader ("not the leader: HOST:PORT") when it knows one. Only
  // owners see it: they answer their clients UNAVAILABLE and follow the leader on etcd.
  NOT_LEADER = 10,
}

// One master of the cluster as `fluxkv status` shows it: its address, whether it is the
// leader, and the epoch of its leadership (0 for a follower).
struct MasterInfo {
  1: string addr,
  2: bool leader,
  3: i64 epoch,
}

// Where the bytes a get hands out came from.
enum Source {
  MEMORY = 1,
  SSD = 2,
}

struct CapacityStat {
  1: i64 capacity_bytes,
  2: i64 used_bytes,
}

struct MemberStat {
  1: string node_id,
  2: i64 generation,
  3: CapacityStat memory_segment,
  4: CapacityStat kv_ssd,
  5: bool alive,
  6: string data_addr,
  7: string peer_addr,
  8: i64 memory_replicas,
  9: i64 ssd_replicas,
  10: i64 holders,
  // SSD persists the master asked this owner for since it started (its own replicas and
  // the SSD pool's), and those that ended without an SSD replica (failed, queue full,
  // owner gone): a dropped persist leaves the value memory-only.
  11: i64 ssd_persists,
  12: i64 ssd_persists_dropped,
  // Persists assigned to this owner and not ended yet.
  13: i64 ssd_persists_pending,
  // The transfer area (outside memory_segment): its size, and the bytes in use there —
  // values on their way to another owner, gets' ranges, and replicas the pool borrowed
  // the idle area for (transfer_area_replicas of memory_replicas).
  14: CapacityStat transfer_area,
  15: i64 transfer_area_replicas,
  // The landing area (outside memory_segment and the transfer area; unset without one):
  // its size, and the bytes of the gets landed there and not released yet.
  16: CapacityStat landing_area,
  // KV pages of this owner's memory the SSD write-back gave up on (--ssd-admit evict):
  // those that left memory dirty with no other copy to take the write-back over, and
  // those left memory-only after their write-backs failed twice. Each failed write-back
  // also counts in ssd_persists_dropped of the owner asked to persist it.
  17: i64 ssd_unwritten,
}

struct KeyVersion {
  1: string key,
  2: i64 put_id,
}
