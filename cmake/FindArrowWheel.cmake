# Finds Arrow and Parquet C++ in the pyarrow wheel that scripts/setup installs into
# <cache>/build-venv-<first 16 hex digits of sha256(scripts/build-requirements.txt)>, and
# defines the imported targets Arrow::arrow, Arrow::arrow_compute and Arrow::parquet.
#
# The wheel ships headers and versioned libraries only (libarrow.so.2600, no libarrow.so), so
# the targets point at the versioned files and executables get an RPATH to the wheel's
# directory. The wheel is built with the new libstdc++ ABI (_GLIBCXX_USE_CXX11_ABI=1), the
# same as Debian's g++, so no ABI flag is needed; a program built with the old ABI fails to
# link against it.

set(_requirements "${PROJECT_SOURCE_DIR}/scripts/build-requirements.txt")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_requirements}")
file(SHA256 "${_requirements}" _hash)
string(SUBSTRING "${_hash}" 0 16 _hash)

if(NOT QUARRY_BUILD_VENV)
  # The cache directory as quarry chooses it (src/config/paths.cc).
  execute_process(COMMAND id -u OUTPUT_VARIABLE _uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(DEFINED ENV{QUARRY_CACHE_DIR} AND NOT "$ENV{QUARRY_CACHE_DIR}" STREQUAL "")
    set(_cache "$ENV{QUARRY_CACHE_DIR}")
  elseif(_uid STREQUAL "0")
    set(_cache "/var/cache/quarry")
  elseif(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
    set(_cache "$ENV{XDG_CACHE_HOME}/quarry")
  else()
    set(_cache "$ENV{HOME}/.cache/quarry")
  endif()
  set(_venv "${_cache}/build-venv-${_hash}")
else()
  set(_venv "${QUARRY_BUILD_VENV}")
endif()

execute_process(
  COMMAND "${_venv}/bin/python" -c
          "import pyarrow; print(pyarrow.__version__); print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
  OUTPUT_VARIABLE _out
  RESULT_VARIABLE _result
  ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _result EQUAL 0)
  message(FATAL_ERROR "pyarrow (Arrow and Parquet C++) was not found in ${_venv}; run scripts/setup")
endif()
string(REPLACE "\n" ";" _out "${_out}")
list(GET _out 0 ArrowWheel_VERSION)
list(GET _out 1 ArrowWheel_INCLUDE_DIR)
list(GET _out 2 ArrowWheel_LIBRARY_DIR)

foreach(_name arrow arrow_compute parquet)
  file(GLOB _found "${ArrowWheel_LIBRARY_DIR}/lib${_name}.so.[0-9]*")
  list(LENGTH _found _count)
  if(NOT _count EQUAL 1)
    message(FATAL_ERROR "expected one lib${_name}.so.N in ${ArrowWheel_LIBRARY_DIR}, found: ${_found}")
  endif()
  if(NOT TARGET Arrow::${_name})
    add_library(Arrow::${_name} SHARED IMPORTED)
    # INTERFACE_INCLUDE_DIRECTORIES of an imported target are system includes: Arrow's headers
    # do not build warning-free under -Wextra -Werror.
    set_target_properties(Arrow::${_name} PROPERTIES
      IMPORTED_LOCATION "${_found}"
      INTERFACE_INCLUDE_DIRECTORIES "${ArrowWheel_INCLUDE_DIR}")
  endif()
endforeach()
set_property(TARGET Arrow::parquet PROPERTY INTERFACE_LINK_LIBRARIES Arrow::arrow)
set_property(TARGET Arrow::arrow_compute PROPERTY INTERFACE_LINK_LIBRARIES Arrow::arrow)

# The wheel's libarrow carries a static OpenSSL and exports its symbols. Whichever library comes
# first in a program's search order wins every OpenSSL call, so a program with both would mix
# two OpenSSL copies (and crash in certificate loading). Anything linking Arrow therefore asks
# for the system's libssl and libcrypto first, before its own objects and libraries.
set_property(TARGET Arrow::arrow PROPERTY INTERFACE_LINK_OPTIONS
  "LINKER:--push-state,--no-as-needed" "-lssl" "-lcrypto" "LINKER:--pop-state")

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ArrowWheel
  REQUIRED_VARS ArrowWheel_INCLUDE_DIR ArrowWheel_LIBRARY_DIR
  VERSION_VAR ArrowWheel_VERSION)
