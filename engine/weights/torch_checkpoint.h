// Reader for PyTorch checkpoints written by torch.save (the zip format, torch >= 1.6).
//
// The archive holds `<prefix>/data.pkl` (a pickled state_dict, parsed by the restricted
// unpickler in pickle_reader.h) and one raw little-endian member per storage at
// `<prefix>/data/<key>`; <prefix> is whatever top folder torch.save chose ("archive",
// "pytorch_model", ...). Tensors are strided views into storages: several may share one
// storage, start at an offset and be non-contiguous; Read gathers them into contiguous
// row-major elements of the requested dtype.
//
// Open-time validation: the zip's central directory, data.pkl (fully read, CRC-checked),
// the pickle, that every storage member exists, that every tensor's dtype is F32/F16/BF16,
// and that every tensor's extent (offset + the furthest element its shape/strides reach)
// fits in its storage member. Errors name the tensor. Storage bytes are only read by
// Read, which streams one member and holds at most that tensor's span of the storage in
// memory (contiguous tensors are converted in small chunks), so CRC errors in storage
// members surface there as DataLoss.
//
// TensorInfo::dtype is the storage dtype (F16 for HalfStorage, ...). Not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/weights/checkpoint.h"

namespace dcf {

// Opens the torch.save zip archive at `path`.
// Errors: NotFound (no such file), InvalidArgument (not a zip, no data.pkl, bad pickle,
// missing storage, unsupported dtype, tensor out of its storage's bounds), DataLoss
// (truncated or CRC-corrupt member).
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenTorchCheckpoint(const std::string& path);

}  // namespace dcf
