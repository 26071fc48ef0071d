#!/usr/bin/env bash
# Builds stand-in base images for Harbor task Dockerfiles: there is no registry here to pull
# ubuntu:24.04 or python:3.12-slim from, so one Debian bookworm root file system (mmdebstrap, from
# Debian's packages) is imported once and tagged with the names published Dockerfiles start FROM.
# It is not the real image: python is Debian's 3.11 under every python:* name, ubuntu:* is Debian,
# and the images say so in their labels (rollout-fleet.stand-in=true, rollout-fleet.stand-in-for).
# A name that already holds a real image (no stand-in label) is left alone.
# The root file system is cached in $ROLLOUT_FLEET_CACHE (default /var/cache/rollout-fleet), named by
# a hash of the package list and this script, so a machine whose engine was wiped imports again
# without rebuilding; when every name is already tagged with the current stand-in, this is a no-op
# (one `docker image inspect`).
# Usage: bash .ci/build-base-images.sh   (needs mmdebstrap only when the cache is cold)
set -euo pipefail
docker_cli=/usr/bin/docker
[ -x "$docker_cli" ] || docker_cli=docker
cache_dir=${ROLLOUT_FLEET_CACHE:-/var/cache/rollout-fleet}
log() { printf '[setup] %s\n' "$*" >&2; }

# What real task Dockerfiles expect of a base or install with apt-get (which finds no network in a
# build step here: an already-installed package is all `apt-get install` can succeed with).
packages=python3,python3-pytest,python3-pip,python3-venv,python-is-python3,bash,ca-certificates,procps,curl,git,wget,unzip,xz-utils,jq,tmux,asciinema,less,patch,file,build-essential,openssl,sqlite3,python3-requests,python3-numpy,python3-flask,vim-tiny,nano,passwd,adduser
names=(
  ubuntu:24.04 ubuntu:22.04 ubuntu:20.04 ubuntu:latest ubuntu:noble ubuntu:jammy
  debian:bookworm debian:bookworm-slim debian:12 debian:12-slim debian:latest debian:stable-slim
  python:3.13-slim python:3.13 python:3.12-slim python:3.12 python:3.11-slim python:3.11
  python:3.10-slim python:3.10 python:3.9-slim python:3-slim python:slim python:latest
  python:3.13-slim-bookworm python:3.12-slim-bookworm python:3.11-slim-bookworm
  python:3.12-bookworm python:3.11-bookworm
  ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest
  ghcr.io/laude-institute/t-bench/python-3-13:20250620
  ghcr.io/laude-institute/t-bench/python-3-13:latest
)
# The root file system is named by its package list; the image by that, this script and the offline
# shims in .ci/stand-in/ (uv and uvx, a --ctrf pytest plugin, apt-get and pip wrappers), which are a
# layer over it: editing a shim rebuilds one small layer, not the root file system.
here=$(cd "$(dirname "$0")" && pwd)
rootfs_key=$(printf '%s\n' "$packages" | sha256sum | cut -c1-16)
key=$( (printf '%s\n' "$packages"; cat "$0" "$here"/stand-in/*) | sha256sum | cut -c1-16)
rootfs=rollout-fleet/base-rootfs:bookworm-$rootfs_key
image=rollout-fleet/base:bookworm-$key

# Fast path: every name holds this stand-in (or a real image of its own): one inspect of all names.
if labels=$("$docker_cli" image inspect --format \
  '{{index .Config.Labels "rollout-fleet.stand-in"}} {{index .Config.Labels "rollout-fleet.base-key"}}' \
  "${names[@]}" 2>/dev/null); then
  stale=$(printf '%s\n' "$labels" | grep '^true ' | grep -cvx "true $key" || true)
  [ "$stale" = 0 ] && exit 0
fi

if ! "$docker_cli" image inspect "$rootfs" >/dev/null 2>&1; then
  tarball=$cache_dir/base-bookworm-$rootfs_key.tar
  if [ ! -s "$tarball" ]; then
    command -v mmdebstrap >/dev/null 2>&1 || { log "build-base-images: mmdebstrap is missing (apt-get install mmdebstrap)"; exit 1; }
    mkdir -p "$cache_dir"
    log "building the stand-in base root file system (mmdebstrap bookworm, about a minute)"
    # Written beside the final name and renamed: a run killed midway leaves no truncated cache.
    # The hook lets `pip install` into the system python, as in the python:* images (Debian marks
    # its python EXTERNALLY-MANAGED).
    mmdebstrap --quiet --variant=apt --include="$packages" \
      --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
      bookworm "$tarball.partial.tar"
    mv "$tarball.partial.tar" "$tarball"
    # Older caches (another package list) are of no further use.
    find "$cache_dir" -maxdepth 1 -name 'base-bookworm-*.tar' ! -name "base-bookworm-$rootfs_key.tar" -delete
  fi
  log "importing $rootfs"
  # The defaults real base images have: no WORKDIR (/), CMD bash, a UTF-8 locale, no pip warnings
  # about running as root.
  "$docker_cli" import \
    --change 'CMD ["bash"]' \
    --change 'ENV LANG=C.UTF-8 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL rollout-fleet.stand-in=true' \
    --change "LABEL rollout-fleet.base-key=$rootfs_key" \
    --change 'LABEL rollout-fleet.stand-in-for="published base images (Debian bookworm, python 3.11)"' \
    "$tarball" "$rootfs" >/dev/null
fi

if ! "$docker_cli" image inspect "$image" >/dev/null 2>&1; then
  log "adding the offline shims to $image"
  # The classic builder suffices for this layer (no network, plain COPY); its context is .ci/stand-in.
  "$docker_cli" build --quiet --network none -t "$image" -f - "$here/stand-in" >/dev/null <<EOF
FROM $rootfs
COPY uv apt-get pip /usr/local/bin/
COPY ctrf_standin.py /usr/lib/python3/dist-packages/ctrf_standin.py
RUN chmod 755 /usr/local/bin/uv /usr/local/bin/apt-get /usr/local/bin/pip \\
 && ln -sf uv /usr/local/bin/uvx && ln -sf pip /usr/local/bin/pip3 \\
 && mkdir -p /root/.local/bin && ln -sf /usr/local/bin/uv /root/.local/bin/uv && ln -sf /usr/local/bin/uv /root/.local/bin/uvx \\
 && printf '#!/bin/sh\\ncase ":\$PATH:" in *":\$HOME/.local/bin:"*) ;; *) export PATH="\$HOME/.local/bin:\$PATH" ;; esac\\n' > /root/.local/bin/env
LABEL rollout-fleet.base-key=$key
EOF
fi

tagged=()
for name in "${names[@]}"; do
  # A real image under this name (pulled or loaded by an operator) wins over the stand-in.
  if current=$("$docker_cli" image inspect --format '{{index .Config.Labels "rollout-fleet.stand-in"}}' "$name" 2>/dev/null) \
    && [ "$current" != true ]; then
    continue
  fi
  "$docker_cli" tag "$image" "$name"
  tagged+=("$name")
done
log "stand-in base image $image tagged as ${#tagged[@]} names: ${tagged[*]}"
