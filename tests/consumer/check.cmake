# Builds and runs tests/consumer against weft (ctest: consumer_find_package and
# consumer_add_subdirectory; tests/CMakeLists.txt).
#   cmake -DMODE=find_package|add_subdirectory -DWEFT_SOURCE=<weft source> -DWEFT_BUILD=<weft build>
#         -DWORK=<scratch dir> [-DGENERATOR=<cmake generator>] -P check.cmake
# find_package: `cmake --install WEFT_BUILD --prefix WORK/prefix`, checks that no installed
# header includes fmt or nlohmann, then builds the consumer with CMAKE_PREFIX_PATH=WORK/prefix.
# add_subdirectory: the consumer adds WEFT_SOURCE as a subproject (host code only, no
# optimisation, so that compiling libweft once more stays cheap) and builds it.
foreach(v MODE WEFT_SOURCE WEFT_BUILD WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT GENERATOR)
  set(GENERATOR "Unix Makefiles")
endif()
if(DEFINED ENV{CMAKE_BUILD_PARALLEL_LEVEL})
  set(jobs $ENV{CMAKE_BUILD_PARALLEL_LEVEL})
else()
  cmake_host_system_information(RESULT jobs QUERY NUMBER_OF_LOGICAL_CORES)
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "consumer check (${MODE}) failed: ${cmd}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
set(consumer_src ${CMAKE_CURRENT_LIST_DIR})
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${WEFT_BUILD} --prefix ${WORK}/prefix)
  file(GLOB_RECURSE headers ${WORK}/prefix/include/*)
  foreach(h IN LISTS headers)
    file(STRINGS ${h} bad REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](fmt|nlohmann)/")
    if(bad)
      message(FATAL_ERROR "installed header ${h} includes fmt or nlohmann: ${bad}")
    endif()
  endforeach()
  set(configure -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release)
elseif(MODE STREQUAL "add_subdirectory")
  set(configure -DWEFT_SUBDIR=${WEFT_SOURCE} -DCMAKE_BUILD_TYPE=None -DWEFT_ENABLE_CUDA=OFF -DWEFT_ENABLE_MPI=OFF)
else()
  message(FATAL_ERROR "check.cmake: MODE is find_package or add_subdirectory, not '${MODE}'")
endif()
run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK}/build -G ${GENERATOR} ${configure})
run(${CMAKE_COMMAND} --build ${WORK}/build -j ${jobs})
run(${WORK}/build/consumer)
