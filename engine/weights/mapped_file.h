// Read-only memory map of a whole file (RAII). Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dcf {

class MappedFile {
 public:
  // NotFound when the file cannot be opened; an empty file maps to size 0, data nullptr.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Tells the kernel the bytes [offset, offset+length) will not be read again, so the pages
  // leave this process's resident set (they stay in the page cache). Best effort.
  void Release(size_t offset, size_t length) const;

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dcf
