#include "engine/weights/safetensors_writer.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dcf {

namespace {

// Opens `path` and writes the header naming `entries` (name, dtype, shape; data in that
// order, back to back): the part both writers share. The stream is then at the data region.
struct HeaderEntry {
  const std::string* name;
  DType dtype;
  const std::vector<int64_t>* shape;
};

absl::Status OpenWithHeader(const std::string& path, absl::Span<const HeaderEntry> entries,
                            std::ofstream& out) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const HeaderEntry& e : entries) {
    const uint64_t bytes = static_cast<uint64_t>(NumElements(*e.shape)) * DTypeSize(e.dtype);
    header[*e.name] = {{"dtype", std::string(DTypeName(e.dtype))},
                       {"shape", *e.shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data region
  out.open(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorShape> tensors,
                              DType dtype,
                              const std::function<void(size_t, absl::Span<float>)>& fill) {
  std::vector<HeaderEntry> entries;
  entries.reserve(tensors.size());
  for (const TensorShape& t : tensors) entries.push_back({&t.name, dtype, &t.shape});
  std::ofstream out;
  if (absl::Status st = OpenWithHeader(path, entries, out); !st.ok()) return st;
  std::vector<float> values;
  std::vector<uint16_t> half;
  for (size_t i = 0; i < tensors.size(); ++i) {
    values.assign(static_cast<size_t>(NumElements(tensors[i].shape)), 0.0f);
    fill(i, absl::MakeSpan(values));
    if (dtype == DType::kF32) {
      out.write(reinterpret_cast<const char*>(values.data()),
                static_cast<std::streamsize>(values.size() * 4));
      continue;
    }
    half.resize(values.size());
    for (size_t j = 0; j < values.size(); ++j) {
      half[j] = dtype == DType::kF16 ? FloatToHalf(values[j]) : FloatToBF16(values[j]);
    }
    out.write(reinterpret_cast<const char*>(half.data()),
              static_cast<std::streamsize>(half.size() * 2));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, absl::Span<const StoredTensor> tensors) {
  std::vector<HeaderEntry> entries;
  entries.reserve(tensors.size());
  for (const StoredTensor& t : tensors) entries.push_back({&t.name, t.dtype, &t.shape});
  std::ofstream out;
  if (absl::Status st = OpenWithHeader(path, entries, out); !st.ok()) return st;
  for (const StoredTensor& t : tensors) {
    out.write(static_cast<const char*>(t.data),
              static_cast<std::streamsize>(NumElements(t.shape) * DTypeSize(t.dtype)));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              DType dtype) {
  std::vector<TensorShape> shapes;
  for (const TensorToWrite& t : tensors) {
    if (NumElements(t.shape) != static_cast<int64_t>(t.data.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': shape and data size disagree"));
    }
    shapes.push_back({t.name, t.shape});
  }
  return WriteSafetensors(path, shapes, dtype, [&](size_t i, absl::Span<float> dst) {
    std::copy(tensors[i].data.begin(), tensors[i].data.end(), dst.begin());
  });
}

}  // namespace dcf
