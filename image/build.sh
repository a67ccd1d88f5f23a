#!/usr/bin/env bash
# Build the headroom container image on this machine, with no registry: `make image`.
#
#   bash image/build.sh [TAG]          TAG defaults to headroom:dev (podman's localhost/headroom:dev)
#
# 1. A base image made from Debian packages by mmdebstrap (python3, its venv module, CA certificates).
#    The rootfs tarball is cached under $HEADROOM_CACHE/image-base/, keyed by a hash of the recipe
#    below (and this script's mmdebstrap version), so it is rebuilt only when the recipe changes.
# 2. Wheels built on the host: the runtime wheel of this repository (`pip wheel --no-deps .`) and
#    every dependency at the version pinned in image/constraints.txt (cached by that file's hash).
# 3. The repository's Dockerfile built by buildah FROM that base, installing the wheels with
#    `pip install --no-index` (so two builds install the same versions, and the build needs no network).
#
# Environment: HEADROOM_CACHE (default ~/.cache/headroom), PYTHON (the host interpreter that builds
# wheels; default python3), HEADROOM_IMAGE_LOG (when set, timings are appended to it as JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-headroom:dev}"
CACHE="${HEADROOM_CACHE:-${HOME:-/root}/.cache/headroom}"
PYTHON="${PYTHON:-python3}"
start=$(date +%s)
say() { echo "[image +$(( $(date +%s) - start ))s] $*"; }
die() { echo "image: $*" >&2; exit 1; }
# pip's warnings about an unreachable extra index of this machine's pip.conf are noise here
quiet() { grep -v "^WARNING: Location 'file://" || true; }

export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/image/containers.conf}"
for bin in mmdebstrap buildah podman; do
    command -v "$bin" >/dev/null || die "$bin is missing (bash .ci/setup.sh image installs it)"
done

# ---- 1. the base: the recipe is these lines; any change to them gives a new key ----
BASE_SUITE=bookworm
BASE_ARGS=(--variant=minbase --include=python3,python3-venv,ca-certificates
           --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
           --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
           --aptopt='APT::Install-Recommends "false"'
           --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log')
key=$(printf '%s\n' "$BASE_SUITE" "${BASE_ARGS[@]}" "$(mmdebstrap --version)" | sha256sum | cut -c1-16)
BASE_IMAGE="localhost/headroom-base:$key"
base_tar="$CACHE/image-base/$key.tar"
if ! podman image exists "$BASE_IMAGE"; then
    if [ ! -s "$base_tar" ]; then
        say "base: mmdebstrap $BASE_SUITE (recipe $key; cached as $base_tar)"
        mkdir -p "$CACHE/image-base"
        mmdebstrap --quiet --format=tar "${BASE_ARGS[@]}" "$BASE_SUITE" "$base_tar.part"
        mv "$base_tar.part" "$base_tar"
    fi
    say "base: podman import $base_tar as $BASE_IMAGE"
    podman import --quiet "$base_tar" "$BASE_IMAGE" >/dev/null
fi

# ---- 2. wheels, built on the host ----
ctx="build/image"
rm -rf "$ctx" && mkdir -p "$ctx/wheels"
cons=image/constraints.txt
[ -s "$cons" ] || die "$cons is missing (regenerate it: bash image/lock.sh)"
ckey=$(sha256sum "$cons" | cut -c1-16)
deps="$CACHE/image-wheels/$ckey"
if [ ! -e "$deps/.complete" ]; then
    say "wheels: the pinned dependencies of $cons into $deps"
    rm -rf "$deps" && mkdir -p "$deps"
    "$PYTHON" -m pip download --quiet --only-binary=:all: --no-deps --dest "$deps" \
        --python-version 3.11 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --implementation cp -r "$cons" 2> >(quiet >&2)
    touch "$deps/.complete"
fi
cp "$deps"/*.whl "$ctx/wheels/"
say "wheels: the runtime wheel of this repository"
# from a clean copy of only what the wheel is made of (pyproject.toml, README.md, monitor/): no stale
# build/lib of an earlier build can leak into the wheel, nothing is left in the working tree, and files
# other tiers write while this one builds (.hypothesis/, .pytest_cache/, build/) are never read
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
# (copied by Python, not tar: tar fails when a file it reads changes, and tests import monitor/ meanwhile)
"$PYTHON" -c 'import shutil, sys
shutil.copytree("monitor", sys.argv[1] + "/monitor", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
for name in ("pyproject.toml", "README.md"):
    shutil.copy2(name, sys.argv[1])' "$src"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$PWD/$ctx/wheels" "$src" >/dev/null 2> >(quiet >&2)
cp "$cons" "$ctx/constraints.txt"
cp Dockerfile "$ctx/Dockerfile"

# ---- 3. the image ----
say "buildah: $TAG FROM $BASE_IMAGE"
previous=$(podman image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
buildah bud --quiet --layers=false --network=none --build-arg "BASE=$BASE_IMAGE" --tag "$TAG" --file "$ctx/Dockerfile" "$ctx" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$TAG")
# the image this build replaced, now untagged: remove it (each is about 550 MB)
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$TAG")" ]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
fi
say "built $TAG: $(( size / 1000000 )) MB"
