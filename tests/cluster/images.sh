#!/usr/bin/env bash
# The images the cluster test runs: gswarm:latest from the project's Dockerfile with the images docker-compose.yml
# names (python:3.11-slim, postgres:16, redis:7), then the nodes' gswarm-serve:test (the same Dockerfile with
# EXTRAS=serve and torch's CPU build from a wheel). From Docker Hub where it answers; elsewhere through
# ../shared/tools/offline-images/build.sh, which installs and starts Docker and builds local stand-ins.
# env: PYTHON (the venv's python: pip downloads the torch wheel), GSWARM_CLUSTER_DIR (where images.seconds goes),
#      OFFLINE_IMAGES (the shared script), CACHE (its root file system cache).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
OUT=${GSWARM_CLUSTER_DIR:-/tmp/gswarm-cluster}
OFFLINE_IMAGES=${OFFLINE_IMAGES:-$ROOT/../shared/tools/offline-images/build.sh}
export CACHE=${CACHE:-/var/cache/gswarm-offline}
mkdir -p "$OUT"
t0=$SECONDS
# GSWARM_CLUSTER_REV=HEAD builds the images from that commit (git archive) instead of the working tree, whose
# uncommitted edits would otherwise go into them.
SRC=$ROOT
if [ -n "${GSWARM_CLUSTER_REV:-}" ]; then
  SRC=$(mktemp -d -t gswarm-src-XXXX)
  git -C "$ROOT" archive "$GSWARM_CLUSTER_REV" | tar -C "$SRC" -xf -
fi

hub_answers() {  # the registry answers 401 to an anonymous /v2/ where it is reachable
  [ "$(curl -sS -m 5 -o /dev/null -w '%{http_code}' https://registry-1.docker.io/v2/ 2>/dev/null)" = 401 ]
}

# build.sh finds its apt mirror in /etc/apt/sources.list too, and under `set -o pipefail` it stops without a word
# when that file is missing (deb822 .sources only). Its root file system is then made here, exactly as it would
# make it (same debootstrap line, the mirror from the .sources files), and it skips that step.
rootfs() {
  [ -x "$CACHE/rootfs/usr/bin/python3" ] && return 0
  [ -s /etc/apt/sources.list ] && return 0
  command -v debootstrap >/dev/null || apt-get install -y -q debootstrap \
    || { apt-get update -q && apt-get install -y -q debootstrap; }
  local url
  url=$(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n 1 || true)
  [ -n "$url" ] || { echo "no apt mirror in /etc/apt/sources.list.d/*.sources" >&2; exit 1; }
  rm -rf "$CACHE/rootfs" && mkdir -p "$CACHE/rootfs"
  echo "debootstrap bookworm from $url into $CACHE/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$CACHE/rootfs" "$url" \
    >"$OUT/debootstrap.log" 2>&1 || { tail -n 30 "$OUT/debootstrap.log" >&2; exit 1; }
}

if docker info >/dev/null 2>&1 && hub_answers; then
  docker pull -q python:3.11-slim && docker pull -q postgres:16 && docker pull -q redis:7
  docker build -q -t gswarm:latest "$SRC"
else
  [ -x "$OFFLINE_IMAGES" ] || { echo "Docker Hub does not answer and $OFFLINE_IMAGES is missing" >&2; exit 1; }
  rootfs
  PROJECT="$SRC" "$OFFLINE_IMAGES" setup base python postgres redis gswarm
fi

# The nodes' image: the same Dockerfile with EXTRAS=serve, its context the project's files and torch's CPU wheel
# (from where this machine's pip finds it, pinned as the venv has it); its dependency layer outlives code changes.
ctx=$(mktemp -d -t gswarm-serve-XXXX)
trap 'rm -rf "$ctx"' EXIT
tar -C "$SRC" --exclude=__pycache__ -cf - Dockerfile .dockerignore pyproject.toml requirements.lock README.md alembic.ini \
  gswarm_tasks gswarm_web migrations config | tar -C "$ctx" -xf -
mkdir -p "$ctx/wheels"
torch=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 2.13.0+cpu)
case "$torch" in *+cpu) ;; *) torch="${torch%%+*}+cpu" ;; esac
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: "torch==$torch" -d "$ctx/wheels" 2>/dev/null \
  || "$PYTHON" -m pip download -q --no-deps --only-binary=:all: "torch==$torch" -d "$ctx/wheels" \
    --extra-index-url https://download.pytorch.org/whl/cpu
t1=$SECONDS
DOCKER_BUILDKIT=0 docker build --build-arg EXTRAS=serve -t gswarm-serve:test "$ctx" >"$OUT/serve-build.log" 2>&1 \
  || { tail -n 30 "$OUT/serve-build.log" >&2; exit 1; }
printf '%s\n' "$((SECONDS - t0))" >"$OUT/images.seconds"
echo "images: $((SECONDS - t0)) s (gswarm-serve:test $((SECONDS - t1)) s)"
