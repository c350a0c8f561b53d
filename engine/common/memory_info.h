// How much host memory this process may use: physical memory, the cgroup (container) memory
// limit, and the process's own resident set. The CPU backend sizes its KV cache from these,
// so a pod with a memory limit sizes from the limit, not from the node's RAM.
// Thread-safe (reads /proc and /sys each call).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace dcf {

// Bytes of physical memory of this machine (0 when unknown).
size_t PhysicalMemoryBytes();

// The memory limit of the cgroup this process runs in, or nullopt when there is none
// ("max", or the cgroup v1 "unlimited" value) or it cannot be read. Reads `proc_self_cgroup`
// (normally /proc/self/cgroup) to find the process's cgroup under `cgroup_root` (normally
// /sys/fs/cgroup): cgroup v2 memory.max, else cgroup v1 memory.limit_in_bytes; the smallest
// limit on the path from the process's cgroup up to the root counts.
std::optional<size_t> CgroupMemoryLimitBytes(const std::string& cgroup_root = "/sys/fs/cgroup",
                                             const std::string& proc_self_cgroup =
                                                 "/proc/self/cgroup");

// Resident set size of this process in bytes (0 when unknown).
size_t ProcessResidentBytes();

// min(physical memory, cgroup limit) minus the resident set: what this process may still
// allocate before the kernel or the container's OOM killer stops it (0 when exhausted).
size_t AvailableHostMemoryBytes();

}  // namespace dcf
