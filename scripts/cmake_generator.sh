# shellcheck shell=bash
# Sourced by the build and test scripts. dcf_generator_args BUILD_DIR prints the -G flag for
# a new build directory: Ninja when it is installed (scripts/setup.sh installs it), since the
# Makefiles CMake writes build a list of targets one after another (the top-level Makefile is
# .NOTPARALLEL: the three sanitizer test binaries took 593 s with make, 166 s with ninja, on 2
# cores) and start a target's objects only once every library it links is archived. A
# directory already configured keeps its generator (CMake refuses to switch), so nothing is
# printed for it.
dcf_generator_args() {
  if [[ ! -f "$1/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
    echo "-G Ninja"
  fi
}
