#!/usr/bin/env bash
# Volt as a user gets it: installed with `cmake --install` or as a Debian package, then used by a
# project of its own through find_package(volt). Run by CTest (tests/install/CMakeLists.txt):
#
#   run_install_test.sh prefix <build dir> <work dir>   cmake --install into <work>/prefix, build and
#                                                      run tests/install/consumer against it
#   run_install_test.sh new    <build dir> <work dir>   the installed `volt new` makes a project that
#                                                      builds against <work>/prefix and trains; volt plot
#   run_install_test.sh deb    <build dir> <work dir>   cpack -G DEB, dpkg -i, build the consumer against
#                                                      /usr, dpkg -r (root only; exits 77 = skipped)
set -euo pipefail

mode=$1
build=$(cd "$2" && pwd)
work=$3
here=$(cd "$(dirname "$0")" && pwd)
prefix=$work/prefix
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")

# The consumer compiles LibTorch's headers: ccache makes a re-run cheap, and any change to Volt's
# headers still misses, so the check stays real. base_dir: the installed headers' paths (under the
# build folder) enter the hash relative to it, so a clean clone in another folder (CI's) finds the
# consumer an earlier run compiled against the same headers.
launcher=()
if command -v ccache >/dev/null; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=/usr/bin/env;CCACHE_BASEDIR=$(cd "$here/../.." && pwd);ccache")
fi

fail() { echo "FAIL: $*" >&2; exit 1; }

# build_and_run <source> <binary dir> <program name> [cmake args...]: configures, builds and runs
# it in a fresh folder; prints its output.
build_and_run() {
  local src=$1 bin=$2 program=$3
  shift 3
  rm -rf "$bin"
  cmake -S "$src" -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
  cmake --build "$bin"
  # The program must see installed headers only, never this source tree's.
  if grep -qF -- "$(cd "$here/../.." && pwd)/src" "$bin/build.ninja"; then
    fail "$src was compiled against the source tree, not the installed package"
  fi
  mkdir -p "$bin/run"
  (cd "$bin/run" && OMP_NUM_THREADS=1 "$bin/$program") | tee "$bin/run/out.txt"
}

case "$mode" in
  prefix)
    rm -rf "$prefix"
    cmake --install "$build" --prefix "$prefix"
    for f in lib/cmake/volt/voltConfig.cmake lib/cmake/volt/voltConfigVersion.cmake lib/cmake/volt/voltTargets.cmake \
             lib/libvolt_trainer.a lib/libvolt_tensorboard_proto.a include/volt/volt.h \
             include/volt/trainer/trainer.h bin/volt bin/volt-checkpoint bin/volt-fashion-mnist; do
      [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
    done
    [ ! -e "$prefix/include/volt/core/testing.h" ] || fail "a test helper header was installed"
    build_and_run "$here/consumer" "$work/consumer" consumer -DCMAKE_PREFIX_PATH="$prefix"
    grep -q "stopped: max_steps after .* (20 steps)" "$work/consumer/run/out.txt" || fail "the consumer did not train"
    echo "PASS: installed into $prefix and built a project against it"
    ;;

  new)
    [ -x "$prefix/bin/volt" ] || fail "no installed volt in $prefix (the install_package test sets it up)"
    project=$work/new/demo_app
    rm -rf "$work/new"
    mkdir -p "$work/new"
    "$prefix/bin/volt" new "$project" | tee "$work/new/volt-new.txt"
    grep -q "finding Volt in $prefix" "$work/new/volt-new.txt" || fail "volt new did not find its own prefix"
    # No CMAKE_PREFIX_PATH: the project finds Volt through the hint `volt new` wrote.
    rm -rf "$project/build"
    cmake -S "$project" -B "$project/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
    cmake --build "$project/build"
    (cd "$project" && OMP_NUM_THREADS=1 ./build/demo_app --config config.yaml --dataset synthetic --max-steps 40 \
       --limit-val-batches 2 --val-check-interval 20 --log-every-n-steps 5) | tee "$work/new/train.txt"
    grep -q "stopped: max_steps after .* (40 steps)" "$work/new/train.txt" || fail "the new project did not train"
    grep -q "val/acc" "$work/new/train.txt" || fail "the new project did not validate"
    "$prefix/bin/volt" plot "$project/lightning_logs/version_0" --out "$work/new/curves.png"
    [ "$(head -c 8 "$work/new/curves.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "no PNG"
    echo "PASS: volt new made a project that builds against $prefix, trains and plots"
    ;;

  deb)
    if [ "$(id -u)" -ne 0 ]; then
      echo "SKIP: dpkg -i needs root (CI runs this as root on a throwaway machine)"
      exit 77
    fi
    if dpkg-query -W -f='${Status}' volt 2>/dev/null | grep -q "install ok installed"; then
      echo "SKIP: a volt package is already installed; this test would replace and then remove it"
      exit 77
    fi
    rm -rf "$work/deb"
    mkdir -p "$work/deb"
    (cd "$build" && cpack -G DEB -B "$work/deb")
    deb=$work/deb/volt_${version}_amd64.deb
    [ -f "$deb" ] || fail "cpack did not write $deb ($(ls "$work/deb"))"
    dpkg-deb -f "$deb" Depends | tee /dev/stderr | grep -q "libtorch-dev" || fail "the package does not depend on libtorch-dev"
    trap 'dpkg -r volt >/dev/null || true' EXIT
    dpkg -i "$deb"
    [ -f /usr/lib/cmake/volt/voltConfig.cmake ] || fail "the package did not install /usr/lib/cmake/volt"
    /usr/bin/volt --help >/dev/null || fail "/usr/bin/volt does not run"
    # No CMAKE_PREFIX_PATH: /usr is where CMake looks by default.
    build_and_run "$here/consumer" "$work/deb/consumer" consumer
    grep -q "stopped: max_steps after .* (20 steps)" "$work/deb/consumer/run/out.txt" || fail "the consumer did not train"
    dpkg -r volt
    trap - EXIT
    [ ! -e /usr/lib/cmake/volt/voltConfig.cmake ] || fail "dpkg -r left /usr/lib/cmake/volt behind"
    echo "PASS: $deb installs, builds a project against /usr and uninstalls"
    ;;

  *)
    fail "unknown mode '$mode'; expected prefix, new or deb"
    ;;
esac
