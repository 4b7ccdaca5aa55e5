# Memory probes. Defines accumplan_probes when LibTorch is found (CPU counting allocator always;
# CUDA caching-allocator probe with ACCUMPLAN_HAS_CUDA; CUPTI with ACCUMPLAN_HAS_CUPTI).
#
# Libraries defined here:
#   accumplan_memory_timeline  torch-free, CUPTI-free: the plain memory-record structs and the
#                              CuptiMemoryTimeline logic. Always built, so its unit tests run on
#                              any machine (they feed it a fake record source).
#   accumplan_cupti            torch-free CUPTI activity wrapper (profiler/src/Cupti*.cpp), built
#                              whenever CUPTI is found (ACCUMPLAN_BUILD_CUPTI_WRAPPER), even
#                              without a CUDA LibTorch, so CI keeps the vendor code compiling.
#   accumplan_probes           the MemoryProbe implementations and make_memory_probe (LibTorch).
#
# Consumers see ACCUMPLAN_HAS_CUPTI_WRAPPER=0|1 (a compile definition carried by
# accumplan_probes) because build_config.h only knows the probe-level ACCUMPLAN_HAS_CUPTI.
set(_probe_src ${CMAKE_CURRENT_SOURCE_DIR}/src)

add_library(accumplan_memory_timeline STATIC ${_probe_src}/cupti_memory_timeline.cpp)
target_include_directories(accumplan_memory_timeline PUBLIC ${_probe_src})
target_compile_options(accumplan_memory_timeline PRIVATE -Wall -Wextra)

if(ACCUMPLAN_BUILD_CUPTI_WRAPPER)
  add_library(accumplan_cupti STATIC ${_probe_src}/CuptiActivityApi.cpp)
  target_include_directories(accumplan_cupti PUBLIC ${_probe_src})
  target_link_libraries(accumplan_cupti PUBLIC accumplan_memory_timeline CUDA::cupti)
  target_compile_options(accumplan_cupti PRIVATE -Wall -Wextra)
endif()

if(NOT ACCUMPLAN_HAS_TORCH)
  return()
endif()

add_library(accumplan_probes STATIC
  ${_probe_src}/cpu_counting_probe.cpp
  ${_probe_src}/memory_probe_factory.cpp)
# Private: nothing outside the probes sees vendor headers (tests name the folder themselves).
target_include_directories(accumplan_probes PRIVATE ${_probe_src})
target_link_libraries(accumplan_probes PUBLIC
  accumplan_probe_api accumplan_planner accumplan_memory_timeline)
accumplan_link_torch(accumplan_probes)
target_compile_options(accumplan_probes PRIVATE -Wall -Wextra)

if(ACCUMPLAN_HAS_CUDA)
  target_sources(accumplan_probes PRIVATE ${_probe_src}/cuda_caching_probe.cpp)
  target_link_libraries(accumplan_probes PUBLIC ${ACCUMPLAN_C10_CUDA_LIBRARY} CUDA::cudart)
endif()

if(ACCUMPLAN_BUILD_CUPTI_WRAPPER)
  target_link_libraries(accumplan_probes PUBLIC accumplan_cupti)
  target_compile_definitions(accumplan_probes PUBLIC ACCUMPLAN_HAS_CUPTI_WRAPPER=1)
else()
  target_compile_definitions(accumplan_probes PUBLIC ACCUMPLAN_HAS_CUPTI_WRAPPER=0)
endif()

if(ACCUMPLAN_HAS_CUPTI)
  target_sources(accumplan_probes PRIVATE ${_probe_src}/cupti_probe.cpp)
endif()
