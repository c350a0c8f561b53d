#!/usr/bin/env bash
# The test suites under sanitizers (scripts/test.sh runs this; SANITIZERS=0 skips it):
#   build-asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer) over the unit
#               and integration suites: every test binary, and the servers and tools the
#               integration tests start, are instrumented. The test binaries' own sources
#               (not the libraries they test) compile with ASan only: with UBSan too, the -O1
#               ones took 1,039 s of CPU instead of 693 (tests/CMakeLists.txt,
#               dcf_test_sanitizers).
#   build-tsan  ThreadSanitizer over the engine (serving) and server unit tests, and the CPU
#               backend's thread teams (team_test and attention_tile_test's *OnATeam*:
#               teams of std::threads, every kind of product and the attention on them).
#               backends_engine_test is built without cuda-sim here (CMake's
#               DCFORMER_ENGINE_TEST_CUDA_SIM=OFF): the run left its cuda-sim cases out, and
#               what it loses is two idle engines over cuda-sim in one case
#               (EngineTest.PipelineStepsModeResolvesByBackend).
#               Debian's absl::Mutex is uninstrumented; tests/sanitizers/tsan_absl_mutex.cc
#               tells TSan about it. OpenMP runs with one thread (libgomp is not instrumented
#               either; team_test skips its cases on OpenMP threads here).
# Zero findings: any report fails the run. A UBSan report aborts (its abort_on_error: with
# only halt_on_error the process exits 1, the very exit a test of the server's own exit 1
# waits for, which then failed on a missing log line, not on the report). Suppressions
# (tests/sanitizers/*.supp) hold only third-party code, each entry explained; one test
# retries on a false report of the runtime itself (test_abuse FileDescriptorTest: UBSan's
# vptr check needs a free descriptor). The CUDA backend is not built here (no toolkit);
# its kernels run on the SIMT emulator (cuda-sim), whose fiber switches are announced to ASan
# and TSan (engine/simt/fiber_context.h), so every cuda-sim test runs under ASan+UBSan too:
# each kernel's device loads are bounds-checked per cudaMalloc allocation, a use after
# cudaFree is caught, misaligned vector loads are flagged. The cuda-sim tests run as a second
# CTest pass with detect_stack_use_after_return=0: with it, ASan maps a fake stack for every
# emulated thread of every block, which made cuda_contract_test_sim 50x slower (7.5 s -> 389 s
# under load); every other test keeps it. The schedule, thread-pool and ucontext repeats of
# the cuda-sim tests are not run again here (same code, another order), nor the golden cases
# of speculation on cuda-sim (each runs a whole model twice, ~15 s plain: the verify path's
# host code runs under ASan in SpecDecodeStopTest and
# BackendTest.VerifyRowsSampleLikePlainDecoding on cuda-sim), nor SpecDecodeStreamTest on
# cuda-sim (speculation under preemption with prefix caching: 12 requests through two
# engines, 240 s of the pass's 1,632 test-seconds under ASan; it runs under ASan on cpu;
# on cuda-sim preemption runs in EngineBackendTest.*ThroughPreemption/cuda_sim, speculation
# beside pipelined steps in EngineBackendTest.PipelinedStepsWithSpeculatingRequests*/cuda_sim,
# prefix caching in EngineBackendTest.PrefixCacheAfterPipelinedSteps*/cuda_sim). Nor the
# five whole-model cuda-sim runs that were 145 of the pass's 168 s of plain test time and ~85% of its 22
# minutes under ASan (CI ran out of room; 440 s without them):
# GenerateCliTest.CudaSimGemvPathReproducesGoldenGreedy and DecodeTraceTest (DCF_SIM_GEMV=1:
# the GEMV kernels run under ASan in cuda_kernels_test_sim's Gemv cases, and the backend's
# wiring of them, the norm prologue and activation epilogue of each layer, the final norm's
# gather into the logits GEMV and dcpythia's parallel block, in two cases of
# CudaSimGemvPathTest on small random models: dcformer with int8 weights and dcpythia with
# float32 ones; its other three cases are left out), PrefixCacheCudaSimTest and
# EngineTest.CudaSimBatchingWithPreemptionMatchesSoloRuns (preemption on cuda-sim still runs
# in EngineBackendTest.*ThroughPreemption/cuda_sim;
# prefix caching in PrefixCacheStreamTest on the cpu backend). Nor, in the first pass, the
# two held-out perplexity tests of the trained model (50 s plain: 27,330 scored tokens of
# kernels the golden cases run), nor the quantized whole-model runs on cuda-sim
# (CudaSimBackendTest.QuantizedDecodeRowsDoNotDependOnTheBatch: GEMV grids, ~20 s plain;
# KjvModelTest.CudaSimPerplexity*: emulated prefill windows; golden_test's
# CudaSimQuantAgreementTest cases: 92 s under ASan for the bfloat16 ones; their kernels run
# under ASan in cuda_kernels_test_sim's GemvQuant / GemmQuant cases, and the backend's
# quantized products on both paths in CudaSimGemvPathTest's int8 case). Nor every case of the
# two golden families that turn a feature on and off on the CPU backend (PrefixCacheGoldenTest,
# 72 cases, SpecDecodeGoldenTest, 18: 743 test-seconds under ASan at load ~6): the first pass
# runs 27 of them that pair every value of each parameter with every value of each other one
# (ASAN_GOLDEN below; 210 of those 743 test-seconds), so what ASan no longer sees is only
# three or more values together, e.g. dcpythia with chunks of 1 at block size 16.
# All of these run in the plain CTest pass. Left out of ASan, as they run no server or engine
# code of their own: the packaging checks (deploy, kubernetes, gpu bundle, monitoring
# queries), the PyTorch baseline, the golden cases repeated on the portable kernels, and the
# documents' commands (integration.test_docs: 450 s of the pass's test time, the longest
# test of its integration lane; the server, clients and benches it runs are run under ASan
# by the other integration tests and the unit tests, except dcformer-cpu-attention-bench,
# whose kernels run under ASan in the cpu attention tests; what is lost is the documents'
# own flag combinations under ASan).
# Usage: scripts/sanitizers.sh [asan|tsan|all=all]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
WHICH="${1:-all}"
JOBS="${JOBS:-$(nproc)}"
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
SUPP="${ROOT}/tests/sanitizers"
source scripts/cmake_generator.sh
source scripts/ctest_lanes.sh

configure() {  # build_dir sanitizer [cmake args...]
  # -O1 -g1: line tables for the reports, and less to compile than -O2 -g (the CI machine
  # has 2 cores); the engine tests are compute-bound, so not -O0. The server, the clients and
  # the protobuf code compile at -O0 (dcf_sanitizer_build_at_O0, CMakeLists.txt).
  # shellcheck disable=SC2046  # the -G flag is two words or none
  cmake -S . -B "$1" $(dcf_generator_args "$1") -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DDCFORMER_CUDA=OFF -DDCFORMER_SANITIZE="$2" "${LAUNCHER[@]}" "${@:3}" >/dev/null
}

# CTest names of the cuda-sim cases: the *_test_sim binaries' prefix, parameters named
# after the backend, and the runs of dcformer-attention-bench (cuda-sim without a GPU).
SIM_TESTS='DecodeTraceTest|DecodeGraphTest|CudaGemmPlansTest|_sim\.|_sim$|cuda_sim|CudaSim|SixteenBitAgreement|^AttentionBenchCliTest\.(EmulatorRun|DecodeMode)'
REPEATS='\.schedule_|_sim\.(threads|ucontext)$|SpecDecodeGoldenTest\..*/cuda_sim'
ASAN_EXCLUDE='^portable_isa/|^baseline\.|^integration\.test_(deploy|kubernetes|gpu_bundle|monitoring|docs)$'
WHOLE_MODEL='^GenerateCliTest\.CudaSimGemvPath|^Models/CudaSimGemvPathTest\..*/(dcformer_dense|dcformer_fp8|dcpythia_int8)|^CudaSimBackendTest\.QuantizedDecodeRows|^DecodeTraceTest\.|^PrefixCacheCudaSimTest\.|^EngineTest\.CudaSimBatchingWithPreemption|^KjvModelTest\.(HeldoutPerplexity|CudaSimPerplexity)|^Cases/CudaSimQuantAgreementTest\.|^Backends/SpecDecodeStreamTest\..*/cuda_sim'

# The golden families' cases that the first pass runs (names after the family's '/'): every
# value of each parameter meets every value of each other one. PrefixCacheGoldenTest, float32
# cache: each block size with each prefill chunk (0 = the whole prompt) once, the model
# cycling so that each model meets every block size and every chunk (12 of 36); 16-bit caches:
# each KV dtype with each block size and each chunk, each block size with each chunk, each
# model with both dtypes and both block sizes (6 of 36). SpecDecodeGoldenTest (cpu): each model
# with each block size, prefix caching alternating so that each model and each block size
# runs with it and without (9 of 18; its cuda-sim cases are REPEATS).
GOLDEN_FAMILIES='^Golden/(PrefixCacheGoldenTest|SpecDecodeGoldenTest)\.'
ASAN_GOLDEN=(
  dcformer_f32_short_prompt_B1_chunk0   dcformer_f32_long_prompt_B1_chunk1
  dcpythia_f16_bin_B1_chunk5            dcformer_f32_short_prompt_B1_chunk16
  dcformer_f32_long_prompt_B5_chunk0    dcpythia_f16_bin_B5_chunk1
  dcformer_f32_short_prompt_B5_chunk5   dcformer_f32_long_prompt_B5_chunk16
  dcpythia_f16_bin_B16_chunk0           dcformer_f32_short_prompt_B16_chunk1
  dcformer_f32_long_prompt_B16_chunk5   dcpythia_f16_bin_B16_chunk16
  dcformer_f32_short_prompt_B1_chunk0_kvBF16  dcformer_f32_short_prompt_B16_chunk5_kvF16
  dcformer_f32_long_prompt_B1_chunk1_kvF16    dcformer_f32_long_prompt_B16_chunk1_kvBF16
  dcpythia_f16_bin_B1_chunk5_kvBF16           dcpythia_f16_bin_B16_chunk0_kvF16
  cpu_dcformer_f32_short_prompt_B1_uncached   cpu_dcformer_f32_short_prompt_B5_cached
  cpu_dcformer_f32_short_prompt_B16_uncached  cpu_dcformer_f32_long_prompt_B1_cached
  cpu_dcformer_f32_long_prompt_B5_uncached    cpu_dcformer_f32_long_prompt_B16_cached
  cpu_dcpythia_f16_bin_B1_uncached            cpu_dcpythia_f16_bin_B5_cached
  cpu_dcpythia_f16_bin_B16_uncached
)
ctest_count() { ctest --test-dir build-asan -N "$@" | sed -n 's/^Total Tests: //p'; }
# The other cpu cases of GOLDEN_FAMILIES in build-asan, as one regex for -E (CTest cannot
# exclude "all but"): `^name |^name |...` (each name is followed by "  # GetParam() = ...").
# No parentheses: CTest's regular expressions take at most 9 groups, and with a 10th ctest
# silently selects everything. Fails when a name in ASAN_GOLDEN is not a case of the build,
# or when the families no longer have the 90 cases ASAN_GOLDEN was chosen from. (set -e does
# not reach into a command substitution: each step checks its own status.)
asan_golden_left_out() {
  local keep total found names
  keep="/($(IFS='|'; echo "${ASAN_GOLDEN[*]}"))( |\$)"
  total=$(ctest_count -R "${GOLDEN_FAMILIES}" -E "${SIM_TESTS}") || return 1
  if [[ "${total}" != 90 ]]; then
    echo "sanitizers: the golden families have ${total} cpu cases, not the 90 that" \
         "ASAN_GOLDEN's pairwise subset was chosen from: choose it again" >&2
    return 1
  fi
  found=$(ctest_count -R "${GOLDEN_FAMILIES}.*${keep}") || return 1
  if [[ "${found}" != "${#ASAN_GOLDEN[@]}" ]]; then
    echo "sanitizers: ${found} of the ${#ASAN_GOLDEN[@]} ASAN_GOLDEN cases are in build-asan" >&2
    return 1
  fi
  names=$(ctest --test-dir build-asan -N -R "${GOLDEN_FAMILIES}" -E "${SIM_TESTS}|${keep}" |
          sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/^\1 /p' | sed 's/\./\\./g' |
          paste -sd'|') || return 1
  if [[ $(tr '|' '\n' <<< "${names}" | grep -c .) != $((total - found)) ]]; then
    echo "sanitizers: could not list the golden cases left out of ASan" >&2
    return 1
  fi
  echo "${names}"
}

if [[ "${WHICH}" == all || "${WHICH}" == asan ]]; then
  start=$(date +%s)
  configure build-asan "address,undefined"
  cmake --build build-asan -j"${JOBS}"
  built=$(date +%s)
  asan_ctest() {  # ctest|dcf_ctest_lanes detect_stack_use_after_return ctest-args...
    local RUNNER="$1" suar="$2"
    shift 2
    DCF_SANITIZE="address,undefined" \
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=${suar}" \
    LSAN_OPTIONS="suppressions=${SUPP}/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1" \
      "${RUNNER}" --test-dir build-asan -L "unit|integration" --output-on-failure -j"${JOBS}" \
        --timeout 1800 "$@"
  }
  golden_left_out=$(asan_golden_left_out)
  first_pass_out="${SIM_TESTS}|${ASAN_EXCLUDE}|${WHOLE_MODEL}|${golden_left_out}"
  sim_pass_out="${REPEATS}|${ASAN_EXCLUDE}|${WHOLE_MODEL}"
  # The exclusions must have taken (see asan_golden_left_out): as many fewer cases as names
  # left out; and the cuda-sim pass selects some cases and leaves some of them out.
  n_left=$(tr '|' '\n' <<< "${golden_left_out}" | grep -c .)
  n_first=$(ctest_count -E "${first_pass_out}")
  n_before=$(ctest_count -E "${SIM_TESTS}|${ASAN_EXCLUDE}|${WHOLE_MODEL}")
  n_sim_all=$(ctest_count -R "${SIM_TESTS}")
  n_sim=$(ctest_count -R "${SIM_TESTS}" -E "${sim_pass_out}")
  if [[ -z "${n_first}" || -z "${n_before}" || -z "${n_sim_all}" || -z "${n_sim}" ]] ||
     (( n_first != n_before - n_left || n_sim_all == 0 || n_sim >= n_sim_all )); then
    echo "sanitizers: the passes' selections did not apply (first pass ${n_first} of" \
         "${n_before} - ${n_left}, cuda-sim ${n_sim} of ${n_sim_all})" >&2
    exit 1
  fi
  # The first pass runs its integration tests beside the others (scripts/ctest_lanes.sh).
  asan_ctest dcf_ctest_lanes 1 -E "${first_pass_out}"
  others=$(date +%s)
  asan_ctest ctest 0 -R "${SIM_TESTS}" -E "${sim_pass_out}"
  echo "sanitizers: asan+ubsan build $((built - start)) s, tests $((others - built)) s," \
    "cuda-sim tests $(( $(date +%s) - others )) s"
fi

if [[ "${WHICH}" == all || "${WHICH}" == tsan ]]; then
  start=$(date +%s)
  # backends_engine_test without cuda-sim (DCFORMER_ENGINE_TEST_CUDA_SIM): the CUDA backend
  # and the emulator were a fifth of this build, for cases the filter below kept out of the run.
  configure build-tsan thread -DDCFORMER_ENGINE_TEST_CUDA_SIM=OFF
  TSAN_TARGETS=(serving_unit_test backends_engine_test server_unit_test team_test
                attention_tile_test)
  # Each target's tests (gtest filter): all but any cuda-sim ones (none is built here now);
  # of attention_tile_test only the attention on teams of std::threads.
  declare -A TSAN_FILTER=([attention_tile_test]='*OnATeam*')
  cmake --build build-tsan -j"${JOBS}" --target "${TSAN_TARGETS[@]}"
  built=$(date +%s)
  for t in "${TSAN_TARGETS[@]}"; do
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=${SUPP}/tsan.supp" \
      "build-tsan/bin/tests/${t}" --gtest_brief=1 \
        --gtest_filter="${TSAN_FILTER[${t}]:--*CudaSim*:*cuda_sim*}"
  done
  echo "sanitizers: tsan build $((built - start)) s, tests $(( $(date +%s) - built )) s"
fi
