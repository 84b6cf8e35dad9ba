# Imported targets for the libraries quarry links from the archives (.a) Debian ships with their
# headers (libssl-dev, libsqlite3-dev, libyaml-cpp-dev, zlib1g-dev: scripts/setup), and archives
# of fmt and spdlog built here, as Debian ships only their shared libraries.

# quarry_archive(NAME ARCHIVE [DEPENDENCIES...]): quarry::NAME is ARCHIVE, linked with what it
# needs from elsewhere.
function(quarry_archive name archive)
  find_library(QUARRY_ARCHIVE_${name} NAMES ${archive} REQUIRED)
  add_library(quarry::${name} STATIC IMPORTED GLOBAL)
  set_target_properties(quarry::${name} PROPERTIES
    IMPORTED_LOCATION "${QUARRY_ARCHIVE_${name}}"
    INTERFACE_LINK_LIBRARIES "${ARGN}")
endfunction()

# OpenSSL: its archives in an executable that sets QUARRY_OPENSSL_ARCHIVES (quarry), its shared
# libraries elsewhere. quarry-data loads libpq, which loads the shared ones: an archive's copy as
# well would make two OpenSSLs in one process.
quarry_archive(crypto_archive libcrypto.a Threads::Threads ${CMAKE_DL_LIBS})
quarry_archive(ssl_archive libssl.a quarry::crypto_archive)
find_package(OpenSSL REQUIRED)
set(openssl_archives "$<BOOL:$<TARGET_PROPERTY:QUARRY_OPENSSL_ARCHIVES>>")
foreach(library IN ITEMS Crypto SSL)
  string(TOLOWER ${library} name)
  add_library(quarry_${name} INTERFACE)
  add_library(quarry::${name} ALIAS quarry_${name})
  target_link_libraries(quarry_${name} INTERFACE
    "$<IF:${openssl_archives},quarry::${name}_archive,OpenSSL::${library}>")
endforeach()
unset(openssl_archives)

quarry_archive(z libz.a)
quarry_archive(sqlite3 libsqlite3.a quarry::z m Threads::Threads ${CMAKE_DL_LIBS})
quarry_archive(yaml-cpp libyaml-cpp.a)

# fmt and spdlog: Debian ships only their headers and shared libraries. Their compiled parts are
# built here once, from those headers (src/common/logging/), into archives of quarry's own;
# header-only, every file compiled them again.
add_library(quarry_fmt STATIC ${PROJECT_SOURCE_DIR}/src/common/logging/fmt.cc)
add_library(quarry::fmt ALIAS quarry_fmt)
target_include_directories(quarry_fmt PUBLIC
  $<TARGET_PROPERTY:fmt::fmt,INTERFACE_INCLUDE_DIRECTORIES>)

add_library(quarry_logging STATIC ${PROJECT_SOURCE_DIR}/src/common/logging/spdlog.cc)
add_library(quarry::logging ALIAS quarry_logging)
target_compile_definitions(quarry_logging PUBLIC SPDLOG_FMT_EXTERNAL SPDLOG_COMPILED_LIB)
target_include_directories(quarry_logging PUBLIC
  $<TARGET_PROPERTY:spdlog::spdlog,INTERFACE_INCLUDE_DIRECTORIES>)
target_link_libraries(quarry_logging PUBLIC quarry::fmt Threads::Threads)
