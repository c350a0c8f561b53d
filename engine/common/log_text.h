// How text from outside (a client's request id, header bytes gRPC logs) appears in a log line:
// a log line must stay one line with the fields its writer wrote, whatever a client sends.
//
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace dcf {

// `text` with '\' doubled and every byte outside printable ASCII (newline, ESC, UTF-8) as
// \xNN, cut after `max_bytes` input bytes with "...(N bytes)" saying how long it was.
std::string LogText(absl::string_view text, size_t max_bytes);

// `value` as a log field value: as is when it is 1..max_bytes of [A-Za-z0-9._:/@+-]; else in
// double quotes with '"' and '\' backslash-escaped and every byte outside printable ASCII as
// \xNN, cut after `max_bytes` input bytes with "...(N bytes)" saying how long it was.
// The empty string is "".
std::string LogValue(absl::string_view value, size_t max_bytes = 128);

}  // namespace dcf
