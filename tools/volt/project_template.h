// `volt new`: the files of a new training project that builds against the installed Volt package.
#pragma once

#include <string>
#include <vector>

namespace volt::tool {

/// One file of a new project.
struct ProjectFile {
  /// The path relative to the project's directory, e.g. "src/main.cpp".
  std::string path;
  /// Its contents.
  std::string text;
};

/// A CMake target and C++-friendly project name from a directory's last component: letters,
/// digits and '_' kept, anything else turned into '_', and a leading digit prefixed with '_'.
/// Throws volt::Error when nothing usable is left (e.g. "/" or "..").
std::string project_name_from_dir(const std::string& dir);

/// The files of project `name`: CMakeLists.txt (find_package(volt), with `volt_prefix` as a
/// search hint when not empty), src/main.cpp, src/classifier.h (a LightningModule on Fashion-MNIST
/// or synthetic data), config.yaml, README.md and .gitignore.
std::vector<ProjectFile> render_project(const std::string& name, const std::string& volt_prefix);

/// The prefix Volt is installed in when the `volt` at `executable` is an installed one
/// (<prefix>/bin/volt beside <prefix>/<libdir>/cmake/volt/voltConfig.cmake), else "".
std::string installed_prefix_of(const std::string& executable);

}  // namespace volt::tool
