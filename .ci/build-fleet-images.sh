#!/usr/bin/env bash
# Builds the fleet's images offline, from what this host has (there is no registry to pull
# node:20-bookworm-slim or redis:7 from, and `docker build` has no network for `npm ci`):
#   rollout-fleet:local        this host's node (with the libraries ldd lists, at their own paths),
#                              patchelf, bash and ldd (the runtime generation's portable node needs
#                              them), busybox, and the project: package.json, dist/, examples/ and the
#                              production node_modules (the dev dependencies pruned offline)
#   rollout-fleet/redis:local  this host's redis-server with its libraries
# Each is a `docker import` of a folder assembled here, with the entrypoint the Dockerfile and
# redis:7 have. Rebuilt when the project's build changed (the image is labelled with a hash of dist/,
# package-lock.json and this script); otherwise a no-op. docker-compose.offline.yml uses them.
# Usage: bash .ci/build-fleet-images.sh   (after `npm ci`, which builds dist/)
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
docker_cli=/usr/bin/docker
[ -x "$docker_cli" ] || docker_cli=docker
fleet_image=rollout-fleet:local
redis_image=rollout-fleet/redis:local
[ -f "$root_dir/dist/src/cli/bin.js" ] || { echo "build-fleet-images: dist/ is missing: run npm ci first" >&2; exit 1; }

stamp=$( (cd "$root_dir" && find dist -type f -print0 | sort -z | xargs -0 sha256sum; sha256sum package-lock.json .ci/build-fleet-images.sh) | sha256sum | cut -c1-16)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# Copy a binary and every library ldd lists (the loader included) to the same paths under $1.
with_libs() {
  local dest=$1 bin=$2 at=${3:-$2}
  mkdir -p "$dest$(dirname "$at")"
  cp -L "$bin" "$dest$at"
  for lib in $(ldd "$bin" | grep -o '/[^ ]*' | sort -u); do
    mkdir -p "$dest$(dirname "$lib")"
    [ -e "$dest$lib" ] || cp -L "$lib" "$dest$lib"
  done
}

base_rootfs() {
  local dest=$1
  chmod 755 "$dest"
  mkdir -p "$dest/bin" "$dest/tmp" "$dest/etc"
  chmod 1777 "$dest/tmp"
  cp /bin/busybox "$dest/bin/busybox"
  for applet in sh cat ls env sleep kill ps; do ln -s busybox "$dest/bin/$applet"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$dest/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$dest/etc/group"
}

# The image a rebuild replaces is removed (it would stay as a dangling 200 MB layer otherwise).
drop_replaced() {
  local old=$1 image=$2 new
  new=$("$docker_cli" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  if [ -n "$old" ] && [ "$old" != "$new" ]; then "$docker_cli" rmi "$old" >/dev/null 2>&1 || true; fi
}

labelled() {
  [ "$("$docker_cli" image inspect --format '{{ index .Config.Labels "rollout-fleet.build" }}' "$1" 2>/dev/null || true)" = "$stamp" ]
}

if ! labelled "$fleet_image"; then
  old_fleet=$("$docker_cli" image inspect --format '{{.Id}}' "$fleet_image" 2>/dev/null || true)
  printf '[setup] building %s (offline, from this host)\n' "$fleet_image" >&2
  r="$stage/fleet"
  mkdir -p "$r"
  base_rootfs "$r"
  with_libs "$r" "$(readlink -f "$(command -v node)")" /usr/local/bin/node
  with_libs "$r" "$(command -v patchelf)" /usr/bin/patchelf
  with_libs "$r" "$(command -v bash)" /bin/bash
  cp "$(command -v ldd)" "$r/usr/bin/ldd"
  app="$r/opt/rollout-fleet"
  mkdir -p "$app"
  cp "$root_dir/package.json" "$root_dir/package-lock.json" "$app/"
  cp -a "$root_dir/dist" "$root_dir/examples" "$app/"
  cp -a "$root_dir/node_modules" "$app/node_modules"
  (cd "$app" && npm prune --omit=dev --offline --no-audit --no-fund --ignore-scripts >/dev/null 2>&1)
  tar --numeric-owner -C "$r" -c . | "$docker_cli" import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change 'ENV NODE_ENV=production' \
    --change 'WORKDIR /opt/rollout-fleet' --change "LABEL rollout-fleet.build=$stamp" \
    --change 'ENTRYPOINT ["node", "dist/src/cli/bin.js"]' --change 'CMD ["worker"]' - "$fleet_image" >/dev/null
  drop_replaced "$old_fleet" "$fleet_image"
fi

if ! labelled "$redis_image"; then
  old_redis=$("$docker_cli" image inspect --format '{{.Id}}' "$redis_image" 2>/dev/null || true)
  printf '[setup] building %s (offline, from this host)\n' "$redis_image" >&2
  r="$stage/redis"
  mkdir -p "$r/data"
  base_rootfs "$r"
  with_libs "$r" "$(readlink -f "$(command -v redis-server)")" /usr/local/bin/redis-server
  # As redis:7's entrypoint: options alone run redis-server; without a config file protected mode is off
  # (the compose network and the host's loopback are the only ways in).
  cat >"$r/usr/local/bin/docker-entrypoint.sh" <<'SH'
#!/bin/sh
if [ "${1#-}" != "$1" ]; then set -- redis-server "$@"; fi
if [ "$1" = redis-server ]; then shift; set -- redis-server --protected-mode no "$@"; fi
exec "$@"
SH
  chmod 755 "$r/usr/local/bin/docker-entrypoint.sh"
  tar --numeric-owner -C "$r" -c . | "$docker_cli" import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change 'WORKDIR /data' --change "LABEL rollout-fleet.build=$stamp" \
    --change 'ENTRYPOINT ["docker-entrypoint.sh"]' --change 'CMD ["redis-server"]' - "$redis_image" >/dev/null
  drop_replaced "$old_redis" "$redis_image"
fi
