// The emulator's trace: with DCF_SIMT_TRACE=FILE (or SetTraceFile, simt_testing.h) every
// device operation the host issues appends one JSON object per line to FILE, so that CI can
// count what a step costs (docs/CUDA_SIM.md, "The trace"). Lines are written when the host
// issues the operation (not when the emulator runs it), in issue order:
//   {"kind":"step","tokens":T,"seqs":S}                     a backend step begins (TraceStep)
//   {"kind":"kernel","name":"K","grid":[x,y,z],"block":[x,y,z],"smem":BYTES}
//   {"kind":"gemm","m":M,"n":N,"k":K}                        the GEMM library's stand-in
//   {"kind":"memcpy","dir":"h2d"|"d2h"|"d2d"|"h2h","bytes":B,"async":BOOL,"pinned":BOOL}
//   {"kind":"memset","bytes":B,"async":BOOL}
//   {"kind":"event","call":"record"|"wait"}                 cudaEventRecord, cudaStreamWaitEvent
//   {"kind":"sync","call":"cudaStreamSynchronize"|"cudaEventSynchronize"|"cudaDeviceSynchronize"}
//   {"kind":"query","call":"cudaStreamQuery"|"cudaEventQuery"}
//   {"kind":"graph","nodes":N}                                cudaGraphLaunch, followed by
//       its N nodes in the graph's order as kernel, gemm, memcpy, memset lines with
//       "in_graph":true
// Work issued while a stream is captured is not traced then: it appears, in_graph, at each
// launch of a graph instantiated from the capture. "pinned" is false when the host side of a
// copy is pageable memory (not from cudaMallocHost). A synchronous cudaMemcpy is one memcpy
// line with "async":false (it also waits, and is not repeated as a sync line).
// Thread-safe; lines of concurrent threads do not interleave. The file is opened in append
// mode on first use and flushed after every line.
#pragma once

#include <string>
#include <vector>

namespace dcf::simt {

// A backend step of `tokens` tokens over `seqs` sequences begins (DCF_TRACE_STEP in
// cuda_compat.h expands to this in emulator builds).
void TraceStep(int tokens, int seqs);

namespace detail {

struct Work;

bool TraceEnabled();
// The line of `work`, issued to a stream (`async`: by an Async call or a launch).
void TraceWork(const Work& work, bool async);
void TraceCall(const char* kind, const char* call);  // sync, query and event lines
// A graph launch and its nodes, in the graph's order.
void TraceGraph(const std::vector<const Work*>& nodes);

}  // namespace detail
}  // namespace dcf::simt
