// The source rules of the CUDA contract (engine/simt/cuda_compat.h), checked over the tree so
// that code written later keeps them: kernel launch syntax only in .cu files, CUDA toolkit
// headers only through cuda_compat.h, and .cu files free of absl, gtest, gRPC and protobuf
// (nvcc parses nothing but plain C++ and the contract).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dcf {
namespace {

namespace fs = std::filesystem;

struct Source {
  std::string path;  // relative to the source root
  std::string text;
};

std::vector<Source> Sources() {
  const fs::path root = DCF_SOURCE_DIR;
  std::vector<Source> sources;
  for (const char* top : {"engine", "server", "client", "bench", "tests"}) {
    fs::recursive_directory_iterator it(root / top), end;
    for (; it != end; ++it) {
      const std::string name = it->path().filename().string();
      if (it->is_directory() && (name == "node_modules" || name == "data")) {
        it.disable_recursion_pending();
        continue;
      }
      const std::string ext = it->path().extension().string();
      if (!it->is_regular_file() ||
          (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh" && ext != ".inc")) {
        continue;
      }
      std::ifstream in(it->path());
      std::stringstream text;
      text << in.rdbuf();
      sources.push_back({fs::relative(it->path(), root).string(), text.str()});
    }
  }
  return sources;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(CudaSourceRulesTest, TreeHasCudaSources) {
  int cu_files = 0;
  for (const Source& s : Sources()) cu_files += EndsWith(s.path, ".cu");
  EXPECT_GT(cu_files, 0) << "the scan found no .cu file: is DCF_SOURCE_DIR right?";
}

TEST(CudaSourceRulesTest, LaunchSyntaxOnlyInCuFiles) {
  const std::string launch = std::string("<<") + "<";  // not written whole in this file
  for (const Source& s : Sources()) {
    if (EndsWith(s.path, ".cu") || s.path == "engine/simt/cuda_compat.h") continue;
    EXPECT_EQ(s.text.find(launch), std::string::npos)
        << s.path << ": kernels are launched with DCF_LAUNCH in .cu files only";
  }
}

TEST(CudaSourceRulesTest, ToolkitHeadersOnlyThroughCudaCompat) {
  for (const Source& s : Sources()) {
    if (s.path == "engine/simt/cuda_compat.h") continue;
    for (const char* header : {"<cuda_runtime", "<cuda_bf16", "<cuda_fp16", "<cuda.h>", "<cublas",
                               "\"cuda_runtime", "<device_launch_parameters"}) {
      // cuBLASLt is a library, not part of the kernel contract: its one wrapper, compiled
      // only in the real build, includes it (the emulator build routes GEMMs to OpenBLAS).
      if (s.path == "engine/cuda/gemm_cublaslt.cc" && std::string(header) == "<cublas") continue;
      EXPECT_EQ(s.text.find(std::string("#include ") + header), std::string::npos)
          << s.path << " includes " << header << ": include engine/simt/cuda_compat.h instead";
    }
  }
}

TEST(CudaSourceRulesTest, CuFilesIncludeOnlyPlainCpp) {
  for (const Source& s : Sources()) {
    if (!EndsWith(s.path, ".cu")) continue;
    for (const char* banned : {"\"absl/", "\"gtest/", "\"gmock/", "<grpc", "google/protobuf"}) {
      EXPECT_EQ(s.text.find(std::string("#include ") + banned), std::string::npos)
          << s.path << " includes " << banned << ": .cu files stay plain C++ plus cuda_compat.h";
    }
  }
}

}  // namespace
}  // namespace dcf
