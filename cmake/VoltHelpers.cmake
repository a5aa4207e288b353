# Helpers for Volt's targets, one per target kind (after Abseil's AbseilHelpers.cmake).
#
#   volt_cc_library(NAME n SRCS ... DEPS ... [TORCH])
#     A static library `volt_n` (alias volt::n). TORCH links LibTorch and reuses the shared
#     precompiled torch header, so only targets that need LibTorch pay for its headers.
#     Installed and exported as volt::n (cmake/VoltInstall.cmake).
#   volt_cc_test(NAME n SRCS ... DEPS ... [TORCH] [LABELS ...] [PER_CASE])
#     A GoogleTest binary, compiled as test code, registered with CTest as one test; PER_CASE
#     registers every case on its own (gtest_discover_tests), for binaries whose cases skip with a
#     reason.
#   volt_test_code(target [TORCH])
#     Compiles `target` as test code: at VOLT_TEST_OPTIMIZATION, with the matching torch header.
#   volt_assert_torch_free(target)
#     Fails the configure step when `target` links LibTorch (or a TORCH target), directly or
#     through any dependency, naming the chain: torch-free targets stay torch-free.

include(GoogleTest OPTIONAL)

# CI builds the LibTorch targets as unity builds (scripts/test.sh): each of their files spends
# most of its compile time in LibTorch's templates, and a batch of files shares that work. Off by
# default, since a change to one file then recompiles its whole batch. Torch-free targets never
# are: clang-tidy reads their files one by one from compile_commands.json, and they compile fast.
option(VOLT_UNITY_BUILD "Compile the LibTorch targets as unity builds (batches of files)" OFF)
set(VOLT_UNITY_BUILD_BATCH_SIZE 8 CACHE STRING "files per unity batch under VOLT_UNITY_BUILD")

# _volt_unity(target): makes `target` a unity build when VOLT_UNITY_BUILD is on.
function(_volt_unity target)
  if(VOLT_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${VOLT_UNITY_BUILD_BATCH_SIZE})
  endif()
endfunction()

# Options structs are filled with designated initializers that name only some fields (C++20).
set(VOLT_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
if(VOLT_WERROR)
  list(APPEND VOLT_WARNINGS -Werror)
endif()

# Test code (unit tests, the docs' samples) compiles at VOLT_TEST_OPTIMIZATION, -O0 by default,
# whatever the build type: it only calls into the libraries, which keep the build's optimization,
# and -O0 compiles a test file in some 60 % of -O2's time (trainer_test.cpp: 16 s against 25 s).
# VOLT_TEST_FLAGS is what that adds to an optimized build (empty when the build is at -O0 already
# or VOLT_TEST_OPTIMIZATION is empty).
set(VOLT_TEST_OPTIMIZATION "-O0" CACHE STRING "optimization flag of test code; empty: the build type's")
string(TOUPPER "${CMAKE_BUILD_TYPE}" _volt_build_type)
set(VOLT_TEST_FLAGS)
if(VOLT_TEST_OPTIMIZATION AND "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${_volt_build_type}}" MATCHES "-O[1-3sz]|-Ofast"
   AND NOT "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${_volt_build_type}}" MATCHES "${VOLT_TEST_OPTIMIZATION}( |$)")
  set(VOLT_TEST_FLAGS ${VOLT_TEST_OPTIMIZATION})
endif()

function(volt_test_code target)
  cmake_parse_arguments(V "TORCH" "" "" ${ARGN})
  if(NOT VOLT_TEST_FLAGS)
    return()
  endif()
  target_compile_options(${target} PRIVATE ${VOLT_TEST_FLAGS})
  # _volt_use_torch (or the caller) chose volt_torch_pch; its header was made at the build's -O.
  if(V_TORCH AND TARGET volt_torch_pch_tests)
    set_property(TARGET ${target} PROPERTY PRECOMPILE_HEADERS_REUSE_FROM volt_torch_pch_tests)
    add_dependencies(${target} volt_torch_pch_tests)  # what target_precompile_headers(REUSE_FROM) adds
  endif()
endfunction()

# The precompiled torch header is built once, by volt_torch_pch, and reused by every torch target.
function(_volt_use_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  # Torch's own headers are not ours to fix: include them as system headers.
  target_include_directories(${target} SYSTEM PUBLIC ${TORCH_INCLUDE_DIRS})
  if(VOLT_TORCH_FMT_HEADER_ONLY)
    target_compile_definitions(${target} PUBLIC FMT_HEADER_ONLY)  # see the top CMakeLists.txt
  endif()
  if(TARGET volt_torch_pch)
    target_precompile_headers(${target} REUSE_FROM volt_torch_pch)
  endif()
endfunction()

function(volt_cc_library)
  cmake_parse_arguments(V "TORCH" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(volt_${V_NAME} STATIC ${V_SRCS})
  add_library(volt::${V_NAME} ALIAS volt_${V_NAME})
  set_target_properties(volt_${V_NAME} PROPERTIES EXPORT_NAME ${V_NAME})
  set_property(GLOBAL APPEND PROPERTY VOLT_LIBRARIES volt_${V_NAME})
  target_include_directories(volt_${V_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
    $<INSTALL_INTERFACE:include>)
  target_compile_options(volt_${V_NAME} PRIVATE ${VOLT_WARNINGS})
  # The public API is filled with designated initializers (`{.max_epochs = 3}`): C++20, also
  # for every program that links Volt.
  target_compile_features(volt_${V_NAME} PUBLIC cxx_std_20)
  target_link_libraries(volt_${V_NAME} PUBLIC ${V_DEPS})
  if(V_TORCH)
    _volt_use_torch(volt_${V_NAME})
    _volt_unity(volt_${V_NAME})
  endif()
endfunction()

function(volt_cc_test)
  cmake_parse_arguments(V "TORCH;PER_CASE" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${V_NAME} ${V_SRCS})
  target_compile_options(${V_NAME} PRIVATE ${VOLT_WARNINGS})
  target_link_libraries(${V_NAME} PRIVATE ${V_DEPS} GTest::gtest GTest::gtest_main)
  if(V_TORCH)
    _volt_use_torch(${V_NAME})
    _volt_unity(${V_NAME})
    volt_test_code(${V_NAME} TORCH)
  else()
    volt_test_code(${V_NAME})
  endif()
  if(NOT V_LABELS)
    set(V_LABELS unit)
  endif()
  if(V_TORCH)
    # `ctest -L torch`: what can differ with the LibTorch it compiles against (the CUDA stage).
    # One label, since gtest_discover_tests flattens a list in PROPERTIES; `-L unit` still
    # selects it (CTest matches labels as regular expressions).
    string(REPLACE ";" "_" V_LABELS "torch_${V_LABELS}")
  endif()
  if(V_NAME IN_LIST VOLT_COMPAT_UNIT_TESTS)
    set(V_LABELS "${V_LABELS}_compat")  # what CI's CUDA stage runs (top CMakeLists.txt)
  endif()
  if(V_PER_CASE)
    # A skipped case shows as skipped, with its reason, not inside a binary that passed.
    gtest_discover_tests(${V_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${V_LABELS}")
    return()
  endif()
  # One CTest test per binary: a process per case paid ~0.65 s of loading LibTorch for each of
  # 629 cases, some 410 s of CPU time per run. GoogleTest still prints every failed case with its
  # output, which --output-on-failure shows.
  add_test(NAME ${V_NAME} COMMAND ${V_NAME} --gtest_brief=1)
  set_tests_properties(${V_NAME} PROPERTIES LABELS "${V_LABELS}" TIMEOUT 900)
endfunction()

function(volt_assert_torch_free target)
  # Breadth-first over the link dependencies; `via_<name>` remembers how each one was reached.
  set(queue ${target})
  set(seen)
  set(via_${target} ${target})
  while(queue)
    list(POP_FRONT queue current)
    if(current IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${current})
    if(current MATCHES "^volt_torch_pch" OR current IN_LIST TORCH_LIBRARIES OR current MATCHES "^(torch|torch_cpu|torch_cuda|c10|c10_cuda)$")
      message(FATAL_ERROR "${target} must not link LibTorch, but it links ${current} (${via_${current}}). "
                          "HINT: keep LibTorch out of torch-free targets; move the code that needs it to a TORCH target.")
    endif()
    if(NOT TARGET ${current})
      continue()
    endif()
    get_target_property(aliased ${current} ALIASED_TARGET)
    set(deps)
    if(aliased)
      set(deps ${aliased})
    else()
      get_target_property(type ${current} TYPE)
      get_target_property(interface_deps ${current} INTERFACE_LINK_LIBRARIES)
      if(interface_deps)
        list(APPEND deps ${interface_deps})
      endif()
      if(NOT type STREQUAL "INTERFACE_LIBRARY")
        get_target_property(direct_deps ${current} LINK_LIBRARIES)
        if(direct_deps)
          list(APPEND deps ${direct_deps})
        endif()
      endif()
    endif()
    foreach(dep IN LISTS deps)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
      if(dep MATCHES "^\\$<" OR dep IN_LIST seen)
        continue()
      endif()
      if(NOT DEFINED via_${dep})
        set(via_${dep} "${via_${current}} -> ${dep}")
      endif()
      list(APPEND queue ${dep})
    endforeach()
  endwhile()
endfunction()
