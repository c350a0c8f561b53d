// How client-supplied text appears in the server's log lines (request ids, service names):
// a log line must stay one line with the fields the server wrote, whatever a client sends.
//
// Pure function, thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace dcf::server {

// `value` as a log field value: as is when it is 1..max_bytes of [A-Za-z0-9._:/@+-]; else in
// double quotes with '"' and '\' backslash-escaped and every byte outside printable ASCII as
// \xNN, cut after `max_bytes` input bytes with "...(N bytes)" saying how long it was.
// The empty string is "".
std::string LogValue(absl::string_view value, size_t max_bytes = 128);

}  // namespace dcf::server
