# Sourced by scripts/test.sh and scripts/sanitizers.sh. dcf_ctest_lanes CTEST_ARGS... runs the
# selected tests as two CTest processes side by side: the integration tests (label
# `integration`) in one and every other test in the other, each with the -j the arguments
# give. An integration test spends most of its time waiting on a server (timeouts, streams,
# restarts: test_abuse 70 s of wall time for 10 s of CPU), so in one `-j2` queue each held a
# slot of one of the machine's two cores while it slept. The integration lane's log is printed
# after the other lane's, whole; the exit status is non-zero when either lane failed.
dcf_ctest_lanes() {
  local log status=0 integration=0
  log="$(mktemp)"
  ctest "$@" -L integration >"${log}" 2>&1 &
  local pid=$!
  ctest "$@" -LE integration || status=$?
  wait "${pid}" || integration=$?
  echo "---- the integration lane (ctest $* -L integration) ----"
  cat "${log}"
  rm -f "${log}"
  [[ ${status} -eq 0 && ${integration} -eq 0 ]]
}
