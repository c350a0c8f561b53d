// gRPC core's log lines go through the project's logging (engine/common/logging.h), in the
// server and in the clients: one sink, installed with gpr_set_log_function.
//  * Every line is one line: the message is written as LogText escapes it (a byte outside
//    printable ASCII as \xNN), so bytes a client sent (gRPC 1.51 logs invalid header values
//    verbatim) can neither start a forged line nor carry terminal escape codes.
//  * Lines are rate-limited per call site (gRPC's file:line): a burst of kBurst, then one per
//    kRefill; the next line written says how many were dropped meanwhile, so a remote client
//    cannot flood the log.
//  * The first ERROR line is remembered (FirstGrpcError): a client adds it to a call that failed
//    with an opaque status (a TLS file gRPC could not use: "Could not load any root
//    certificate.", which the lines after it only follow from).
//  * While a GrpcLogCapture lives, lines are collected instead of written: a server's Start
//    turns a failed bind into one clean line with the reason the collected lines carry.
// Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpc/support/log.h"

namespace dcf::rpc {

inline constexpr int kBurst = 10;
inline constexpr absl::Duration kRefill = absl::Seconds(6);

struct GrpcLogLine {
  std::string file;
  int line = 0;
  gpr_log_severity severity = GPR_LOG_SEVERITY_ERROR;
  std::string message;  // as gRPC wrote it (not escaped)
};

// Installs the sink (again: changes `print` and forgets FirstGrpcError). `print` false: lines
// are only remembered (clients, whose failures are reported from the call's status), unless
// GRPC_VERBOSITY or GRPC_TRACE is set in the environment.
void InstallGrpcLogSink(bool print);

// The first ERROR line gRPC logged since the sink was installed, as its description (the text
// before a " {" of details, without a leading status code such as "UNKNOWN:"), escaped; ""
// when there was none.
std::string FirstGrpcError();

// Writes `line` as the sink does (escaped, rate-limited).
void WriteGrpcLogLine(const GrpcLogLine& line);

// While alive, the sink collects lines instead of writing them (one capture at a time).
class GrpcLogCapture {
 public:
  GrpcLogCapture();
  ~GrpcLogCapture();
  GrpcLogCapture(const GrpcLogCapture&) = delete;
  GrpcLogCapture& operator=(const GrpcLogCapture&) = delete;
  // Ends the capture; returns what was collected.
  std::vector<GrpcLogLine> Stop();

  // The reason a failed bind's lines carry: the OS's (os_error:"Address already in use"), else
  // the first ERROR line's description (a host that does not resolve: "Name or service not
  // known"); escaped; "" when none.
  static std::string BindError(const std::vector<GrpcLogLine>& lines);

 private:
  bool active_ = true;
};

}  // namespace dcf::rpc
