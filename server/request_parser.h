// Parsing of request bytes into dcformer.v1 messages, done by the server itself rather than by
// gRPC's generated handlers (the service registers raw methods): gRPC 1.51's callback API
// answers a body it cannot deserialize with UNIMPLEMENTED and an empty message, and never
// shows the call to the service, so it could be neither explained nor counted.
//
// proto3 `string` fields must hold UTF-8. The bytes are checked before protobuf parses them,
// so an invalid field is named in the error (and protobuf never logs about it).
//
// Pure functions, thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace dcf::server {

// Fills `out` (cleared first) from `bytes`. InvalidArgument:
//   "<field path>: is not valid UTF-8 (byte N)" for a string field with invalid UTF-8, with
//     the path as the API names it ("prompt.text", "stopping.stop_strings[2]");
//   "the request is not a valid <full message name>: ..." for anything protobuf rejects.
absl::Status ParseRequestBytes(absl::string_view bytes, google::protobuf::Message* out);

// What a scan of `bytes` (a serialized `descriptor` message) found: whether its wire format is
// well-formed (every length within bounds, every tag readable), and the path of the first
// string field whose value is not valid UTF-8, with the byte offset within that value.
// Protobuf's own parser logs an error for every invalid string it meets, even in a message it
// then rejects as truncated, so malformed bytes are never handed to it.
struct WireScan {
  bool well_formed = true;
  std::string invalid_utf8_path;  // empty: none found
  size_t invalid_utf8_offset = 0;
};
WireScan ScanRequestBytes(const google::protobuf::Descriptor& descriptor, absl::string_view bytes);

}  // namespace dcf::server
