# Installing Volt: static libraries, headers and a CMake package, so a user project needs three lines
#
#   find_package(volt REQUIRED)
#   add_executable(app main.cpp)
#   target_link_libraries(app PRIVATE volt::volt)
#
# and a Debian package of the same files (`cpack -G DEB` in the build directory). Included last by
# the top-level CMakeLists.txt, once every target exists.
#
# Every volt_cc_library registers itself (VoltHelpers.cmake), so a new area is installed and
# exported without touching this file. Exported names drop the `volt_` prefix: volt_trainer is
# volt::trainer, as inside this build.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(VOLT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/volt)

get_property(_volt_exported GLOBAL PROPERTY VOLT_LIBRARIES)
# volt_loggers links the generated TensorBoard messages privately; a static library's private
# dependencies still reach the final link, so they must be exported with it. Its include
# directory is the build tree's generated/ folder: only protobuf-free headers are installed.
if(TARGET volt_tensorboard_proto)
  set_target_properties(volt_tensorboard_proto PROPERTIES EXPORT_NAME tensorboard_proto)
  list(APPEND _volt_exported volt_tensorboard_proto)
endif()
if(TARGET volt_umbrella)
  set_target_properties(volt_umbrella PROPERTIES EXPORT_NAME volt)
  list(APPEND _volt_exported volt_umbrella)
endif()

install(TARGETS ${_volt_exported} EXPORT voltTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT voltTargets NAMESPACE volt:: DESTINATION ${VOLT_INSTALL_CMAKEDIR})

# Headers keep their layout (#include "volt/trainer/trainer.h"). Test helpers include GoogleTest
# and are not part of the library. The torch shim (cmake/torch_shims) is only seen by
# volt_distributed's sources, never by an installed header, so it stays in the build.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/volt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h"
  PATTERN "*test*" EXCLUDE)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/voltConfig.cmake.in
  ${PROJECT_BINARY_DIR}/voltConfig.cmake
  INSTALL_DESTINATION ${VOLT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/voltConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/voltConfig.cmake ${PROJECT_BINARY_DIR}/voltConfigVersion.cmake
  DESTINATION ${VOLT_INSTALL_CMAKEDIR})

# The `volt` tool (slurm, sweep, new, plot) and the Fashion-MNIST example, under a name that says
# whose it is in a shared bin/.
if(TARGET volt)
  install(TARGETS volt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  # `volt checkpoint ...` runs it from volt's own folder.
  install(TARGETS volt-checkpoint RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
if(TARGET fashion_mnist)
  install(PROGRAMS $<TARGET_FILE:fashion_mnist> DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME volt-fashion-mnist)
endif()

# ---- Debian package: cpack -G DEB -> volt_<version>_amd64.deb, installed under /usr -------------
set(CPACK_PACKAGE_NAME volt)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Volt maintainers <volt@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Lightning-style trainer for LibTorch (static libraries, headers, CMake package, volt tool)")
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
# Users compile against Volt's headers, which include LibTorch's, fmt's, nlohmann-json's, yaml-cpp's
# and CLI11's, and link the static libraries against the shared ones: the -dev packages bring both.
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "libtorch-dev, libfmt-dev, nlohmann-json3-dev, libyaml-cpp-dev, libcli11-dev, libprotobuf-dev, zlib1g-dev, libpng-dev, libturbojpeg0-dev, libcurl4-openssl-dev, cmake")
# Fast BLAS for LibTorch, `volt plot`, and the example's data.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libopenblas0-openmp, gnuplot-nox")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "dataset-fashion-mnist")
include(CPack)
