#!/usr/bin/env bash
# GPU backends: every check that does not need a GPU, and the GPU run where
# there is one. .ci/run calls it; it exits non-zero on the first failure and
# says plainly what it skipped.
#
#   .ci/cuda.sh          CI (no GPU needed)
#   .ci/cuda.sh --gpu    also run the CUDA parity tests and `holopeer bench
#                        --only device` on this machine's NVIDIA GPU, built
#                        against its own CUDA toolkit (/usr/local/cuda)
#
# CUDA headers and stub libraries come from Debian's non-free packages
# nvidia-cuda-dev, libnvrtc11.2 and libnvrtc-builtins11.8 (CUDA 11.8),
# fetched once with a private apt configuration (the system's sources are
# not touched) into $HOLOPEER_CUDA_CACHE (default ~/.cache/holopeer-cuda):
# about 790 MB to download, of which the headers, stubs/ and libnvrtc are
# kept (75 MB); the .debs are deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

gpu=0
[ "${1:-}" = "--gpu" ] && gpu=1

skipped=()
step() { echo "cuda.sh: $*"; }
skip() {
  echo "cuda.sh: SKIPPED: $*"
  skipped+=("$*")
}
finish() {
  if [ ${#skipped[@]} -gt 0 ]; then
    echo "cuda.sh: done; skipped:"
    printf '  - %s\n' "${skipped[@]}"
  else
    echo "cuda.sh: done; nothing skipped"
  fi
}
trap 'echo "cuda.sh: FAILED at line $LINENO"' ERR

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

host="$(go env GOOS)/$(go env GOARCH)"

# --- The default binary stays free of cgo and of the GPU packages ---------
step "default build: no cgo, no gorgonia.org/cu, no cuda or metal packages"
CGO_ENABLED=0 go build -o "$tmp/holopeer-nocgo" ./cmd/holopeer
if go list -deps ./cmd/holopeer | grep -E '^(gorgonia\.org/cu|github\.com/holopeer/holopeer/(cuda|metal))(/|$)'; then
  echo "cuda.sh: the default holopeer binary links a GPU package (listed above)"
  exit 1
fi

# --- Metal, off a Mac ------------------------------------------------------
step "metal: go vet for darwin/arm64 (the Go side that builds without cgo)"
GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 go vet -tags metal ./metal/...

# The cgo driver (driver_darwin.go) cannot be compiled off a Mac, but its Go
# side can be type-checked against bridge.h by cgo on Linux: a copy of the
# package whose darwin constraints read linux, without the Objective-C and
# framework flags (bridge.m stays out: its constraint is darwin's).
if [ "$(go env GOOS)" = linux ] && command -v gcc >/dev/null; then
  step "metal: type-check the cgo driver against bridge.h (a linux-tagged copy)"
  mkdir -p "$tmp/metalcheck/metal"
  sed 's|^module github.com/holopeer/holopeer$|module metalcheck|' go.mod >"$tmp/metalcheck/go.mod"
  printf '\nrequire github.com/holopeer/holopeer v0.0.0\nreplace github.com/holopeer/holopeer => %s\n' "$PWD" >>"$tmp/metalcheck/go.mod"
  cp go.sum "$tmp/metalcheck/"
  for f in metal/*.go metal/bridge.h metal/kernels.metal; do
    base=$(basename "$f")
    base=${base/_darwin/_mtl} # a _darwin file name is a GOOS constraint of its own
    sed -e 's/darwin \&\& cgo \&\& metal/linux \&\& cgo \&\& metal/g' \
      -e 's/#cgo CFLAGS: -x objective-c -fobjc-arc//' \
      -e 's/#cgo LDFLAGS: -framework Metal -framework Foundation//' \
      -e 's|"github.com/holopeer/holopeer/metal"|"metalcheck/metal"|' "$f" >"$tmp/metalcheck/metal/$base"
  done
  (cd "$tmp/metalcheck" && GOFLAGS=-mod=mod CGO_ENABLED=1 go vet -tags metal ./metal/)
else
  skip "metal cgo driver type-check (needs linux and gcc)"
fi
skip "metal: compiling bridge.m and kernels.metal, and the GPU run (need a Mac: go test -tags metal ./metal/)"

# --- The kernels' logic on the CPU emulator ---------------------------------
if [ "$host" = linux/amd64 ]; then
  if ! command -v g++ >/dev/null; then
    if command -v apt-get >/dev/null; then
      step "installing g++ for the emulator"
      apt-get install -y -qq g++ >/dev/null
    fi
  fi
  if command -v g++ >/dev/null; then
    step "cuda/emu: CUDA kernels on the CPU emulator (tensortest, gputest vs cpu)"
    CGO_ENABLED=1 go test -count=1 -tags cudaemu ./cuda/...
    step "cuda/emu: Metal kernels on the CPU emulator (tensortest, gputest vs cpu)"
    CGO_ENABLED=1 go test -count=1 -tags metalemu ./metal/...
  else
    skip "emulator runs of the CUDA and Metal kernels (need g++)"
  fi
else
  skip "emulator runs of the CUDA and Metal kernels (cuda/emu runs on linux/amd64, this is $host)"
fi

# --- CUDA: fetch headers and stubs ------------------------------------------
cache="${HOLOPEER_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holopeer-cuda}"
root="$cache/root"
stamp="$root/.complete-11.8.89"
lib="$root/usr/lib/x86_64-linux-gnu"

fetch_cuda() {
  [ -f "$stamp" ] && return 0
  step "fetching CUDA 11.8 headers and stubs from Debian non-free into $cache (once)"
  local apt="$cache/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$cache/debs"
  cat >"$apt/sources.list" <<'EOF'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm non-free
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates non-free
EOF
  local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq
  (cd "$cache/debs" && apt-get "${opts[@]}" download -qq nvidia-cuda-dev libnvrtc11.2 libnvrtc-builtins11.8)
  rm -rf "$root.tmp" && mkdir -p "$root.tmp"
  dpkg-deb --fsys-tarfile "$cache"/debs/nvidia-cuda-dev_*.deb |
    tar -x -C "$root.tmp" ./usr/include ./usr/lib/x86_64-linux-gnu/stubs
  dpkg-deb -x "$cache"/debs/libnvrtc11.2_*.deb "$root.tmp"
  dpkg-deb -x "$cache"/debs/libnvrtc-builtins11.8_*.deb "$root.tmp"
  # What a binary built against the stubs loads on a machine without the
  # driver: NVIDIA's stub libcuda, whose cuInit fails, and the stub cuBLAS.
  mkdir -p "$root.tmp/run"
  ln -s ../usr/lib/x86_64-linux-gnu/stubs/libcuda.so "$root.tmp/run/libcuda.so.1"
  ln -s ../usr/lib/x86_64-linux-gnu/stubs/libcublas.so "$root.tmp/run/libcublas.so.11"
  rm -rf "$root" && mv "$root.tmp" "$root" && touch "$stamp"
  rm -rf "$cache/debs"
}

if [ "$host" != linux/amd64 ]; then
  skip "CUDA compile checks (Debian's x86_64 CUDA packages; this is $host)"
  finish
  exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  skip "CUDA compile checks (need apt-get and dpkg-deb to fetch Debian's CUDA headers)"
  finish
  exit 0
fi
fetch_cuda

export CGO_ENABLED=1
export CGO_CFLAGS="-I$root/usr/include"
export CGO_LDFLAGS="-L$lib/stubs"

step "cuda: go vet -tags cuda (cuda, cuda/kernels, cmd/holopeer)"
go vet -tags cuda ./cuda/... ./cmd/holopeer

step "cuda: test binaries build with -tags cuda"
go test -tags cuda -c -o "$tmp/" ./cuda/... ./cmd/holopeer

step "cuda/kernels: NVRTC compiles every kernel to PTX on the CPU; the committed PTX is current"
LD_LIBRARY_PATH="$lib" go test -count=1 -tags cuda ./cuda/kernels

step "cuda: the test binary links gorgonia.org/cu and still runs without a GPU (stub libcuda): Open reports no device, auto falls back to cpu"
LD_LIBRARY_PATH="$root/run" go test -count=1 -tags cuda -run 'TestNoDevice' -v ./cuda | grep -E '^(---|ok|FAIL)|no device'

step "cuda: a holopeer binary built with -tags cuda falls back to cpu with a message instead of exiting"
go build -tags cuda -o "$tmp/holopeer-cuda" ./cmd/holopeer
LD_LIBRARY_PATH="$root/run" "$tmp/holopeer-cuda" device --device cuda --time 50ms | tee "$tmp/device.out"
grep -q 'cuda unavailable' "$tmp/device.out"

if [ $gpu = 1 ]; then
  if ! nvidia-smi -L; then
    echo "cuda.sh: --gpu given but nvidia-smi sees no GPU"
    exit 1
  fi
  # The stubs are for compiling only; a GPU run links the machine's own
  # toolkit (cu's cgo flags search /usr/local/cuda) and driver.
  unset CGO_CFLAGS CGO_LDFLAGS
  if [ -f /usr/local/cuda/include/cuda.h ]; then
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "cuda.sh: no toolkit in /usr/local/cuda; using the Debian 11.8 headers with the system's libcuda and libcublas"
    export CGO_CFLAGS="-I$root/usr/include" CGO_LDFLAGS="-L$lib/stubs"
  fi
  step "GPU: parity tests of every op, large shapes, a whole model and a gpu→cpu pipeline against cpu"
  go test -count=1 -tags cuda -v ./cuda/ 2>&1 | grep -vE '^=== RUN' | tail -80
  go test -count=1 -tags cuda ./cuda/...
  step "GPU: holopeer bench --only device,gemm"
  go build -tags cuda -o "$tmp/holopeer-gpu" ./cmd/holopeer
  "$tmp/holopeer-gpu" device --device cuda
  "$tmp/holopeer-gpu" bench --only device,gemm --json=false
else
  skip "CUDA parity tests and bench on a GPU (none here; run .ci/cuda.sh --gpu on a machine with an NVIDIA GPU)"
fi
finish
