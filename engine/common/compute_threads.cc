#include "engine/common/compute_threads.h"

#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dcf {
namespace {

// Sets `name` to `value` when it differs; true when it changed.
bool SetIfDifferent(const char* name, const std::string& value) {
  const char* current = std::getenv(name);
  if (current != nullptr && value == current) return false;
  setenv(name, value.c_str(), /*overwrite=*/1);
  return true;
}

}  // namespace

absl::Status EnsureComputeThreadEnvironment(const ComputeThreadEnvironment& want, char** argv) {
  bool changed = false;
  if (want.threads > 0) {
    const std::string n = absl::StrCat(want.threads);
    changed |= SetIfDifferent("OMP_NUM_THREADS", n);
    changed |= SetIfDifferent("OPENBLAS_NUM_THREADS", n);
  }
  if (!want.default_wait_policy.empty() && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    changed |= SetIfDifferent("OMP_WAIT_POLICY", want.default_wait_policy);
  }
  if (!changed) return absl::OkStatus();
  execv("/proc/self/exe", argv);
  return absl::InternalError(absl::StrCat("cannot re-execute with the compute-thread settings: ",
                                          std::strerror(errno)));
}

void ReleaseIdleComputeThreads() {
  if (omp_in_parallel()) return;
  omp_pause_resource_all(omp_pause_soft);  // libgomp: frees this thread's pool
}

}  // namespace dcf
