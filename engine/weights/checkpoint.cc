#include "engine/weights/checkpoint.h"

#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/file_util.h"
#include "engine/common/status_macros.h"
#include "engine/weights/safetensors_reader.h"
#include "engine/weights/torch_checkpoint.h"
#include "nlohmann/json.hpp"

namespace dcf {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

using OpenFn = absl::StatusOr<std::unique_ptr<CheckpointReader>> (*)(const std::string&);

// Presents several shard readers as one checkpoint.
class ShardedReader final : public CheckpointReader {
 public:
  ShardedReader(std::vector<std::unique_ptr<CheckpointReader>> shards,
                std::vector<TensorInfo> tensors, absl::flat_hash_map<std::string, size_t> owner)
      : shards_(std::move(shards)), tensors_(std::move(tensors)), owner_(std::move(owner)) {}

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }

  absl::Status Read(const std::string& name, DType dtype, void* dst, int64_t count) override {
    auto it = owner_.find(name);
    if (it == owner_.end()) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
    return shards_[it->second]->Read(name, dtype, dst, count);
  }

 private:
  std::vector<std::unique_ptr<CheckpointReader>> shards_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> owner_;  // tensor name -> shard
};

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenSharded(const fs::path& index_path,
                                                              OpenFn open) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index_path.string()));
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (index.is_discarded() || !index.is_object() || wm == index.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path.string(), ": expected a JSON object with a 'weight_map'"));
  }
  // Shard file names in first-seen order, and which file each tensor is promised in.
  std::vector<std::string> files;
  absl::flat_hash_map<std::string, size_t> file_index;
  absl::flat_hash_map<std::string, size_t> promised;
  for (auto& [name, file] : wm->items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": weight_map['", name, "'] is not a file name"));
    }
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": shard name '", f, "' must be a plain file name"));
    }
    auto [it, inserted] = file_index.try_emplace(f, files.size());
    if (inserted) files.push_back(f);
    promised[name] = it->second;
  }
  const fs::path dir = index_path.parent_path();
  std::vector<std::unique_ptr<CheckpointReader>> shards;
  std::vector<TensorInfo> tensors;
  absl::flat_hash_map<std::string, size_t> owner;
  for (size_t s = 0; s < files.size(); ++s) {
    ASSIGN_OR_RETURN(auto shard, open((dir / files[s]).string()));
    for (const TensorInfo& t : shard->tensors()) {
      auto [it, inserted] = owner.try_emplace(t.name, s);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' appears in both ",
                                                       files[it->second], " and ", files[s]));
      }
      tensors.push_back(t);
    }
    shards.push_back(std::move(shard));
  }
  for (auto& [name, shard] : promised) {
    auto it = owner.find(name);
    if (it == owner.end() || it->second != shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path.string(), " maps tensor '", name, "' to ", files[shard],
          ", which does not contain it"));
    }
  }
  return std::unique_ptr<CheckpointReader>(
      new ShardedReader(std::move(shards), std::move(tensors), std::move(owner)));
}

}  // namespace

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorInfo::NumElements() const { return dcf::NumElements(shape); }

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenCheckpointDir(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (!fs::is_directory(d, ec)) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  if (fs::exists(d / "model.safetensors.index.json")) {
    return OpenSharded(d / "model.safetensors.index.json", &OpenSafetensors);
  }
  if (fs::exists(d / "model.safetensors")) return OpenSafetensors((d / "model.safetensors").string());
  if (fs::exists(d / "pytorch_model.bin.index.json")) {
    return OpenSharded(d / "pytorch_model.bin.index.json", &OpenTorchCheckpoint);
  }
  if (fs::exists(d / "pytorch_model.bin")) {
    return OpenTorchCheckpoint((d / "pytorch_model.bin").string());
  }
  return absl::NotFoundError(absl::StrCat(
      dir, " has no weights (model.safetensors[.index.json] or pytorch_model.bin[.index.json])"));
}

}  // namespace dcf
