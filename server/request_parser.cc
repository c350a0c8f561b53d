#include "server/request_parser.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "engine/common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace dcf::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

// Nesting the scan follows; deeper messages are left to protobuf (which limits them too).
constexpr int kMaxDepth = 32;

// The API's name of `field`: "<oneof>.<field>" for members of a real oneof ("prompt.text").
std::string FieldName(const FieldDescriptor& field) {
  const auto* oneof = field.real_containing_oneof();
  return oneof != nullptr ? absl::StrCat(oneof->name(), ".", field.name()) : field.name();
}

// Scans one message's fields until the current limit, stopping at the first invalid string.
// False when the bytes are malformed.
bool Scan(const Descriptor& d, CodedInputStream* in, const std::string& prefix, int depth,
          WireScan* found) {
  std::map<int, int> seen;  // occurrences per field number, for repeated-field indices
  while (true) {
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return in->ConsumedEntireMessage() || in->BytesUntilLimit() == 0;
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    const FieldDescriptor* field = d.FindFieldByNumber(number);
    const bool nested = field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE &&
                        depth < kMaxDepth;
    const bool string = field != nullptr && field->type() == FieldDescriptor::TYPE_STRING;
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        !(nested || string)) {
      if (!WireFormatLite::SkipField(in, tag)) return false;
      continue;
    }
    const int index = seen[number]++;
    std::string path = absl::StrCat(prefix, FieldName(*field));
    if (field->is_repeated()) absl::StrAppend(&path, "[", index, "]");
    uint32_t length = 0;
    if (!in->ReadVarint32(&length)) return false;
    if (string) {
      std::string value;
      if (!in->ReadString(&value, static_cast<int>(length))) return false;
      const size_t bad = FirstInvalidUtf8(value);
      if (bad != std::string_view::npos) {
        found->invalid_utf8_path = std::move(path);
        found->invalid_utf8_offset = bad;
        return true;
      }
      continue;
    }
    const CodedInputStream::Limit limit = in->PushLimit(static_cast<int>(length));
    if (!Scan(*field->message_type(), in, absl::StrCat(path, "."), depth + 1, found)) return false;
    if (!found->invalid_utf8_path.empty()) return true;
    if (!in->ConsumedEntireMessage() && in->BytesUntilLimit() != 0) return false;
    in->PopLimit(limit);
  }
}

}  // namespace

WireScan ScanRequestBytes(const Descriptor& descriptor, absl::string_view bytes) {
  WireScan found;
  CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                      static_cast<int>(bytes.size()));
  found.well_formed = Scan(descriptor, &in, "", 0, &found);
  return found;
}

absl::Status ParseRequestBytes(absl::string_view bytes, google::protobuf::Message* out) {
  out->Clear();
  const WireScan scan = ScanRequestBytes(*out->GetDescriptor(), bytes);
  if (!scan.invalid_utf8_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(scan.invalid_utf8_path,
                                                   ": is not valid UTF-8 (byte ",
                                                   scan.invalid_utf8_offset, ")"));
  }
  if (!scan.well_formed || !out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    out->Clear();
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", out->GetDescriptor()->full_name(),
                     " message (", bytes.size(), " bytes that protobuf cannot parse)"));
  }
  return absl::OkStatus();
}

}  // namespace dcf::server
