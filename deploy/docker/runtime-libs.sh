# Sourced by build.sh and runtime-setup.sh: which shared libraries the runtime base image
# provides. Everything else a binary loads is bundled into PREFIX/lib by build.sh.
#
# runtime_provided SONAME CUDA(ON|OFF): true for glibc and the C++ runtime (in every base
# image) and, for the CUDA image, for the libraries of the CUDA runtime base image (cuBLAS,
# cudart) and of the NVIDIA container runtime (the driver's libcuda, libnvidia-*).
runtime_provided() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.*) return 0 ;;
    librt.so.* | libresolv.so.* | libutil.so.* | libstdc++.so.* | libgcc_s.so.*) return 0 ;;
  esac
  if [[ "$2" == ON ]]; then
    case "$1" in
      libcuda.so.* | libnvidia-*.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.*) return 0 ;;
    esac
  fi
  return 1
}
