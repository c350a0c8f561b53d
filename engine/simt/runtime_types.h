// The CUDA runtime's types for the SIMT emulator: cudaError_t with CUDA's codes, memcpy
// kinds, function attributes, stream and event handles and flags, cudaDeviceProp. Values
// equal the toolkit's (driver_types.h) so logs read the same in both builds. The types live
// in dcf::simt and are brought into the global namespace, so that the emulator's symbols
// never collide with the real runtime's when both builds are linked into one binary.
#pragma once

#include <cstddef>

namespace dcf::simt {

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorAssert = 710,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorGraphExecUpdateFailure = 910,
  cudaErrorUnknown = 999,
};
using cudaError_t = cudaError;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

// Opaque handles. Streams are queues of device work, run when the host waits (runtime.h);
// events mark a point in a stream and record the host time when the work reaches it.
// Graphs hold captured work (cudaStreamBeginCapture ... cudaStreamEndCapture), executable
// graphs an instantiated copy, nodes one piece of it.
struct Stream;
struct Event;
struct Graph;
struct GraphExec;
struct GraphNode;
using cudaStream_t = Stream*;
using cudaEvent_t = Event*;
using cudaGraph_t = Graph*;
using cudaGraphExec_t = GraphExec*;
using cudaGraphNode_t = GraphNode*;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaGraphExecUpdateResult {
  cudaGraphExecUpdateSuccess = 0x0,
  cudaGraphExecUpdateError = 0x1,
  cudaGraphExecUpdateErrorTopologyChanged = 0x2,
  cudaGraphExecUpdateErrorNodeTypeChanged = 0x3,
  cudaGraphExecUpdateErrorFunctionChanged = 0x4,
  cudaGraphExecUpdateErrorParametersChanged = 0x5,
  cudaGraphExecUpdateErrorNotSupported = 0x6,
};

struct cudaGraphExecUpdateResultInfo {
  cudaGraphExecUpdateResult result;
  cudaGraphNode_t errorNode;
  cudaGraphNode_t errorFromNode;
};

inline constexpr unsigned int cudaStreamDefault = 0x00;
inline constexpr unsigned int cudaStreamNonBlocking = 0x01;
inline constexpr unsigned int cudaEventDefault = 0x00;
inline constexpr unsigned int cudaEventBlockingSync = 0x01;
inline constexpr unsigned int cudaEventDisableTiming = 0x02;

// The emulated device's properties (a subset of CUDA's struct; same field names).
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;       // 48 KiB: the default per-block limit
  size_t sharedMemPerBlockOptin;  // the most a kernel may opt into (cudaFuncSetAttribute)
  size_t sharedMemPerMultiprocessor;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  int l2CacheSize;
};

// Limits of the emulated device, modelled on an H100/H200 (sm_90).
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr size_t kDefaultSharedPerBlock = 48 * 1024;
inline constexpr size_t kMaxSharedPerBlockOptin = 227 * 1024;

}  // namespace dcf::simt

using dcf::simt::cudaDeviceProp;
using dcf::simt::cudaError;
using dcf::simt::cudaError_t;
using dcf::simt::cudaEvent_t;
using dcf::simt::cudaGraph_t;
using dcf::simt::cudaGraphExec_t;
using dcf::simt::cudaGraphExecUpdateResult;
using dcf::simt::cudaGraphExecUpdateResultInfo;
using dcf::simt::cudaGraphNode_t;
using dcf::simt::cudaStreamCaptureMode;
using dcf::simt::cudaStreamCaptureStatus;
using dcf::simt::cudaEventBlockingSync;
using dcf::simt::cudaEventDefault;
using dcf::simt::cudaEventDisableTiming;
using dcf::simt::cudaFuncAttribute;
using dcf::simt::cudaMemcpyKind;
using dcf::simt::cudaStream_t;
using dcf::simt::cudaStreamDefault;
using dcf::simt::cudaStreamNonBlocking;
// Enumerators, as CUDA's are unscoped globals.
using dcf::simt::cudaErrorAssert;
using dcf::simt::cudaErrorIllegalAddress;
using dcf::simt::cudaErrorInitializationError;
using dcf::simt::cudaErrorInsufficientDriver;
using dcf::simt::cudaErrorInvalidConfiguration;
using dcf::simt::cudaErrorInvalidDevice;
using dcf::simt::cudaErrorInvalidDeviceFunction;
using dcf::simt::cudaErrorInvalidDevicePointer;
using dcf::simt::cudaErrorInvalidMemcpyDirection;
using dcf::simt::cudaErrorInvalidResourceHandle;
using dcf::simt::cudaErrorIllegalState;
using dcf::simt::cudaErrorInvalidValue;
using dcf::simt::cudaErrorLaunchFailure;
using dcf::simt::cudaErrorLaunchOutOfResources;
using dcf::simt::cudaErrorMemoryAllocation;
using dcf::simt::cudaErrorNoDevice;
using dcf::simt::cudaErrorNotReady;
using dcf::simt::cudaErrorNotSupported;
using dcf::simt::cudaErrorUnknown;
using dcf::simt::cudaErrorCapturedEvent;
using dcf::simt::cudaErrorGraphExecUpdateFailure;
using dcf::simt::cudaErrorStreamCaptureImplicit;
using dcf::simt::cudaErrorStreamCaptureInvalidated;
using dcf::simt::cudaErrorStreamCaptureIsolation;
using dcf::simt::cudaErrorStreamCaptureUnjoined;
using dcf::simt::cudaErrorStreamCaptureUnmatched;
using dcf::simt::cudaErrorStreamCaptureUnsupported;
using dcf::simt::cudaErrorStreamCaptureWrongThread;
using dcf::simt::cudaGraphExecUpdateError;
using dcf::simt::cudaGraphExecUpdateErrorFunctionChanged;
using dcf::simt::cudaGraphExecUpdateErrorNodeTypeChanged;
using dcf::simt::cudaGraphExecUpdateErrorNotSupported;
using dcf::simt::cudaGraphExecUpdateErrorParametersChanged;
using dcf::simt::cudaGraphExecUpdateErrorTopologyChanged;
using dcf::simt::cudaGraphExecUpdateSuccess;
using dcf::simt::cudaStreamCaptureModeGlobal;
using dcf::simt::cudaStreamCaptureModeRelaxed;
using dcf::simt::cudaStreamCaptureModeThreadLocal;
using dcf::simt::cudaStreamCaptureStatusActive;
using dcf::simt::cudaStreamCaptureStatusInvalidated;
using dcf::simt::cudaStreamCaptureStatusNone;
using dcf::simt::cudaFuncAttributeMaxDynamicSharedMemorySize;
using dcf::simt::cudaMemcpyDefault;
using dcf::simt::cudaMemcpyDeviceToDevice;
using dcf::simt::cudaMemcpyDeviceToHost;
using dcf::simt::cudaMemcpyHostToDevice;
using dcf::simt::cudaMemcpyHostToHost;
using dcf::simt::cudaSuccess;
