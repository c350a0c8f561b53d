// A restricted unpickler for the `data.pkl` member of a torch.save zip archive.
//
// torch.save writes a state_dict as a pickle (protocol 2 by default) of a dict/OrderedDict
// mapping names to tensors. Each tensor is rebuilt by torch._utils._rebuild_tensor_v2 from
// a persistent id ('storage', <typed storage class>, key, location, numel) whose raw bytes
// live in `<prefix>/data/<key>` next to data.pkl. This module interprets the pickle as data
// only: nothing is ever executed or imported. It accepts exactly these globals:
//   collections.OrderedDict, torch._utils._rebuild_tensor_v2,
//   torch._utils._rebuild_parameter, and the typed storage classes torch.<T>Storage.
// The storage classes are only tags; Float/Half/BFloat16 map to a DType, the other torch
// storage classes (Long, Double, ...) are accepted as tags with `dtype` unset so the caller
// can name the offending tensor. Any other global (os.system, builtins.eval, ...) is an
// InvalidArgument error naming "module.name"; unknown opcodes name the opcode byte and its
// offset. Every read is bounds-checked (a truncated pickle is an error, never a crash), and
// the value stack, mark stack, memo and tensor rank are capped.
//
// Thread-safe: a pure function of its input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/weights/dtype.h"

namespace dcf {

// One tensor of a pickled state_dict: a strided view into a storage.
struct PickledTensor {
  std::string name;                // state_dict key
  std::string storage_key;         // member name under <prefix>/data/
  std::string storage_type;        // the storage class name, e.g. "HalfStorage"
  std::optional<DType> dtype;      // unset for storage types the engine cannot read
  int64_t storage_numel = 0;       // element count recorded in the persistent id
  int64_t storage_offset = 0;      // in elements
  std::vector<int64_t> shape;      // logical shape
  std::vector<int64_t> strides;    // in elements, same rank as shape
};

// Parses a pickled state_dict (a dict or OrderedDict whose keys are strings and whose
// values are tensors or nn.Parameters). Returns the tensors in insertion order.
// Errors: InvalidArgument for malformed/truncated pickles, forbidden globals, unknown
// opcodes, non-tensor values, duplicate keys and negative shapes/strides/offsets.
absl::StatusOr<std::vector<PickledTensor>> ParseTorchStateDict(
    absl::Span<const uint8_t> pickle);

}  // namespace dcf
