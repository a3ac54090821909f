# FindAsio
# --------
# Finds standalone asio (Debian's libasio-dev ships headers and no CMake package config).
#
# Imported target:
#   asio::asio   - INTERFACE target with ASIO_STANDALONE defined and Threads linked.
# Result variables:
#   Asio_FOUND, Asio_INCLUDE_DIR, Asio_VERSION

find_path(Asio_INCLUDE_DIR NAMES asio.hpp asio/version.hpp)

if(Asio_INCLUDE_DIR AND EXISTS "${Asio_INCLUDE_DIR}/asio/version.hpp")
  file(STRINGS "${Asio_INCLUDE_DIR}/asio/version.hpp" _asio_version_line
       REGEX "^#define ASIO_VERSION [0-9]+")
  string(REGEX REPLACE "^#define ASIO_VERSION ([0-9]+).*" "\\1" _asio_v "${_asio_version_line}")
  math(EXPR _asio_major "${_asio_v} / 100000")
  math(EXPR _asio_minor "${_asio_v} / 100 % 1000")
  math(EXPR _asio_patch "${_asio_v} % 100")
  set(Asio_VERSION "${_asio_major}.${_asio_minor}.${_asio_patch}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Asio
  REQUIRED_VARS Asio_INCLUDE_DIR
  VERSION_VAR Asio_VERSION)

if(Asio_FOUND AND NOT TARGET asio::asio)
  find_package(Threads REQUIRED)
  add_library(asio::asio INTERFACE IMPORTED)
  set_target_properties(asio::asio PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${Asio_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;ASIO_NO_DEPRECATED"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()

mark_as_advanced(Asio_INCLUDE_DIR)
