#include "engine/backends/cuda_plugin_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dcf {
namespace {

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

absl::StatusOr<const CudaPlugin*> Load() {
  std::vector<std::string> candidates;
  if (const char* file = std::getenv("DCF_CUDA_PLUGIN"); file != nullptr && *file != '\0') {
    candidates.push_back(file);
  }
  const std::string exe_dir = ExecutableDir();
  if (!exe_dir.empty()) {
    for (const char* rel : {"/../lib/", "/lib/", "/"}) {
      candidates.push_back(exe_dir + rel + DCF_CUDA_PLUGIN_FILE);
    }
  }
#if defined(DCF_CUDA_PLUGIN_DIR)
  candidates.push_back(std::string(DCF_CUDA_PLUGIN_DIR) + "/" + DCF_CUDA_PLUGIN_FILE);
#endif
  candidates.push_back(DCF_CUDA_PLUGIN_FILE);  // LD_LIBRARY_PATH, ldconfig
  std::string tried;
  for (const std::string& c : candidates) {
    void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      absl::StrAppend(&tried, "\n  ", dlerror());
      continue;
    }
    auto version =
        reinterpret_cast<DcfCudaPluginAbiVersionFn>(dlsym(lib, "dcf_cuda_plugin_abi_version"));
    auto* plugin = new CudaPlugin();
    plugin->device_count =
        reinterpret_cast<DcfCudaPluginDeviceCountFn>(dlsym(lib, "dcf_cuda_plugin_device_count"));
    plugin->create_backend = reinterpret_cast<DcfCudaPluginCreateBackendFn>(
        dlsym(lib, "dcf_cuda_plugin_create_backend"));
    if (version == nullptr || version() != DCF_CUDA_PLUGIN_ABI_VERSION ||
        plugin->device_count == nullptr || plugin->create_backend == nullptr) {
      absl::StrAppend(&tried, "\n  ", c, ": not a CUDA backend plugin of ABI version ",
                      DCF_CUDA_PLUGIN_ABI_VERSION);
      delete plugin;
      dlclose(lib);
      continue;
    }
    return plugin;  // never unloaded: backends it made may live until exit
  }
  return absl::UnavailableError(
      absl::StrCat("cannot load the CUDA backend (" DCF_CUDA_PLUGIN_FILE "); tried:", tried));
}

}  // namespace

absl::StatusOr<const CudaPlugin*> LoadCudaPlugin() {
  static std::once_flag once;
  static absl::StatusOr<const CudaPlugin*>* result = nullptr;
  std::call_once(once, [] { result = new absl::StatusOr<const CudaPlugin*>(Load()); });
  return *result;
}

}  // namespace dcf
