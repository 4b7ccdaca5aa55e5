# cmake/install.cmake — what `cmake --install` puts under the prefix (docs/install.md):
#   bin/accumplan
#   libexec/accumplan/accumplan-device          with LibTorch: the whole CLI; bin/accumplan hands
#                                               every command but plan/export/report to it
#   share/accumplan/schemas/{plan,profile}.schema.json
#   include/accumplan/*.h                       the planner's headers (and memory_probe.h, build_config.h)
#   include/accumplan/{runtime,executor,dist,profiling}/*.h   with LibTorch: the runtime's headers
#   lib/libaccumplan_*.a
#   lib/cmake/accumplan/                        find_package(accumplan): accumplan::planner, and
#                                               accumplan::runtime when built with LibTorch
#   lib/pkgconfig/accumplan-planner.pc          the planner for non-CMake builds
# The targets are defined by the folders' own CMakeLists; this file only makes their include
# directories relocatable ($<BUILD_INTERFACE:...> here, $<INSTALL_INTERFACE:...> there) and
# exports them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ACCUMPLAN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/accumplan)

# Source- and build-tree include directories are valid only in the build tree.
function(_accumplan_relocatable_includes target)
  get_target_property(_type ${target} TYPE)
  get_target_property(_dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(_out "")
  if(_dirs)
    foreach(_d IN LISTS _dirs)
      if(_d MATCHES "^\\$<")
        list(APPEND _out "${_d}")
      else()
        list(APPEND _out "$<BUILD_INTERFACE:${_d}>")
      endif()
    endforeach()
  endif()
  foreach(_extra IN LISTS ARGN)
    list(APPEND _out "$<INSTALL_INTERFACE:${_extra}>")
  endforeach()
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_out}")
endfunction()

set(_accumplan_export_targets accumplan_planner accumplan_build_config)
_accumplan_relocatable_includes(accumplan_planner ${CMAKE_INSTALL_INCLUDEDIR})
_accumplan_relocatable_includes(accumplan_build_config ${CMAKE_INSTALL_INCLUDEDIR})
set_target_properties(accumplan_planner PROPERTIES EXPORT_NAME planner)
target_compile_features(accumplan_planner INTERFACE cxx_std_17)

install(TARGETS accumplan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET accumplan_device)
  # Where the front (bin/accumplan) looks for it: ../libexec/accumplan/ from its own folder.
  install(TARGETS accumplan_device RUNTIME DESTINATION libexec/accumplan)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/planner/schemas/plan.schema.json ${PROJECT_SOURCE_DIR}/planner/schemas/profile.schema.json
              ${PROJECT_SOURCE_DIR}/planner/schemas/run_stats.schema.json
        DESTINATION ${CMAKE_INSTALL_DATADIR}/accumplan/schemas)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/planner/include/accumplan DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/generated/accumplan/build_config.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/accumplan)

if(ACCUMPLAN_HAS_TORCH)
  # The runtime's headers include each other as "runtime/batch.h", "executor/executor.h": they go
  # to include/accumplan/<folder>/ and include/accumplan is on the runtime's include path.
  set_target_properties(accumplan_runtime PROPERTIES EXPORT_NAME runtime)
  _accumplan_relocatable_includes(accumplan_runtime ${CMAKE_INSTALL_INCLUDEDIR} ${CMAKE_INSTALL_INCLUDEDIR}/accumplan)
  _accumplan_relocatable_includes(accumplan_probe_api ${CMAKE_INSTALL_INCLUDEDIR})
  list(APPEND _accumplan_export_targets accumplan_runtime accumplan_probe_api)
  foreach(_t accumplan_probes accumplan_memory_timeline accumplan_cupti)
    if(TARGET ${_t})
      _accumplan_relocatable_includes(${_t})
      list(APPEND _accumplan_export_targets ${_t})
    endif()
  endforeach()
  foreach(_folder runtime executor dist profiling)
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/src/${_folder})
      install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/${_folder} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/accumplan
              FILES_MATCHING PATTERN "*.h")
    endif()
  endforeach()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/profiler/include/accumplan DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")
endif()

install(TARGETS ${_accumplan_export_targets} EXPORT accumplanTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT accumplanTargets NAMESPACE accumplan:: DESTINATION ${ACCUMPLAN_INSTALL_CMAKEDIR})

set(ACCUMPLAN_CONFIG_HAS_RUNTIME ${ACCUMPLAN_HAS_TORCH})
set(ACCUMPLAN_CONFIG_HAS_CUDA ${ACCUMPLAN_HAS_CUDA})
set(ACCUMPLAN_CONFIG_HAS_CUPTI ${ACCUMPLAN_BUILD_CUPTI_WRAPPER})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/accumplanConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/accumplanConfig.cmake
                              INSTALL_DESTINATION ${ACCUMPLAN_INSTALL_CMAKEDIR}
                              PATH_VARS CMAKE_INSTALL_DATADIR CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/accumplanConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/accumplanConfig.cmake ${CMAKE_BINARY_DIR}/cmake/accumplanConfigVersion.cmake
        DESTINATION ${ACCUMPLAN_INSTALL_CMAKEDIR})

# pkg-config: the planner only (the runtime needs LibTorch's CMake package anyway). The prefix is
# taken from the .pc file's own location, so a relocated install still works.
file(RELATIVE_PATH ACCUMPLAN_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(${CMAKE_CURRENT_LIST_DIR}/accumplan-planner.pc.in ${CMAKE_BINARY_DIR}/cmake/accumplan-planner.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/accumplan-planner.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
