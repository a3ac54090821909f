# Installs doorman from BINARY_DIR into a temporary prefix, then configures, builds and runs
# the consumer project against it. Fails on the first step that fails.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_compiled)

# The installed tools (TOOLS, when the examples were built) run: their usage, exit 0.
foreach(tool IN LISTS TOOLS)
  if(NOT EXISTS ${prefix}/bin/${tool})
    message(FATAL_ERROR "not installed: ${prefix}/bin/${tool}")
  endif()
  run(${prefix}/bin/${tool} --help)
endforeach()
