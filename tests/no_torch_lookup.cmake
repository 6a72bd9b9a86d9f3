# With -DREBOUND_WITH_TORCH=OFF the configure must not look for libtorch at all (no Torch_DIR):
# configures the source tree afresh in WORK_DIR and reads the cache.
# Usage: cmake -DSOURCE_DIR=... -DWORK_DIR=... -P no_torch_lookup.cmake
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -DREBOUND_WITH_TORCH=OFF
  -DREBOUND_BUILD_TESTS=OFF -DREBOUND_BUILD_EXAMPLES=OFF -DREBOUND_BUILD_BENCH=OFF
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "configuring with REBOUND_WITH_TORCH=OFF failed")
endif()
file(STRINGS ${WORK_DIR}/CMakeCache.txt torch REGEX "^Torch_DIR:")
if(torch)
  message(FATAL_ERROR "REBOUND_WITH_TORCH=OFF, yet libtorch was looked for: ${torch}")
endif()
