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
set(HOTSWITCH_PYTHON_EXT_SUFFIX "${_hs_torch_ext_suffix}")

if(HOTSWITCH_TORCH_FROM_PYTHON)
  # What torch.utils.cpp_extension does for a CPU extension: torch's headers, and c10, torch
  # and torch_cpu from torch/lib. Needs no CUDA toolkit, also for a CUDA build of torch.
  set(TORCH_INSTALL_PREFIX "${_hs_torch_lib_dir}/..")
  set(TORCH_INCLUDE_DIRS ${_hs_torch_include_dirs})
  add_library(hotswitch_libtorch INTERFACE)
  target_include_directories(hotswitch_libtorch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  foreach(_lib c10 torch torch_cpu)
    find_library(HOTSWITCH_LIB_${_lib} ${_lib} PATHS "${_hs_torch_lib_dir}" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(hotswitch_libtorch INTERFACE "${HOTSWITCH_LIB_${_lib}}")
  endforeach()
  set(HOTSWITCH_TORCH_LIBRARIES hotswitch_libtorch)
  message(STATUS "hotswitch: torch from ${_hs_torch_lib_dir} (HOTSWITCH_TORCH_FROM_PYTHON)")
else()
  list(APPEND CMAKE_PREFIX_PATH "${_hs_torch_cmake_prefix_path}")
  find_package(Torch REQUIRED)
  set(HOTSWITCH_TORCH_LIBRARIES ${TORCH_LIBRARIES})
endif()

find_library(HOTSWITCH_TORCH_PYTHON_LIBRARY torch_python
  HINTS "${TORCH_INSTALL_PREFIX}/lib" "${_hs_torch_lib_dir}" REQUIRED)
# Torch wheels carry the pybind11 headers torch was built with; Debian's torch uses pybind11-dev.
find_path(HOTSWITCH_PYBIND11_INCLUDE_DIR pybind11/pybind11.h HINTS ${TORCH_INCLUDE_DIRS} ${_hs_torch_include_dirs})
if(NOT HOTSWITCH_PYBIND11_INCLUDE_DIR)
  message(FATAL_ERROR "hotswitch: pybind11 headers not found (torch's include folder or pybind11-dev)")
endif()

set(HOTSWITCH_PYBIND11_DEFINITIONS "")
foreach(_key compiler_type stdlib build_abi)
  if(NOT _hs_torch_pybind11_${_key} STREQUAL "")
    string(TOUPPER "${_key}" _upper)
    list(APPEND HOTSWITCH_PYBIND11_DEFINITIONS "PYBIND11_${_upper}=\"${_hs_torch_pybind11_${_key}}\"")
  endif()
endforeach()
