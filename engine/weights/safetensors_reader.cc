#include "engine/weights/safetensors_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/weights/mapped_file.h"
#include "nlohmann/json.hpp"

namespace dcf {
namespace {

using Json = nlohmann::json;

// Header sizes beyond this are refused (real headers are well under 1 MiB per 1k tensors).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

class SafetensorsReader final : public CheckpointReader {
 public:
  struct Entry {
    size_t begin = 0;  // absolute byte offset in the file
    size_t bytes = 0;
  };

  SafetensorsReader(MappedFile file, std::vector<TensorInfo> tensors,
                    absl::flat_hash_map<std::string, size_t> index, std::vector<Entry> entries)
      : file_(std::move(file)),
        tensors_(std::move(tensors)),
        index_(std::move(index)),
        entries_(std::move(entries)) {}

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }

  absl::Status Read(const std::string& name, DType dtype, void* dst, int64_t count) override {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::NotFoundError(absl::StrCat(file_.path(), ": no tensor '", name, "'"));
    }
    const TensorInfo& info = tensors_[it->second];
    const Entry& e = entries_[it->second];
    if (count != info.NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ",
                                                     info.NumElements(), " elements, buffer ",
                                                     count));
    }
    ConvertDType(info.dtype, file_.data() + e.begin, count, dtype, dst);
    file_.Release(e.begin, e.bytes);
    return absl::OkStatus();
  }

 private:
  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::vector<Entry> entries_;
};

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": invalid safetensors file: ", what));
}

// The format requires the tensors' byte ranges to tile the data region: sorted by offset,
// each begins where the one before it ends, the first at 0 and the last at the end of the
// file (Hugging Face's reader refuses anything else). Overlapping tensors would load one
// tensor's bytes as another's, and a hole or a misaligned offset hides bytes no tensor owns.
absl::Status CheckOffsetsTile(const std::string& path, const std::vector<TensorInfo>& tensors,
                              const std::vector<SafetensorsReader::Entry>& entries,
                              size_t data_begin, size_t data_size) {
  std::vector<size_t> order(entries.size());  // tensor indices by (begin, end)
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t ea = entries[a].begin + entries[a].bytes;
    const size_t eb = entries[b].begin + entries[b].bytes;
    return std::tie(entries[a].begin, ea, tensors[a].name) <
           std::tie(entries[b].begin, eb, tensors[b].name);
  });
  auto range = [&](size_t i) {
    const size_t begin = entries[i].begin - data_begin;
    return absl::StrCat("tensor '", tensors[i].name, "' (data_offsets [", begin, ", ",
                        begin + entries[i].bytes, "))");
  };
  size_t covered = 0;  // the data region's bytes [0, covered) belong to the tensors so far
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const size_t begin = entries[i].begin - data_begin;
    if (begin < covered) {
      return Corrupt(path, absl::StrCat(range(i), " overlaps ", range(order[k - 1]),
                                        ": tensors must not share bytes"));
    }
    if (begin > covered) {
      return Corrupt(path, absl::StrCat("bytes [", covered, ", ", begin,
                                        ") of the data region belong to no tensor (a hole before ",
                                        range(i), "): data_offsets must tile the data region"));
    }
    covered = begin + entries[i].bytes;
  }
  if (covered != data_size) {
    return Corrupt(path, absl::StrCat("the data region has ", data_size,
                                      " bytes but the tensors cover only [0, ", covered,
                                      "): data_offsets must tile the data region"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  if (file.size() < 8) return Corrupt(path, "shorter than its 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);  // little-endian hosts only (x86-64, aarch64)
  if (header_len > kMaxHeaderBytes || header_len > file.size() - 8) {
    return Corrupt(path, absl::StrCat("header length ", header_len, " exceeds the file size ",
                                      file.size()));
  }
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  Json header = Json::parse(header_begin, header_begin + header_len, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Corrupt(path, "header is not a JSON object");
  }
  const size_t data_begin = 8 + header_len;
  const size_t data_size = file.size() - data_begin;

  std::vector<TensorInfo> tensors;
  std::vector<SafetensorsReader::Entry> entries;
  absl::flat_hash_map<std::string, size_t> index;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](absl::string_view what) {
      return Corrupt(path, absl::StrCat("tensor '", name, "': ", what));
    };
    if (!value.is_object()) return bad("entry is not an object");
    auto dt = value.find("dtype");
    auto sh = value.find("shape");
    auto off = value.find("data_offsets");
    if (dt == value.end() || !dt->is_string()) return bad("missing dtype");
    if (sh == value.end() || !sh->is_array()) return bad("missing shape");
    if (off == value.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    TensorInfo info;
    info.name = name;
    auto dtype = ParseSafetensorsDType(dt->get<std::string>());
    if (!dtype.ok()) return bad(dtype.status().message());
    info.dtype = *dtype;
    int64_t numel = 1;
    for (const Json& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v > 0 && static_cast<uint64_t>(numel) > (1ull << 40) / v)) {
        return bad("shape is too large");
      }
      info.shape.push_back(static_cast<int64_t>(v));
      numel *= static_cast<int64_t>(v);
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, ") outside the data region of ",
                              data_size, " bytes"));
    }
    const uint64_t expected = static_cast<uint64_t>(numel) * DTypeSize(info.dtype);
    if (end - begin != expected) {
      return bad(absl::StrCat("holds ", end - begin, " bytes but shape ",
                              ShapeToString(info.shape), " of ", DTypeName(info.dtype),
                              " needs ", expected));
    }
    index[name] = tensors.size();
    entries.push_back({data_begin + begin, end - begin});
    tensors.push_back(std::move(info));
  }
  RETURN_IF_ERROR(CheckOffsetsTile(path, tensors, entries, data_begin, data_size));
  return std::unique_ptr<CheckpointReader>(new SafetensorsReader(
      std::move(file), std::move(tensors), std::move(index), std::move(entries)));
}

}  // namespace dcf
