# The CUDA backend (EPINFER_CUDA=ON): library epinfer_backend_cuda from src/backend/cuda/*.cc (host code,
# compiled by the C++ compiler against the CUDA runtime) and src/backend/cuda/kernels/*.cu (nvcc).
# A requested but missing CUDA toolkit is a configure error, never a silent CPU-only build.
#
# Architectures: the user's CMAKE_CUDA_ARCHITECTURES wins (e.g. -DCMAKE_CUDA_ARCHITECTURES=90a while
# iterating). Default, one SASS per family we run on (nvcc 13 supports sm_75 and newer):
#   80   A100 (sm_80: mma.sync, cp.async, ldmatrix: the baseline every kernel here compiles for)
#   90a  H100 / H200 (sm_90a: the arch-specific target that wgmma and setmaxnreg need)
#   120  RTX PRO 6000 Blackwell (sm_120)
# No kernel is Hopper-only: every kernel compiles for sm_80.
#   cmake -S . -B build-gpu -G Ninja -DEPINFER_CUDA=ON [-DCMAKE_CUDA_ARCHITECTURES=90a]
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "EPINFER_CUDA=ON, but no CUDA compiler was found: install the CUDA toolkit, put nvcc on "
                      "PATH or set CMAKE_CUDA_COMPILER (e.g. /usr/local/cuda/bin/nvcc)")
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES 80 90a 120 CACHE STRING "CUDA architectures (default: 80;90a;120)")
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flag for nvcc; kernels need only C++17
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED GLOBAL)

file(GLOB epinfer_cuda_host_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cc)
file(GLOB epinfer_cuda_kernel_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/kernels/*.cu)
add_library(epinfer_backend_cuda STATIC ${epinfer_cuda_host_srcs} ${epinfer_cuda_kernel_srcs})
target_include_directories(epinfer_backend_cuda PUBLIC ${PROJECT_SOURCE_DIR}/src)
# The static CUDA runtime: binaries need no libcudart.so at run time (cuBLAS stays a shared library).
set_target_properties(epinfer_backend_cuda PROPERTIES CUDA_RUNTIME_LIBRARY Static)
target_link_libraries(epinfer_backend_cuda PUBLIC epinfer_backend CUDA::cudart_static PRIVATE CUDA::cublas)
# Code that has a CUDA path (tests, the CLI) sees EPINFER_WITH_CUDA=1.
target_compile_definitions(epinfer_backend_cuda PUBLIC EPINFER_WITH_CUDA=1)
# The host side of the wgmma kernels (kernels/*_sm90.cu) launches them only when the build has sm_90a code.
if(CMAKE_CUDA_ARCHITECTURES MATCHES "90a")
  target_compile_definitions(epinfer_backend_cuda PRIVATE EPINFER_CUDA_HAS_SM90A=1)
endif()
# 2810: nvcc's front end flags `status_ = internal_error(...)` in core/status.h (an assignment whose
# Status& result is discarded) as ignoring a [[nodiscard]] type; g++ and clang do not.
target_compile_options(epinfer_backend_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xptxas=-warn-spills -lineinfo --diag-suppress=2810>)
epinfer_set_warnings(epinfer_backend_cuda)

# The NCCL communicator (src/comm/nccl_communicator.cc) is compiled into epinfer_comm. libnccl.so.2 is
# loaded at run time (dlopen), so the build needs only nccl.h (shipped with the CUDA toolkit since 13.0)
# and binaries start on machines without NCCL.
find_path(EPINFER_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(NOT EPINFER_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "EPINFER_CUDA=ON, but nccl.h was not found (the NCCL communicator needs it): install "
                      "NCCL's headers or set EPINFER_NCCL_INCLUDE_DIR")
endif()
target_include_directories(epinfer_comm PRIVATE ${EPINFER_NCCL_INCLUDE_DIR})
target_compile_definitions(epinfer_comm PRIVATE EPINFER_WITH_NCCL=1)
target_link_libraries(epinfer_comm PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS})

# bench/kernel_trace.cc: a CUPTI kernel timeline of any CUDA process (CUDA_INJECTION64_PATH), for benchmarks.
if(TARGET CUDA::cupti)
  add_library(epinfer_kernel_trace SHARED ${PROJECT_SOURCE_DIR}/bench/kernel_trace.cc)
  target_link_libraries(epinfer_kernel_trace PRIVATE CUDA::cupti)
  epinfer_set_warnings(epinfer_kernel_trace)
endif()
