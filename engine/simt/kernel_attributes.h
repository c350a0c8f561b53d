// Per-kernel attributes set with cudaFuncSetAttribute in the SIMT emulator, keyed by the
// kernel's address. Only cudaFuncAttributeMaxDynamicSharedMemorySize exists. Thread-safe.
#pragma once

#include <cstddef>

namespace dcf::simt::detail {

void SetMaxDynamicSharedBytes(const void* kernel, size_t bytes);

// The kernel's dynamic shared memory limit: what was set, else the 48 KiB default.
size_t MaxDynamicSharedBytes(const void* kernel);

// True when the kernel opted into more than the default (then static plus dynamic shared
// memory may reach the device's opt-in maximum instead of 48 KiB).
bool HasDynamicSharedOptIn(const void* kernel);

}  // namespace dcf::simt::detail
