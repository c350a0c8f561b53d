# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/sanitizers.sh. dcf_ctest_lanes CTEST_ARGS... runs the
# selected tests as two CTest processes side by side, each with the -j the arguments give:
# one runs the integration tests (label `integration`) and the emulator's schedule repeats
# (label `side_lane`: 86 s of CPU-bound test time that fills this lane's idle core), the
# other every other test. An integration test spends most of its time waiting on a server
# (timeouts, streams, restarts: test_abuse took 70 s of wall time for 10 s of CPU), so in one
# `-j2` queue each held a slot of one of the machine's two cores while it slept (the ASan
# pass: 598 s in one queue, 435 s in two lanes; the plain pass: 472 s in one queue, 313 s in
# two with the schedule repeats moved). The integration lane's lines stream as they come,
# prefixed `[integration]`, so a run cut off still shows them; each lane ends with its own
# summary. The exit status is non-zero when either lane failed. CTest's files under
# Testing/Temporary (LastTest.log, the cost data) are shared by the lanes: --rerun-failed sees
# the lane that finished last.
dcf_ctest_lanes() {
  local status=0 integration=0 pid
  # The subshell restores SIGINT and SIGQUIT, which bash ignores in background jobs, so that
  # Ctrl-C reaches this lane's tests and servers too.
  (
    trap - INT QUIT
    set -o pipefail
    ctest "$@" -L "integration|side_lane" 2>&1 | sed -u 's/^/[integration] /'
  ) &
  pid=$!
  ctest "$@" -LE "integration|side_lane" || status=$?
  wait "${pid}" || integration=$?
  [[ ${status} -eq 0 && ${integration} -eq 0 ]]
}
