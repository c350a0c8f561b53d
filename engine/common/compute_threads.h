// How many compute threads a process runs (OpenMP, and OpenBLAS's OpenMP build) and how its
// idle ones wait.
//
// libgomp and OpenBLAS read OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and OMP_WAIT_POLICY once,
// when they load (before main). By default idle OpenMP threads spin for a while after every
// parallel region; several such processes on a few cores (or a pod under a CPU limit) then
// burn each other's time: three lightly loaded servers on 2 cores ran 9x slower until
// OMP_WAIT_POLICY=PASSIVE. The only way to change these from inside the program is to set
// them and execute the program again, which EnsureComputeThreadEnvironment does. (Within a
// step the CPU backend's threads wait at barriers of their own, which spin for up to 200 us
// before sleeping: engine/cpu/team.h.)
#pragma once

#include <string>

#include "absl/status/status.h"

namespace dcf {

struct ComputeThreadEnvironment {
  int threads = 0;  // > 0: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS; 0: leave them alone
  // OMP_WAIT_POLICY when the environment does not set one ("" leaves it unset).
  std::string default_wait_policy = "PASSIVE";
};

// When the environment differs from `want`, sets it and re-executes /proc/self/exe with
// `argv` (argv[0] first, null-terminated), so this returns only in a process whose OpenMP
// runtime started with the wanted settings: OK then. An error when re-executing failed (the
// process goes on with its current settings; the caller decides whether that is fatal). Call
// it first thing in main, before any thread starts; file descriptors without FD_CLOEXEC
// survive the re-execution.
absl::Status EnsureComputeThreadEnvironment(const ComputeThreadEnvironment& want, char** argv);

// Ends the OpenMP worker threads that the calling thread's parallel regions started (they
// stay otherwise; its next parallel region starts them again). For a thread done with
// parallel work while another runs its own regions, as the one that loaded a model before
// an engine's loop thread takes over (Engine::Create): with OMP_WAIT_POLICY=active the idle
// workers spin for good, on the cores the loop's regions need. Call it outside any parallel
// region; a no-op there and where the runtime cannot. (GCC's libgomp, which the project
// builds with, ends the threads; LLVM's libomp would only put them to sleep.)
void ReleaseIdleComputeThreads();

}  // namespace dcf
