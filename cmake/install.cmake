# Install rules: headers, libweft, libweft_c (the C API, weft::weft_c) and the CMake package
# that exports weft::weft, so that
#   find_package(weft REQUIRED)
#   target_link_libraries(app PRIVATE weft::weft)
# works against `cmake --install build --prefix DIR` (with DIR in CMAKE_PREFIX_PATH).
include(CMakePackageConfigHelpers)

set(WEFT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/weft)

install(TARGETS weft weft_c EXPORT weftTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh" PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/weft/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft)
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${WEFT_INSTALL_CMAKEDIR})

# What weftConfig.cmake must find again for the exported target's link interface: Threads
# always; CUDA (cudart_static, cuBLAS, cuBLASLt) and NCCL in CUDA builds; MPI where it was built.
get_filename_component(WEFT_NCCL_LIBRARY_DIR "${NCCL_LIBRARY}" DIRECTORY)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/weftConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/weftConfig.cmake
                              INSTALL_DESTINATION ${WEFT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/weftConfig.cmake ${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
        DESTINATION ${WEFT_INSTALL_CMAKEDIR})

if(TARGET weft_cli)
  install(TARGETS weft_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
