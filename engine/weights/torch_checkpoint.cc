#include "engine/weights/torch_checkpoint.h"

#include <zip.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "engine/weights/pickle_reader.h"

namespace dcf {
namespace {

// data.pkl of a 7B model is ~100 KB; anything near this is not a state_dict.
constexpr uint64_t kMaxPickleBytes = uint64_t{1} << 30;
// Contiguous tensors are converted in chunks of this many bytes.
constexpr uint64_t kChunkBytes = uint64_t{1} << 22;

// Read-only archives are closed with zip_discard: nothing is ever written back.
struct ZipDiscard {
  void operator()(zip_t* z) const { zip_discard(z); }
};
using ZipPtr = std::unique_ptr<zip_t, ZipDiscard>;

// One open archive member, read sequentially with bounds and error checks.
class MemberReader {
 public:
  static absl::StatusOr<MemberReader> Open(zip_t* zip, zip_uint64_t index,
                                           const std::string& name) {
    zip_file_t* f = zip_fopen_index(zip, index, 0);
    if (f == nullptr) {
      return absl::DataLossError(
          absl::StrCat("cannot open zip member '", name, "': ", zip_strerror(zip)));
    }
    return MemberReader(f, name);
  }
  MemberReader(MemberReader&& other) noexcept
      : file_(std::exchange(other.file_, nullptr)), name_(std::move(other.name_)) {}
  MemberReader& operator=(MemberReader&&) = delete;
  ~MemberReader() {
    if (file_ != nullptr) zip_fclose(file_);
  }

  // Reads exactly `n` bytes; a short read (truncated member) or CRC failure is DataLoss.
  absl::Status Read(void* dst, uint64_t n) {
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const zip_int64_t got = zip_fread(file_, out, n);
      if (got < 0) {
        return absl::DataLossError(absl::StrCat("error reading zip member '", name_,
                                                "': ", zip_file_strerror(file_)));
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrCat("zip member '", name_, "' is truncated"));
      }
      out += got;
      n -= static_cast<uint64_t>(got);
    }
    return absl::OkStatus();
  }

  // Discards `n` bytes (seeks where libzip can, i.e. in stored members).
  absl::Status Skip(uint64_t n) {
    if (n == 0) return absl::OkStatus();
    if (zip_fseek(file_, static_cast<zip_int64_t>(n), SEEK_CUR) == 0) {
      seeked_ = true;
      return absl::OkStatus();
    }
    std::vector<uint8_t> scratch(std::min<uint64_t>(n, kChunkBytes));
    while (n > 0) {
      const uint64_t step = std::min<uint64_t>(n, scratch.size());
      RETURN_IF_ERROR(Read(scratch.data(), step));
      n -= step;
    }
    return absl::OkStatus();
  }

  // At the end of a member read from its start, one more read lets libzip verify the CRC.
  absl::Status CheckEnd() {
    if (seeked_) return absl::OkStatus();
    uint8_t extra;
    const zip_int64_t got = zip_fread(file_, &extra, 1);
    if (got < 0) {
      return absl::DataLossError(absl::StrCat("error reading zip member '", name_,
                                              "': ", zip_file_strerror(file_)));
    }
    if (got != 0) {
      return absl::DataLossError(
          absl::StrCat("zip member '", name_, "' is longer than its recorded size"));
    }
    return absl::OkStatus();
  }

 private:
  MemberReader(zip_file_t* f, std::string name) : file_(f), name_(std::move(name)) {}
  zip_file_t* file_;
  std::string name_;
  bool seeked_ = false;
};

absl::StatusOr<uint64_t> MemberSize(zip_t* zip, zip_uint64_t index, const std::string& name) {
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(zip, index, 0, &st) != 0 || (st.valid & ZIP_STAT_SIZE) == 0 ||
      (st.valid & ZIP_STAT_COMP_SIZE) == 0 || (st.valid & ZIP_STAT_COMP_METHOD) == 0) {
    return absl::DataLossError(
        absl::StrCat("cannot stat zip member '", name, "': ", zip_strerror(zip)));
  }
  // The sizes in the zip directory are claims: a tiny file could promise gigabytes and make
  // a reader allocate them. torch.save stores members uncompressed (sizes must agree); a
  // deflated member cannot expand more than deflate's ~1032:1 limit.
  constexpr uint64_t kMaxDeflateRatio = 1032;
  const bool stored = st.comp_method == ZIP_CM_STORE;
  if ((stored && st.comp_size != st.size) ||
      (!stored && st.size > (st.comp_size + 1) * kMaxDeflateRatio)) {
    return absl::DataLossError(absl::StrCat("zip member '", name, "' claims ", st.size,
                                            " bytes from ", st.comp_size, " stored bytes"));
  }
  return static_cast<uint64_t>(st.size);
}

absl::StatusOr<std::string> ReadWholeMember(zip_t* zip, zip_uint64_t index,
                                            const std::string& name, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(uint64_t size, MemberSize(zip, index, name));
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("zip member '", name, "' is too large (", size, " bytes)"));
  }
  ASSIGN_OR_RETURN(MemberReader reader, MemberReader::Open(zip, index, name));
  std::string out(size, '\0');
  RETURN_IF_ERROR(reader.Read(out.data(), size));
  RETURN_IF_ERROR(reader.CheckEnd());
  return out;
}

// a*b and a+b on non-negative int64 with overflow detection.
bool MulOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool AddOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

struct Storage {
  std::string member;
  zip_uint64_t index = 0;
  uint64_t size_bytes = 0;
  DType dtype = DType::kF32;
};

struct TensorEntry {
  PickledTensor view;
  size_t storage = 0;
  int64_t numel = 0;
  int64_t last = 0;  // storage index of the furthest element (valid when numel > 0)
};

class TorchCheckpointReader : public CheckpointReader {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  absl::Status Read(const std::string& name, DType dtype, void* dst, int64_t count) override;

 private:
  absl::Status Index(std::vector<PickledTensor> pickled, const std::string& prefix);
  // Both write t.numel elements of `to` at `dst`.
  absl::Status ReadContiguous(const TensorEntry& t, MemberReader& reader, DType to,
                              uint8_t* dst);
  absl::Status ReadStrided(const TensorEntry& t, MemberReader& reader, DType to, uint8_t* dst);

  std::string path_;
  ZipPtr zip_;
  std::vector<TensorInfo> infos_;
  std::vector<TensorEntry> entries_;  // parallel to infos_
  std::vector<Storage> storages_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

absl::StatusOr<std::unique_ptr<CheckpointReader>> TorchCheckpointReader::Open(
    const std::string& path) {
  int code = 0;
  zip_t* raw = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (raw == nullptr) {
    zip_error_t err;
    zip_error_init_with_code(&err, code);
    const std::string msg = absl::StrCat(path, ": cannot open as a torch.save zip archive: ",
                                         zip_error_strerror(&err));
    zip_error_fini(&err);
    if (code == ZIP_ER_NOENT) return absl::NotFoundError(msg);
    return absl::InvalidArgumentError(msg);
  }
  auto reader = std::unique_ptr<TorchCheckpointReader>(new TorchCheckpointReader());
  reader->path_ = path;
  reader->zip_.reset(raw);

  // Locate the single "<prefix>/data.pkl".
  const zip_int64_t n = zip_get_num_entries(raw, 0);
  std::string prefix;
  zip_uint64_t pkl_index = 0;
  int found = 0;
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(raw, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    if (name == nullptr) continue;
    const absl::string_view s(name);
    const size_t slash = s.find('/');
    if (slash == absl::string_view::npos || slash == 0 || s.substr(slash) != "/data.pkl") {
      continue;
    }
    ++found;
    prefix = std::string(s.substr(0, slash));
    pkl_index = static_cast<zip_uint64_t>(i);
  }
  if (found == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no '<prefix>/data.pkl' member; not a torch.save archive"));
  }
  if (found > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": several '<prefix>/data.pkl' members"));
  }

  // Newer torch records the byte order; storages are read as little-endian.
  const std::string byteorder_name = prefix + "/byteorder";
  const zip_int64_t bo = zip_name_locate(raw, byteorder_name.c_str(), ZIP_FL_ENC_RAW);
  if (bo >= 0) {
    ASSIGN_OR_RETURN(std::string order,
                     ReadWholeMember(raw, static_cast<zip_uint64_t>(bo), byteorder_name, 64));
    if (order != "little") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unsupported storage byte order '", order, "'"));
    }
  }

  const std::string pkl_name = prefix + "/data.pkl";
  ASSIGN_OR_RETURN(std::string pkl, ReadWholeMember(raw, pkl_index, pkl_name, kMaxPickleBytes));
  auto parsed = ParseTorchStateDict(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()));
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(path, ": ", pkl_name, ": ", parsed.status().message()));
  }
  RETURN_IF_ERROR(reader->Index(*std::move(parsed), prefix));
  return std::unique_ptr<CheckpointReader>(std::move(reader));
}

absl::Status TorchCheckpointReader::Index(std::vector<PickledTensor> pickled,
                                          const std::string& prefix) {
  absl::flat_hash_map<std::string, size_t> storage_by_key;
  for (PickledTensor& view : pickled) {
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": tensor '", view.name, "': ", what));
    };
    if (!view.dtype.has_value()) {
      return bad(absl::StrCat("unsupported storage type torch.", view.storage_type,
                              " (supported: FloatStorage, HalfStorage, BFloat16Storage)"));
    }
    const DType dtype = *view.dtype;
    auto [it, inserted] = storage_by_key.try_emplace(view.storage_key, storages_.size());
    if (inserted) {
      Storage s;
      s.member = absl::StrCat(prefix, "/data/", view.storage_key);
      const zip_int64_t idx = zip_name_locate(zip_.get(), s.member.c_str(), ZIP_FL_ENC_RAW);
      if (idx < 0) return bad(absl::StrCat("storage member '", s.member, "' is missing"));
      s.index = static_cast<zip_uint64_t>(idx);
      ASSIGN_OR_RETURN(s.size_bytes, MemberSize(zip_.get(), s.index, s.member));
      s.dtype = dtype;
      storages_.push_back(std::move(s));
    }
    const Storage& storage = storages_[it->second];
    if (storage.dtype != dtype) {
      return bad(absl::StrCat("storage '", view.storage_key, "' is used as both ",
                              DTypeName(storage.dtype), " and ", DTypeName(dtype)));
    }

    TensorEntry e;
    e.storage = it->second;
    e.numel = 1;
    e.last = view.storage_offset;
    for (size_t d = 0; d < view.shape.size(); ++d) {
      int64_t reach = 0;
      if (!MulOk(e.numel, view.shape[d], &e.numel) ||
          (view.shape[d] > 0 && (!MulOk(view.shape[d] - 1, view.strides[d], &reach) ||
                                 !AddOk(e.last, reach, &e.last)))) {
        return bad(absl::StrCat("shape ", ShapeToString(view.shape), " with strides ",
                                ShapeToString(view.strides), " overflows int64"));
      }
    }
    const int64_t storage_elems =
        static_cast<int64_t>(storage.size_bytes / static_cast<uint64_t>(DTypeSize(dtype)));
    if (e.numel > 0 && e.last >= storage_elems) {
      return bad(absl::StrCat("shape ", ShapeToString(view.shape), ", strides ",
                              ShapeToString(view.strides), ", offset ", view.storage_offset,
                              " reach element ", e.last, " but storage '", storage.member,
                              "' holds only ", storage_elems, " ", DTypeName(dtype),
                              " elements"));
    }
    if (!by_name_.try_emplace(view.name, infos_.size()).second) {
      return bad("duplicate tensor name");
    }
    TensorInfo info;
    info.name = view.name;
    info.dtype = dtype;
    info.shape = view.shape;
    infos_.push_back(std::move(info));
    e.view = std::move(view);
    entries_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

// Row-major contiguous (size-1 dimensions may carry any stride).
bool IsContiguous(const PickledTensor& v) {
  int64_t expected = 1;
  for (size_t d = v.shape.size(); d > 0; --d) {
    if (v.shape[d - 1] != 1 && v.strides[d - 1] != expected) return false;
    expected *= v.shape[d - 1];
  }
  return true;
}

absl::Status TorchCheckpointReader::ReadContiguous(const TensorEntry& t, MemberReader& reader,
                                                   DType to, uint8_t* dst) {
  const int64_t ds = DTypeSize(to);
  const DType dtype = storages_[t.storage].dtype;
  const uint64_t es = static_cast<uint64_t>(DTypeSize(dtype));
  const uint64_t chunk_elems = kChunkBytes / es;
  std::vector<uint8_t> buf(std::min<uint64_t>(static_cast<uint64_t>(t.numel), chunk_elems) *
                           es);
  for (int64_t done = 0; done < t.numel;) {
    const int64_t count = std::min<int64_t>(t.numel - done, static_cast<int64_t>(chunk_elems));
    RETURN_IF_ERROR(reader.Read(buf.data(), static_cast<uint64_t>(count) * es));
    ConvertDType(dtype, buf.data(), count, to, dst + done * ds);
    done += count;
  }
  return absl::OkStatus();
}

absl::Status TorchCheckpointReader::ReadStrided(const TensorEntry& t, MemberReader& reader,
                                                DType to, uint8_t* dst) {
  const DType dtype = storages_[t.storage].dtype;
  const int64_t es = DTypeSize(dtype);
  const int64_t ds = DTypeSize(to);
  // The span [offset, last] of the storage that this view touches: [span] raw bytes.
  std::vector<uint8_t> span(static_cast<size_t>(t.last - t.view.storage_offset + 1) * es);
  RETURN_IF_ERROR(reader.Read(span.data(), span.size()));

  const std::vector<int64_t>& shape = t.view.shape;
  const std::vector<int64_t>& strides = t.view.strides;
  const size_t rank = shape.size();
  if (rank == 0) {
    ConvertDType(dtype, span.data(), 1, to, dst);
    return absl::OkStatus();
  }
  const int64_t inner = shape[rank - 1];
  const int64_t inner_stride = strides[rank - 1];
  std::vector<int64_t> index(rank - 1, 0);  // over the outer dimensions
  int64_t base = 0;                          // element offset of the current row in `span`
  for (int64_t row_start = 0; row_start < t.numel; row_start += inner) {
    const uint8_t* src = span.data() + base * es;
    if (inner_stride == 1) {
      ConvertDType(dtype, src, inner, to, dst + row_start * ds);
    } else {
      for (int64_t j = 0; j < inner; ++j) {
        ConvertDType(dtype, src + j * inner_stride * es, 1, to, dst + (row_start + j) * ds);
      }
    }
    // Odometer increment of the outer index.
    for (size_t d = rank - 1; d > 0; --d) {
      if (++index[d - 1] < shape[d - 1]) {
        base += strides[d - 1];
        break;
      }
      base -= (shape[d - 1] - 1) * strides[d - 1];
      index[d - 1] = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status TorchCheckpointReader::Read(const std::string& name, DType dtype, void* dst,
                                         int64_t count) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named '", name, "'"));
  }
  const TensorEntry& t = entries_[it->second];
  if (count != t.numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Read('", name, "'): destination has ", count, " elements, tensor ",
        ShapeToString(t.view.shape), " has ", t.numel));
  }
  if (t.numel == 0) return absl::OkStatus();
  const Storage& storage = storages_[t.storage];
  const uint64_t es = static_cast<uint64_t>(DTypeSize(storage.dtype));
  ASSIGN_OR_RETURN(MemberReader reader,
                   MemberReader::Open(zip_.get(), storage.index, storage.member));
  RETURN_IF_ERROR(reader.Skip(static_cast<uint64_t>(t.view.storage_offset) * es));
  if (IsContiguous(t.view)) {
    RETURN_IF_ERROR(ReadContiguous(t, reader, dtype, static_cast<uint8_t*>(dst)));
  } else {
    RETURN_IF_ERROR(ReadStrided(t, reader, dtype, static_cast<uint8_t*>(dst)));
  }
  if (static_cast<uint64_t>(t.last + 1) * es == storage.size_bytes) {
    RETURN_IF_ERROR(reader.CheckEnd());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenTorchCheckpoint(const std::string& path) {
  return TorchCheckpointReader::Open(path);
}

}  // namespace dcf
