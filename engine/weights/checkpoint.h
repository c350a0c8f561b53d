// Format-independent view of a checkpoint: a set of named tensors that can be read in their
// stored dtype or converted (fp32, or rounded to F16/BF16).
//
// Implementations: safetensors (safetensors_reader.h), PyTorch zip checkpoints
// (torch_checkpoint.h), and a sharded reader that merges several files
// (OpenCheckpointDir below). Readers validate their container (headers, offsets, sizes) when
// opened, so a later Read fails only on I/O errors. Not thread-safe: one reader, one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/weights/dtype.h"

namespace dcf {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major logical shape
  int64_t NumElements() const;
};

// Product of the dimensions (1 for a scalar).
int64_t NumElements(absl::Span<const int64_t> shape);

// "[3, 4]" style rendering for error messages.
std::string ShapeToString(absl::Span<const int64_t> shape);

class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;

  // Every tensor in the checkpoint, in file order. Names are unique.
  virtual const std::vector<TensorInfo>& tensors() const = 0;

  // Writes tensor `name` converted to `dtype` (a plain copy when it is the stored dtype),
  // contiguous row-major, into `dst`, which holds `count` elements of `dtype`; `count` must
  // equal NumElements(). Source pages are released afterwards where the format allows it,
  // so reading every tensor once never holds the file and the copy in memory at the same
  // time. NotFound for an unknown name, InvalidArgument for a wrong count.
  virtual absl::Status Read(const std::string& name, DType dtype, void* dst, int64_t count) = 0;

  // Read() into fp32.
  absl::Status ReadF32(const std::string& name, absl::Span<float> dst) {
    return Read(name, DType::kF32, dst.data(), static_cast<int64_t>(dst.size()));
  }
};

// Opens the weights in a model directory, detecting the layout in this order:
// model.safetensors.index.json, model.safetensors, pytorch_model.bin.index.json,
// pytorch_model.bin. Sharded layouts are merged (a tensor listed in two shards, or a shard
// that lacks a tensor its index promises, is an error naming it).
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenCheckpointDir(const std::string& dir);

}  // namespace dcf
