# Installs the rebound build into a scratch prefix, then configures, builds and runs a consumer
# that finds it with find_package, and another built with pkg-config alone. Checks the install
# components too: "dev" without the binaries, "server" without the headers, LICENSE in both.
file(REMOVE_RECURSE ${WORK_DIR})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${what} failed")
  endif()
endfunction()
function(expect_exists path)
  if(NOT EXISTS ${path})
    message(FATAL_ERROR "not installed: ${path}")
  endif()
endfunction()
function(expect_absent path)
  if(EXISTS ${path})
    message(FATAL_ERROR "installed where it should not be: ${path}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
# The flags the library was built with (CXX_FLAGS, LINKER_FLAGS: a sanitizer's), for every consumer.
set(flag_args "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}")
run("install" ${CMAKE_COMMAND} --install ${REBOUND_BUILD_DIR} --prefix ${prefix})
expect_exists(${prefix}/share/doc/rebound/LICENSE)

# find_package(rebound)
run("configuring the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
  -DCMAKE_PREFIX_PATH=${prefix} ${flag_args})
run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("the consumer" ${WORK_DIR}/build/consumer)

# find_package(rebound COMPONENTS core): with libcurl and SQLite made unfindable, as on a machine
# that has only what rebound::core needs (Boost, nlohmann/json, OpenSSL); cpp-httplib, which only
# pkg-config finds, must not be looked for either. (PkgConfig itself cannot be disabled: CMake's
# FindOpenSSL needs it.)
run("configuring the core-only consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR}/../cmake_consumer_core
  -B ${WORK_DIR}/build_core -DCMAKE_PREFIX_PATH=${prefix} ${flag_args}
  -DCMAKE_DISABLE_FIND_PACKAGE_CURL=ON -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON)
file(STRINGS ${WORK_DIR}/build_core/CMakeCache.txt httplib_lookups REGEX "REBOUND_HTTPLIB|httplib_DIR")
if(httplib_lookups)
  message(FATAL_ERROR "the core-only consumer looked for cpp-httplib: ${httplib_lookups}")
endif()
run("building the core-only consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build_core)
run("the core-only consumer" ${WORK_DIR}/build_core/core_consumer)

# pkg-config --cflags --libs rebound, no CMake
file(GLOB_RECURSE pc_files ${prefix}/rebound.pc)
list(LENGTH pc_files n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "rebound.pc: expected one, found '${pc_files}'")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
get_filename_component(lib_dir ${pc_dir} DIRECTORY)
set(ENV{LD_LIBRARY_PATH} ${lib_dir})  # when rebound was built shared (BUILD_SHARED_LIBS)
execute_process(COMMAND pkg-config --cflags --libs rebound OUTPUT_VARIABLE flags
  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(rc)
  message(FATAL_ERROR "pkg-config cannot use rebound.pc")
endif()
separate_arguments(flags UNIX_COMMAND "${flags} ${CXX_FLAGS} ${LINKER_FLAGS}")
run("building with pkg-config" ${CXX} -std=c++17 ${CONSUMER_SOURCE_DIR}/main.cpp ${flags}
  -o ${WORK_DIR}/pc_consumer)
run("the pkg-config consumer" ${WORK_DIR}/pc_consumer)

# Components
run("install --component dev" ${CMAKE_COMMAND} --install ${REBOUND_BUILD_DIR}
  --prefix ${WORK_DIR}/dev --component dev)
expect_exists(${WORK_DIR}/dev/include/rebound/rebound.hpp)
expect_exists(${WORK_DIR}/dev/include/rebound/job_queue.hpp)
expect_absent(${WORK_DIR}/dev/include/rebound/service.hpp)
expect_exists(${WORK_DIR}/dev/include/rebound/store/sqlite_job_store.hpp)
expect_absent(${WORK_DIR}/dev/include/rebound/detail/work_queue.hpp)  # internal: src/pipeline
expect_exists(${WORK_DIR}/dev/share/doc/rebound/LICENSE)
expect_absent(${WORK_DIR}/dev/bin/rebound-server)
if(EXISTS ${prefix}/bin/rebound-server)
  run("install --component server" ${CMAKE_COMMAND} --install ${REBOUND_BUILD_DIR}
    --prefix ${WORK_DIR}/server --component server)
  expect_exists(${WORK_DIR}/server/bin/rebound-server)
  # It runs from there alone (built shared, its library came with it).
  set(ENV{LD_LIBRARY_PATH} "")
  run("the installed rebound-server --help" ${WORK_DIR}/server/bin/rebound-server --help)
  expect_exists(${WORK_DIR}/server/share/doc/rebound/LICENSE)
  expect_absent(${WORK_DIR}/server/include)
endif()
