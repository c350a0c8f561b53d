#include "proto/rpc/grpc_log.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "engine/common/log_text.h"
#include "gtest/gtest.h"

namespace dcf::rpc {
namespace {

// What the sink wrote to stderr while `log` ran, one entry per line.
template <typename F>
std::vector<std::string> StderrLines(F log) {
  gpr_log_verbosity_init();  // what grpc_init does: gRPC logs nothing before it
  ::testing::internal::CaptureStderr();
  log();
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  return lines;
}

TEST(LogTextTest, EscapesWhatCouldBreakTheLine) {
  EXPECT_EQ(LogText("plain text: ok", 100), "plain text: ok");
  EXPECT_EQ(LogText("a\nb\x1b[31m\\\xff", 100), "a\\x0ab\\x1b[31m\\\\\\xff");
  EXPECT_EQ(LogText("abcdef", 3), "abc...(6 bytes)");
}

// The hpack parser logs an invalid header value verbatim (gRPC 1.51): the sink writes it as
// one line, with no raw newline or ESC, tagged as gRPC's.
TEST(GrpcLogTest, ForgedLinesAndEscapeCodesStayInsideOneEscapedLine) {
  InstallGrpcLogSink(/*print=*/true);
  const std::vector<std::string> lines = StderrLines([] {
    gpr_log(GPR_ERROR, "Error parsing metadata: value=X\n2026-12-01T00:00:00Z INFO "
                       "generate_reactor.cc:372] request id=FORGED outcome=eos \x1b[31m");
  });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StrContains(lines[0], " ERROR grpc_log_test.cc:"));
  EXPECT_TRUE(absl::StrContains(lines[0], "] gRPC: Error parsing metadata: value=X\\x0a2026-"));
  EXPECT_TRUE(absl::StrContains(lines[0], "outcome=eos \\x1b[31m")) << lines[0];
  EXPECT_EQ(lines[0].find('\x1b'), std::string::npos);
}

TEST(GrpcLogTest, AFloodFromOneSiteIsRateLimited) {
  InstallGrpcLogSink(/*print=*/true);
  const std::vector<std::string> lines = StderrLines([] {
    for (int i = 0; i < 500; ++i) gpr_log(GPR_ERROR, "flood %d", i);
    gpr_log(GPR_ERROR, "another site");
  });
  // The burst from the flooding site (plus at most one refilled token), and the other site.
  ASSERT_GE(lines.size(), static_cast<size_t>(kBurst) + 1);
  EXPECT_LE(lines.size(), static_cast<size_t>(kBurst) + 2);
  EXPECT_TRUE(absl::StrContains(lines[0], "gRPC: flood 0"));
  EXPECT_TRUE(absl::StrContains(lines.back(), "gRPC: another site"));
}

TEST(GrpcLogTest, ClientsRememberTheFirstErrorWithoutPrintingIt) {
  if (std::getenv("GRPC_VERBOSITY") != nullptr) GTEST_SKIP() << "GRPC_VERBOSITY prints";
  InstallGrpcLogSink(/*print=*/false);
  const std::vector<std::string> lines = StderrLines([] {
    gpr_log(GPR_ERROR, "Could not load any root certificate.");
    gpr_log(GPR_ERROR, "Invalid private key. {file:\"x.cc\", line:1}");
  });
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(FirstGrpcError(), "Could not load any root certificate.");
}

TEST(GrpcLogTest, ACaptureCollectsAndNamesTheBindError) {
  InstallGrpcLogSink(/*print=*/true);
  std::vector<GrpcLogLine> lines;
  const std::vector<std::string> printed = StderrLines([&lines] {
    GrpcLogCapture capture;
    gpr_log(GPR_ERROR, "UNKNOWN:No address added out of total 1 resolved for "
                       "'[::]:1' {created_time:\"x\", children:[UNKNOWN:Failed to add any "
                       "wildcard listeners {os_error:\"Address already in use\"}]}");
    lines = capture.Stop();
  });
  EXPECT_TRUE(printed.empty());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(GrpcLogCapture::BindError(lines), "Address already in use");
  // Review finding 4: without an OS error, the first ERROR line's description.
  lines[0].message = "UNKNOWN:Name or service not known {created_time:\"x\"}";
  EXPECT_EQ(GrpcLogCapture::BindError(lines), "Name or service not known");
  EXPECT_EQ(GrpcLogCapture::BindError({}), "");
}

}  // namespace
}  // namespace dcf::rpc
