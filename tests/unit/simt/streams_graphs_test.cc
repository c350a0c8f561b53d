// Streams as queues, stream capture and graphs, on both builds where CUDA defines the
// behaviour; the emulator's own checks (what a wait runs, pageable copies, the schedules,
// the trace) under DCF_CUDA_SIM.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/stream_kernels.h"

namespace dcf::cuda_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Page-locked host memory for async copies (freed on destruction).
template <typename T>
class Pinned {
 public:
  explicit Pinned(size_t n) : n_(n) {
    EXPECT_TRUE(CudaOk(cudaMallocHost(reinterpret_cast<void**>(&data_), n * sizeof(T))));
  }
  ~Pinned() { cudaFreeHost(data_); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  T* get() const { return data_; }
  T& operator[](size_t i) const { return data_[i]; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t n_;
};

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(DCF_CUDA_SIM)
    simt::ClearErrors();
#endif
    ASSERT_TRUE(CudaOk(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
  }
  void TearDown() override {
    EXPECT_TRUE(CudaOk(cudaStreamDestroy(stream_)));
#if defined(DCF_CUDA_SIM)
    simt::ClearErrors();
    simt::SetSchedule(simt::Schedule{});
#endif
  }
  cudaStream_t stream_ = nullptr;
};

// Upload, kernel, download on one stream, captured: nothing runs at capture; each launch of
// the instantiated graph runs the three nodes on what the staging buffer holds then.
TEST_F(StreamTest, CapturedStepReplaysOnCurrentInputs) {
  const int n = 300;
  Pinned<float> in(n), out(n);
  DeviceBuffer<float> d_in(n), d_out(n);
  for (int i = 0; i < n; ++i) out[i] = -7.0f;
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_TRUE(CudaOk(cudaStreamIsCapturing(stream_, &status)));
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_TRUE(CudaOk(
      cudaMemcpyAsync(d_in.get(), in.get(), in.bytes(), cudaMemcpyHostToDevice, stream_)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(d_in.get(), d_out.get(), 2.0f, 1.0f, n, stream_)));
  ASSERT_TRUE(CudaOk(
      cudaMemcpyAsync(out.get(), d_out.get(), out.bytes(), cudaMemcpyDeviceToHost, stream_)));
  cudaGraph_t graph = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &graph)));
  ASSERT_NE(graph, nullptr);
  ASSERT_TRUE(CudaOk(cudaStreamIsCapturing(stream_, &status)));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  EXPECT_EQ(out[0], -7.0f) << "captured work does not run";
  size_t nodes = 0;
  ASSERT_TRUE(CudaOk(cudaGraphGetNodes(graph, nullptr, &nodes)));
  EXPECT_EQ(nodes, 3u);

  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(CudaOk(cudaGraphInstantiate(&exec, graph, 0)));
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i + 100 * round);
    ASSERT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
    ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
    for (int i = 0; i < n; i += 37) {
      ASSERT_EQ(out[i], 2.0f * static_cast<float>(i + 100 * round) + 1.0f)
          << "round " << round << " i " << i;
    }
  }
  EXPECT_TRUE(CudaOk(cudaGraphExecDestroy(exec)));
  EXPECT_TRUE(CudaOk(cudaGraphDestroy(graph)));
}

// A fork into a second stream and the join back, through events.
TEST_F(StreamTest, CaptureForksAndJoinsThroughEvents) {
  const int n = 256;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.0f);
  DeviceBuffer<float> a(host), b(n), c(n);
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking)));
  ASSERT_TRUE(CudaOk(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming)));
  ASSERT_TRUE(CudaOk(cudaEventCreateWithFlags(&join, cudaEventDisableTiming)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));

  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(a.get(), b.get(), 1.0f, 1.0f, n, stream_)));  // b = a + 1
  ASSERT_TRUE(CudaOk(cudaEventRecord(fork, stream_)));
  ASSERT_TRUE(CudaOk(cudaStreamWaitEvent(side, fork, 0)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(b.get(), c.get(), 3.0f, 0.0f, n, side)));  // c = 3b
  ASSERT_TRUE(CudaOk(cudaEventRecord(join, side)));
  ASSERT_TRUE(CudaOk(cudaStreamWaitEvent(stream_, join, 0)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(c.get(), b.get(), 1.0f, -1.0f, n, stream_)));  // b = c - 1
  cudaGraph_t graph = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &graph)));
  size_t nodes = 0;
  ASSERT_TRUE(CudaOk(cudaGraphGetNodes(graph, nullptr, &nodes)));
  EXPECT_EQ(nodes, 3u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(CudaOk(cudaGraphInstantiate(&exec, graph, 0)));
  ASSERT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  const std::vector<float> got = b.ToHost();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], 3.0f * (i + 1.0f) - 1.0f) << i;

  // Without the join the capture cannot end.
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  ASSERT_TRUE(CudaOk(cudaEventRecord(fork, stream_)));
  ASSERT_TRUE(CudaOk(cudaStreamWaitEvent(side, fork, 0)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(b.get(), c.get(), 3.0f, 0.0f, n, side)));
  cudaGraph_t unjoined = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &unjoined), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(unjoined, nullptr);
  cudaGetLastError();

  EXPECT_TRUE(CudaOk(cudaGraphExecDestroy(exec)));
  EXPECT_TRUE(CudaOk(cudaGraphDestroy(graph)));
  EXPECT_TRUE(CudaOk(cudaEventDestroy(fork)));
  EXPECT_TRUE(CudaOk(cudaEventDestroy(join)));
  EXPECT_TRUE(CudaOk(cudaStreamDestroy(side)));
}

// What CUDA forbids while a stream is captured invalidates the capture.
TEST_F(StreamTest, SynchronisingACapturingStreamInvalidatesTheCapture) {
  DeviceBuffer<float> a(64), b(64);
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(a.get(), b.get(), 1.0f, 0.0f, 64, stream_)));
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_TRUE(CudaOk(cudaStreamIsCapturing(stream_, &status)));
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudaGetLastError();
}

TEST_F(StreamTest, MallocDuringAGlobalCaptureInvalidatesItButNotARelaxedOne) {
  void* p = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  EXPECT_EQ(cudaMalloc(&p, 256), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();

  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed)));
  ASSERT_TRUE(CudaOk(cudaMalloc(&p, 256)));
  ASSERT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &graph)));
  EXPECT_TRUE(CudaOk(cudaGraphDestroy(graph)));
  EXPECT_TRUE(CudaOk(cudaFree(p)));
}

TEST_F(StreamTest, TheLegacyStreamCannotBeUsedWhileABlockingStreamIsCaptured) {
  cudaStream_t blocking = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamCreate(&blocking)));
  DeviceBuffer<float> a(64), b(64);
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed)));
  EXPECT_EQ(LaunchAxpb(a.get(), b.get(), 1.0f, 0.0f, 64, nullptr), cudaErrorStreamCaptureImplicit);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(blocking, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  EXPECT_TRUE(CudaOk(cudaStreamDestroy(blocking)));
}

// New kernel arguments in a graph of the same shape: cudaGraphExecUpdate takes them; a
// different shape is refused.
TEST_F(StreamTest, ExecUpdateTakesNewParametersOfTheSameTopology) {
  const int n = 128;
  std::vector<float> ones(n, 1.0f);
  DeviceBuffer<float> in(ones), out(n);
  const auto capture = [&](float a, int kernels) {
    cudaGraph_t g = nullptr;
    EXPECT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
    for (int k = 0; k < kernels; ++k) {
      EXPECT_TRUE(CudaOk(LaunchAxpb(in.get(), out.get(), a, 0.0f, n, stream_)));
    }
    EXPECT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &g)));
    return g;
  };
  cudaGraph_t g2 = capture(2.0f, 1), g5 = capture(5.0f, 1), g_two = capture(5.0f, 2);
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(CudaOk(cudaGraphInstantiate(&exec, g2, 0)));
  ASSERT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  EXPECT_EQ(out.ToHost()[7], 2.0f);
  cudaGraphExecUpdateResultInfo info{};
  ASSERT_TRUE(CudaOk(cudaGraphExecUpdate(exec, g5, &info)));
  EXPECT_EQ(info.result, cudaGraphExecUpdateSuccess);
  ASSERT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  EXPECT_EQ(out.ToHost()[7], 5.0f);
  EXPECT_EQ(cudaGraphExecUpdate(exec, g_two, &info), cudaErrorGraphExecUpdateFailure);
  EXPECT_EQ(info.result, cudaGraphExecUpdateErrorTopologyChanged);
  cudaGetLastError();
  EXPECT_TRUE(CudaOk(cudaGraphExecDestroy(exec)));
  for (cudaGraph_t g : {g2, g5, g_two}) EXPECT_TRUE(CudaOk(cudaGraphDestroy(g)));
}

// A blocking stream's work is finished before later legacy-stream work (a synchronous copy).
TEST_F(StreamTest, TheLegacyStreamWaitsForBlockingStreams) {
  cudaStream_t blocking = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamCreate(&blocking)));
  const int n = 1000;
  std::vector<float> host(n, 3.0f);
  DeviceBuffer<float> in(host), out(n);
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  ASSERT_TRUE(CudaOk(LaunchAxpb(in.get(), out.get(), 2.0f, 0.5f, n, blocking)));
  const std::vector<float> got = out.ToHost();  // cudaMemcpy on the legacy stream
  EXPECT_EQ(got[0], 6.5f);
  EXPECT_EQ(got[n - 1], 6.5f);
  EXPECT_TRUE(CudaOk(cudaStreamDestroy(blocking)));
}

#if defined(DCF_CUDA_SIM)

// The emulator runs queued work only when the host waits for it: a copy on the legacy stream
// does not wait for a non-blocking stream (CUDA's rule), so it reads memory the kernel has not
// written yet -- the poison of a fresh allocation. On a GPU this is a race that usually
// passes; here it fails every time.
TEST_F(StreamTest, NonBlockingStreamsAreNotOrderedWithTheLegacyStream) {
  const int n = 64;
  std::vector<float> host(n, 1.0f);
  DeviceBuffer<float> in(host), out(n);
  ASSERT_TRUE(CudaOk(LaunchAxpb(in.get(), out.get(), 1.0f, 1.0f, n, stream_)));
  std::vector<uint32_t> bits(n);
  ASSERT_TRUE(CudaOk(cudaMemcpy(bits.data(), out.get(), n * 4, cudaMemcpyDeviceToHost)));
  EXPECT_EQ(bits[0], 0xffffffffu) << "the kernel has not run: cudaMalloc memory is 0xFF";
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  EXPECT_EQ(out.ToHost()[0], 2.0f);
}

TEST_F(StreamTest, QueriesReportPendingWorkOnceThenItFinishes) {
  DeviceBuffer<float> a(32), b(32);
  cudaEvent_t done = nullptr;
  ASSERT_TRUE(CudaOk(cudaEventCreate(&done)));
  EXPECT_TRUE(CudaOk(cudaStreamQuery(stream_)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(a.get(), b.get(), 1.0f, 0.0f, 32, stream_)));
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady);
  EXPECT_TRUE(CudaOk(cudaStreamQuery(stream_)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(a.get(), b.get(), 1.0f, 0.0f, 32, stream_)));
  ASSERT_TRUE(CudaOk(cudaEventRecord(done, stream_)));
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_TRUE(CudaOk(cudaEventQuery(done)));
  EXPECT_TRUE(CudaOk(cudaEventDestroy(done)));
}

// Pageable host memory in cudaMemcpyAsync: counted (and warned about once per call site); the
// source is taken at the call, as CUDA stages it; refused inside a capture.
TEST_F(StreamTest, AsyncCopiesFromPageableMemory) {
  std::vector<float> pageable(16, 4.0f);
  DeviceBuffer<float> d(16);
  const size_t before = simt::PageableAsyncCopies();
  ASSERT_TRUE(CudaOk(cudaMemcpyAsync(d.get(), pageable.data(), 64, cudaMemcpyHostToDevice,
                                     stream_)));
  pageable[0] = 9.0f;  // after the call: not seen by the copy
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  EXPECT_EQ(d.ToHost()[0], 4.0f);
  EXPECT_EQ(simt::PageableAsyncCopies(), before + 1);
  Pinned<float> pinned(16);
  ASSERT_TRUE(CudaOk(cudaMemcpyAsync(d.get(), pinned.get(), 64, cudaMemcpyHostToDevice, stream_)));
  EXPECT_EQ(simt::PageableAsyncCopies(), before + 1) << "pinned memory is not counted";

  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  EXPECT_EQ(cudaMemcpyAsync(d.get(), pageable.data(), 64, cudaMemcpyHostToDevice, stream_),
            cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
}

TEST_F(StreamTest, FreedAndFreshDeviceMemoryIsPoisoned) {
  float* p = nullptr;
  ASSERT_TRUE(CudaOk(cudaMalloc(&p, 64)));
  uint32_t bits[16];
  ASSERT_TRUE(CudaOk(cudaMemcpy(bits, p, 64, cudaMemcpyDeviceToHost)));
  EXPECT_EQ(bits[3], 0xffffffffu);
  std::vector<float> host(16, 1.0f);
  ASSERT_TRUE(CudaOk(cudaMemcpy(p, host.data(), 64, cudaMemcpyHostToDevice)));
  // A kernel queued before the free runs first (cudaFree synchronises the device).
  DeviceBuffer<float> out(16);
  ASSERT_TRUE(CudaOk(LaunchAxpb(p, out.get(), 1.0f, 1.0f, 16, stream_)));
  ASSERT_TRUE(CudaOk(cudaFree(p)));
  EXPECT_EQ(out.ToHost()[15], 2.0f);
}

// The schedules reorder blocks and threads; a result that depends on the order shows it.
TEST_F(StreamTest, SchedulesOrderBlocksAndThreads) {
  // A schedule orders the blocks of a grid as one OS thread runs them; with several
  // (DCF_SIMT_THREADS, the `threads` CTest repeat) blocks interleave as the OS schedules
  // those threads, so the order across blocks is the test's only under one.
  struct OneWorker {
    int saved = simt::WorkerThreads();
    OneWorker() { simt::SetWorkerThreads(1); }
    ~OneWorker() { simt::SetWorkerThreads(saved); }
  } one_worker;
  const int blocks = 6, threads = 40;
  struct Order {
    std::vector<unsigned int> blocks, threads;
    bool operator==(const Order&) const = default;
  };
  const auto run = [&](const simt::Schedule& s) {
    simt::SetSchedule(s);
    DeviceBuffer<unsigned int> counter(std::vector<unsigned int>{0u}), block_rank(blocks),
        thread_rank(blocks * threads);
    EXPECT_TRUE(CudaOk(LaunchOrder(counter.get(), block_rank.get(), thread_rank.get(), blocks,
                                   threads, stream_)));
    EXPECT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
    Order o{block_rank.ToHost(), thread_rank.ToHost()};
    o.threads.resize(threads);  // block 0's threads
    return o;
  };
  const Order linear = run({simt::ScheduleKind::kLinear, 0});
  EXPECT_THAT(linear.blocks, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_EQ(linear.threads[0], 0u);
  EXPECT_EQ(linear.threads[39], 39u);
  const Order reverse = run({simt::ScheduleKind::kReverse, 0});
  EXPECT_THAT(reverse.blocks, ElementsAre(5, 4, 3, 2, 1, 0));
  EXPECT_EQ(reverse.threads[39], 0u);
  EXPECT_EQ(reverse.threads[0], 39u);
  const Order random = run({simt::ScheduleKind::kRandom, 7});
  EXPECT_NE(random, linear);
  EXPECT_NE(random, reverse);
  EXPECT_EQ(run({simt::ScheduleKind::kRandom, 7}), random) << "the same seed, the same order";
  EXPECT_NE(run({simt::ScheduleKind::kRandom, 8}), random);

  // Float atomics summed in another order round differently.
  std::vector<float> values(512, 1.0f);
  values[0] = 1.0e8f;  // first: every 1 is lost to rounding; last: their sum is kept
  DeviceBuffer<float> in(values);
  const auto sum = [&](const simt::Schedule& s) {
    simt::SetSchedule(s);
    DeviceBuffer<float> total(std::vector<float>{0.0f});
    EXPECT_TRUE(CudaOk(LaunchFloatSum(in.get(), total.get(), 512, stream_)));
    EXPECT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
    return total.ToHost()[0];
  };
  EXPECT_NE(sum({simt::ScheduleKind::kLinear, 0}), sum({simt::ScheduleKind::kReverse, 0}));
}

TEST(ScheduleTest, ParsesTheThreeForms) {
  simt::Schedule s;
  ASSERT_TRUE(simt::ParseSchedule("reverse", &s));
  EXPECT_EQ(s.kind, simt::ScheduleKind::kReverse);
  ASSERT_TRUE(simt::ParseSchedule("random:1234", &s));
  EXPECT_EQ(s.kind, simt::ScheduleKind::kRandom);
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(simt::ScheduleName(s), "random:1234");
  ASSERT_TRUE(simt::ParseSchedule("linear", &s));
  EXPECT_EQ(s.kind, simt::ScheduleKind::kLinear);
  for (const char* bad : {"random", "random:", "random:x", "random:-1", "Reverse", ""}) {
    EXPECT_FALSE(simt::ParseSchedule(bad, &s)) << bad;
  }
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The trace: one line per operation the host issues, in issue order; a graph launch lists
// its nodes; captured work is not traced at capture.
TEST_F(StreamTest, TraceListsEveryOperation) {
  const std::string path = ::testing::TempDir() + "/simt_trace_test.jsonl";
  std::remove(path.c_str());
  const int n = 200;
  Pinned<float> host(n);
  DeviceBuffer<float> a(n), b(n);
  cudaEvent_t done = nullptr;
  ASSERT_TRUE(CudaOk(cudaEventCreateWithFlags(&done, cudaEventDisableTiming)));
  ASSERT_TRUE(CudaOk(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(a.get(), b.get(), 1.0f, 0.0f, n, stream_)));
  ASSERT_TRUE(CudaOk(cudaMemsetAsync(a.get(), 0, 16, stream_)));
  cudaGraph_t graph = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamEndCapture(stream_, &graph)));
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(CudaOk(cudaGraphInstantiate(&exec, graph, 0)));

  simt::SetTraceFile(path);
  simt::TraceStep(5, 2);
  ASSERT_TRUE(CudaOk(
      cudaMemcpyAsync(a.get(), host.get(), host.bytes(), cudaMemcpyHostToDevice, stream_)));
  ASSERT_TRUE(CudaOk(LaunchAxpb(a.get(), b.get(), 2.0f, 0.0f, n, stream_)));
  ASSERT_TRUE(CudaOk(cudaGraphLaunch(exec, stream_)));
  ASSERT_TRUE(CudaOk(cudaEventRecord(done, stream_)));
  ASSERT_TRUE(CudaOk(cudaEventSynchronize(done)));
  std::vector<float> pageable(n);
  ASSERT_TRUE(CudaOk(cudaMemcpy(pageable.data(), b.get(), n * 4, cudaMemcpyDeviceToHost)));
  ASSERT_TRUE(CudaOk(cudaStreamSynchronize(stream_)));
  simt::SetTraceFile("");

  EXPECT_THAT(
      ReadLines(path),
      ElementsAre(
          R"({"kind":"step","tokens":5,"seqs":2})",
          R"({"kind":"memcpy","dir":"h2d","bytes":800,"async":true,"pinned":true})",
          R"({"kind":"kernel","name":"AxpbKernel","grid":[2,1,1],"block":[128,1,1],"smem":0})",
          R"({"kind":"graph","nodes":2})",
          R"({"kind":"kernel","name":"AxpbKernel","grid":[2,1,1],"block":[128,1,1],"smem":0,"in_graph":true})",
          R"({"kind":"memset","bytes":16,"async":true,"in_graph":true})",
          R"({"kind":"event","call":"record"})", R"({"kind":"sync","call":"cudaEventSynchronize"})",
          R"({"kind":"memcpy","dir":"d2h","bytes":800,"async":false,"pinned":false})",
          R"({"kind":"sync","call":"cudaStreamSynchronize"})"));
  std::remove(path.c_str());
  EXPECT_TRUE(CudaOk(cudaGraphExecDestroy(exec)));
  EXPECT_TRUE(CudaOk(cudaGraphDestroy(graph)));
  EXPECT_TRUE(CudaOk(cudaEventDestroy(done)));
}

#endif  // DCF_CUDA_SIM

}  // namespace
}  // namespace dcf::cuda_test
