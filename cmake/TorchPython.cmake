# Finds the Python the extension is built for, that Python's torch, and torch's pybind11.
#
# Python is Python3_EXECUTABLE (pass -DPython3_EXECUTABLE=... when the first python3 on PATH
# is not the one with torch); torch is the one that Python imports. Sets:
#   HOTSWITCH_TORCH_LIBRARIES      what the torch-facing libraries link
#   HOTSWITCH_TORCH_CXX11_ABI      torch's _GLIBCXX_USE_CXX11_ABI (0 or 1)
#   HOTSWITCH_TORCH_PYTHON_LIBRARY libtorch_python
#   HOTSWITCH_PYBIND11_INCLUDE_DIR the pybind11 headers torch was built with
#   HOTSWITCH_PYBIND11_DEFINITIONS pybind11's ABI keys, as torch has them
#   HOTSWITCH_PYTHON_EXT_SUFFIX    the extension suffix, e.g. .cpython-311-x86_64-linux-gnu.so
#   HOTSWITCH_TORCH_VERSION        torch.__version__, which the extension records (_C.TORCH_VERSION)
# torch_info.py prints one `key=value` a line; no value may hold a ';' (a CMake list separator).

find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND "${Python3_EXECUTABLE}" "${CMAKE_CURRENT_LIST_DIR}/torch_info.py"
  OUTPUT_VARIABLE _hs_info ERROR_VARIABLE _hs_info_err RESULT_VARIABLE _hs_info_rc)
if(NOT _hs_info_rc EQUAL 0)
  message(FATAL_ERROR "hotswitch: ${Python3_EXECUTABLE} cannot import torch; pass "
                      "-DPython3_EXECUTABLE=<python with torch>.\n${_hs_info_err}")
endif()
string(REPLACE "\n" ";" _hs_lines "${_hs_info}")
foreach(_line IN LISTS _hs_lines)
  if(_line MATCHES "^([a-z0-9_]+)=(.*)$")
    set(_hs_torch_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endif()
endforeach()
if(_hs_torch_cuda STREQUAL "")
  set(_hs_torch_cuda "none")
endif()
set(_hs_torch_include_dirs "${_hs_torch_include_dir}" "${_hs_torch_api_include_dir}")
message(STATUS "hotswitch: Python ${Python3_EXECUTABLE}, torch ${_hs_torch_version}"
               " (CUDA ${_hs_torch_cuda}), CXX11 ABI ${_hs_torch_cxx11_abi}")
set(HOTSWITCH_TORCH_CXX11_ABI "${_hs_torch_cxx11_abi}")
set(HOTSWITCH_TORCH_VERSION "${_hs_torch_version}")
# Newer torch headers (2.14 on) need C++20; then everything here is built as C++20, one
# standard for all that links together.
file(READ "${_hs_torch_include_dir}/ATen/ATen.h" _hs_aten_h)
if(_hs_aten_h MATCHES "C\\+\\+20 or later")
  set(CMAKE_CXX_STANDARD 20)
  message(STATUS "hotswitch: torch's headers need C++20; building as C++20")
endif()
set(HOTSWITCH_PYTHON_EXT_SUFFIX "${_hs_torch_ext_suffix}")

# torch's headers, and c10, torch and torch_cpu from torch/lib: what torch.utils.cpp_extension
# does for a CPU extension. The extension has no CUDA code, so a CUDA build of torch needs no
# CUDA toolkit here (torch's own CMake package would ask for one).
set(TORCH_INCLUDE_DIRS ${_hs_torch_include_dirs})
add_library(hotswitch_libtorch INTERFACE)
target_include_directories(hotswitch_libtorch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
foreach(_lib c10 torch torch_cpu)
  find_library(HOTSWITCH_LIB_${_lib} ${_lib} PATHS "${_hs_torch_lib_dir}" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(hotswitch_libtorch INTERFACE "${HOTSWITCH_LIB_${_lib}}")
endforeach()
# The libstdc++ torch's process runs with, linked by name so that the linker takes every C++
# runtime symbol from it: a compiler whose own libstdc++ is a static archive alone (a GCC
# installed without its shared library) would otherwise copy parts of libstdc++ into the
# extension, and two copies of its locale machinery in one process crash (check_extension.py).
if(_hs_torch_libstdcxx)
  target_link_libraries(hotswitch_libtorch INTERFACE "${_hs_torch_libstdcxx}")
  message(STATUS "hotswitch: libstdc++ of torch's process: ${_hs_torch_libstdcxx}")
endif()
set(HOTSWITCH_TORCH_LIBRARIES hotswitch_libtorch)

find_library(HOTSWITCH_TORCH_PYTHON_LIBRARY torch_python PATHS "${_hs_torch_lib_dir}" NO_DEFAULT_PATH REQUIRED)
# Torch wheels carry the pybind11 headers torch was built with.
find_path(HOTSWITCH_PYBIND11_INCLUDE_DIR pybind11/pybind11.h PATHS ${_hs_torch_include_dirs} NO_DEFAULT_PATH)
if(NOT HOTSWITCH_PYBIND11_INCLUDE_DIR)
  message(FATAL_ERROR "hotswitch: pybind11 headers not found in torch's include folder")
endif()

set(HOTSWITCH_PYBIND11_DEFINITIONS "")
foreach(_key compiler_type stdlib build_abi)
  if(NOT _hs_torch_pybind11_${_key} STREQUAL "")
    string(TOUPPER "${_key}" _upper)
    list(APPEND HOTSWITCH_PYBIND11_DEFINITIONS "PYBIND11_${_upper}=\"${_hs_torch_pybind11_${_key}}\"")
  endif()
endforeach()
