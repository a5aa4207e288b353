#!/usr/bin/env bash
# Installs what Volt needs on Debian 12 (bookworm), as root or through sudo. Idempotent: a
# machine that has everything only pays for one dpkg query.
#   scripts/setup.sh              everything the test suite needs (scripts/test.sh)
#   scripts/setup.sh --main-job   only what building the library and training the example need
#                                 (scripts/run-example.sh): no test tools, SLURM or Python peers
set -euo pipefail

main_job=0
case "${1:-}" in
  --main-job) main_job=1 ;;
  "") ;;
  *) echo "setup: unknown argument '$1'; expected nothing or --main-job. HINT: scripts/setup.sh --main-job" \
          "installs what the example needs, scripts/setup.sh everything the tests need." >&2
     exit 2 ;;
esac

# The library and the example.
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU)
  libgloo-dev             # headers of c10d's Gloo backend (ddp on CPU)
  libopenblas0-openmp     # the reference BLAS Debian defaults to is many times slower
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libfmt-dev zlib1g-dev
  libpng-dev libturbojpeg0-dev   # ImageFolder decodes PNG (libpng) and JPEG (libjpeg-turbo)
  protobuf-compiler libprotobuf-dev   # TensorBoard's event files are protobuf messages
  libcurl4-openssl-dev    # MLFlowLogger talks to an MLflow tracking server over HTTP
  dataset-fashion-mnist   # the IDX files of the main job, under /usr/share/datasets/fashion-mnist
  libsentencepiece-dev    # examples/gpt --data encodes prompts and decodes samples with SentencePiece
)
# The tests, their tools and peers.
[ "$main_job" = 1 ] || packages+=(
  clang libclang-rt-14-dev  # libFuzzer for the fuzz tests (hostlist, safetensors)
  clang-format clang-tidy   # scripts/check-format.sh, check-tidy.sh (the tree is formatted with 14)
  libgtest-dev libgmock-dev
  gnuplot-nox             # `volt plot` draws metrics.csv curves as PNG
  slurmctld slurmd slurm-client munge   # a throwaway local SLURM cluster for tests/slurm
  openmpi-bin             # the real mpirun of tests/e2e/test_mpirun.py
  python3-torch python3-pytest python3-numpy python3-yaml   # the Python peers of the tests
  python3-pil python3-torchvision   # scripts/export-fashion-mnist-images.py; PyTorch's ImageFolder in bench/
  python3-pip             # installs tensorboard for tests/tensorboard (below)
  python3-fsspec python3-tqdm python3-packaging python3-typing-extensions   # PyTorch Lightning's imports
  python3-sentencepiece sentencepiece   # scripts/prepare-text-corpus.py trains and writes the GPT's tokens
  python3.11-doc          # its corpus: the reStructuredText sources of Python 3.11's documentation (12 MB)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    --no-install-recommends "${missing[@]}"
fi

# LibTorch calls BLAS through Debian's alternatives: make sure OpenBLAS is the one selected.
for lib in libblas.so.3 liblapack.so.3; do
  alt="${lib}-$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"
  target=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-openmp | head -n 1 || true)
  if [ -n "$target" ]; then "${sudo_cmd[@]}" update-alternatives --quiet --set "$alt" "$target"; fi
done

if [ "$main_job" = 1 ]; then
  echo "setup: what the main job needs is present"
  exit 0
fi

# The real `tensorboard` package reads our event files in tests/tensorboard. Debian has none,
# and its PyPI wheels need protobuf >= 6 and numpy 2, which Debian's python3-torch 1.13 cannot
# import: they go into a folder of their own that only that test puts on PYTHONPATH, so
# /usr/bin/python3 and its torch are left as they are. Keep the folder in step with
# VOLT_TENSORBOARD_PYTHONPATH in tests/tensorboard/CMakeLists.txt.
tensorboard_dir="${VOLT_TENSORBOARD_PYTHONPATH:-/opt/volt/python-tensorboard}"
tensorboard_version=2.21.0
if ! PYTHONPATH="$tensorboard_dir" /usr/bin/python3 -c \
    "import sys, tensorboard; sys.exit(tensorboard.__version__ != '$tensorboard_version')" 2>/dev/null; then
  echo "setup: installing tensorboard $tensorboard_version into $tensorboard_dir"
  "${sudo_cmd[@]}" /usr/bin/python3 -m pip install -q --disable-pip-version-check \
    --root-user-action=ignore --no-warn-script-location --upgrade \
    --target "$tensorboard_dir" "tensorboard==$tensorboard_version"
fi

# A real MLflow tracking server and client for tests/e2e/test_mlflow.py, which starts `mlflow server`
# with this folder on PYTHONPATH. The full `mlflow` package pulls in ~850 MB (scikit-learn, scipy,
# pyarrow, ...; 23 min to install here once); mlflow-skinny plus what its server imports is ~330 MB
# in ~25 s. Keep the folder in step with VOLT_MLFLOW_PYTHONPATH in that test.
mlflow_dir="${VOLT_MLFLOW_PYTHONPATH:-/opt/volt/python-mlflow}"
mlflow_packages=(mlflow-skinny==3.17.2 flask==3.1.3 flask-cors==6.0.5 alembic==1.20.1 sqlalchemy==2.1.9
  gunicorn==27.0.1 uvicorn==0.54.0 huey==3.5.4 graphene==3.4.3 aiohttp==3.14.5 pandas==3.1.1)
if [ "$(cat "$mlflow_dir/.complete" 2>/dev/null)" != "${mlflow_packages[*]}" ]; then
  echo "setup: installing MLflow's server into $mlflow_dir"
  "${sudo_cmd[@]}" rm -rf "$mlflow_dir"
  "${sudo_cmd[@]}" /usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    --no-warn-script-location --target "$mlflow_dir" "${mlflow_packages[@]}"
  echo "${mlflow_packages[*]}" | "${sudo_cmd[@]}" tee "$mlflow_dir/.complete" >/dev/null
fi

# install_folder DIR PACKAGE...: pip-installs exactly these packages (no dependencies) into DIR,
# unless DIR already holds that list. DIR is a folder of its own that only the tests needing it
# put on PYTHONPATH, so /usr/bin/python3 keeps Debian's packages.
install_folder() {
  local dir=$1
  shift
  if [ "$(cat "$dir/.complete" 2>/dev/null)" != "$*" ]; then
    echo "setup: installing $* into $dir"
    "${sudo_cmd[@]}" rm -rf "$dir"
    "${sudo_cmd[@]}" /usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
      --no-warn-script-location --no-deps --target "$dir" "$@"
    echo "$*" | "${sudo_cmd[@]}" tee "$dir/.complete" >/dev/null
  fi
}

# PyTorch Lightning 1.9.5 (the 1.x whose layout Volt writes), for
# tests/e2e/test_lightning_checkpoints.py: it loads and resumes Volt's checkpoints and writes the
# ones Volt resumes. Its folder goes on PYTHONPATH in that test only (VOLT_LIGHTNING_PYTHONPATH);
# its other requirements are the Debian packages above.
install_folder "${VOLT_LIGHTNING_PYTHONPATH:-/opt/volt/python-lightning}" \
  pytorch-lightning==1.9.5 lightning-utilities==0.8.0 torchmetrics==0.11.4
# And Lightning 2.2.5, the last 2.x whose torch range includes 1.13 (VOLT_LIGHTNING2_PYTHONPATH).
install_folder "${VOLT_LIGHTNING2_PYTHONPATH:-/opt/volt/python-lightning2}" \
  pytorch-lightning==2.2.5 lightning-utilities==0.11.2 torchmetrics==1.3.2

# examples/gpt's corpus (docs/gpt.md): Python 3.11's documentation sources (python3.11-doc, above)
# as SentencePiece tokens, written by scripts/prepare-text-corpus.py (about 25 s on 2 cores) into a
# folder that gpt --data and tests/e2e/test_gpt.py's long test read. Written again when the script
# or the package changes. Keep the folder in step with VOLT_GPT_CORPUS in that test.
corpus_dir="${VOLT_GPT_CORPUS:-/opt/volt/data/gpt-python-docs}"
corpus_key="$(sha256sum "$(dirname "$0")/prepare-text-corpus.py" | cut -d' ' -f1) $(dpkg-query -W -f='${Version}' python3.11-doc)"
if [ "$(cat "$corpus_dir/.complete" 2>/dev/null)" != "$corpus_key" ]; then
  echo "setup: writing the GPT's corpus into $corpus_dir"
  "${sudo_cmd[@]}" rm -rf "$corpus_dir"
  "${sudo_cmd[@]}" /usr/bin/python3 "$(dirname "$0")/prepare-text-corpus.py" "$corpus_dir" >/dev/null
  echo "$corpus_key" | "${sudo_cmd[@]}" tee "$corpus_dir/.complete" >/dev/null
fi

# PyPI's safetensors (Debian has none; its wheel needs no other package, and Debian's torch 1.13
# imports it) for tests/interop/test_safetensors_interop.py: Python loads the files Volt writes and
# writes the files and sharded folders Volt reads. Keep the folder in step with
# VOLT_SAFETENSORS_PYTHONPATH in that test.
install_folder "${VOLT_SAFETENSORS_PYTHONPATH:-/opt/volt/python-safetensors}" safetensors==0.8.0

# torchrun from PyPI's torch 2.x, for tests/e2e/test_torchrun.py: users run 2.x (Debian's own
# torchrun, torch 1.13, crashes in its argument handling on Python 3.11). Like tensorboard it
# lives in a folder that only that test puts on PYTHONPATH. Its CUDA wheel loads libraries from
# the CUDA toolkit (/usr/local/cuda, which this kind of machine has) and the few NVIDIA wheels
# listed here, which pip lays out beside torch/ where its RPATH looks. Keep the version in step
# with scripts/build-cuda.sh and the folder with VOLT_TORCHRUN_PYTHONPATH in tests/e2e/test_torchrun.py.
install_folder "${VOLT_TORCHRUN_PYTHONPATH:-/opt/volt/python-torchrun}" \
  torch==2.15.0 nvidia-cufile==1.17.1.22 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2 \
  nvidia-nccl-cu13==2.30.7 filelock typing-extensions sympy mpmath networkx jinja2 MarkupSafe fsspec

# PyPI's transformers for tests/interop/test_gpt_hf_interop.py: GPT2LMHeadModel writes the folders
# `gpt --init-from` reads and loads what `gpt --export-hf` writes. It needs torch 2.x (the folder
# above goes after this one on PYTHONPATH) and these packages that neither that folder nor Debian
# has; Debian's numpy, pyyaml, packaging and tqdm serve. ~140 MB, ~15 s. Keep the folder in step
# with VOLT_TRANSFORMERS_PYTHONPATH in that test.
install_folder "${VOLT_TRANSFORMERS_PYTHONPATH:-/opt/volt/python-transformers}" \
  transformers==5.24.0 huggingface-hub==2.4.0 safetensors==0.8.0 regex==2026.11.19 httpx2==2.16.2 httpcore2==2.16.2 \
  anyio==4.16.0 idna==3.20 truststore==0.10.5 h11==0.16.0
echo "setup: all dependencies present"
