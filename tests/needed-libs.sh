#!/usr/bin/env bash
# The shared libraries dtrain's binaries name (ELF NEEDED) are the allowed
# ones: glibc's, the compiler's runtimes, the required libraries (zlib,
# inih, cJSON) and the optional ones this build found (oneDNN, HDF5,
# libmicrohttpd, MPI, libcurl). Never a CUDA library: the runtime is linked
# statically and the driver (libcuda) is loaded by it at run time, so the
# same binary starts on a machine without a GPU or a driver.
#   tests/needed-libs.sh BUILD
set -u
build=${1:?usage: needed-libs.sh BUILD}
allowed='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libgcc_s|libstdc\+\+|libgomp|libz|libinih|libcjson|libdnnl|libhdf5_serial|libmicrohttpd|libmpi|libcurl|libdtrain)\.so'
fail=0
for bin in "$build/dtrain" "$build"/libdtrain.so "$build/tests/test_gpu"; do
    [ -e "$bin" ] || continue
    libs=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    [ -n "$libs" ] || { echo "FAIL $bin: readelf found no NEEDED entries"; fail=1; continue; }
    for lib in $libs; do
        if [[ $lib =~ ^lib(cuda|cudart|cublas|cublasLt|cudnn|nccl|nvrtc) ]]; then
            echo "FAIL $bin needs $lib: CUDA's libraries are linked statically or loaded at run time"; fail=1
        elif ! [[ $lib =~ $allowed ]]; then
            echo "FAIL $bin needs $lib, which is not among the allowed libraries (tests/needed-libs.sh)"; fail=1
        fi
    done
    echo "$bin: $(echo $libs | tr '\n' ' ')"
done
exit $fail
