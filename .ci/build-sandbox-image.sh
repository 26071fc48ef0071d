#!/usr/bin/env bash
# Builds the sandbox image rollout-fleet/sandbox:busybox from busybox-static on the engine at
# DOCKER_HOST (default socket when unset): no registry is needed. No-op when the image exists.
set -euo pipefail
image=${1:-rollout-fleet/sandbox:busybox}
docker_cli=/usr/bin/docker
[ -x "$docker_cli" ] || docker_cli=docker
"$docker_cli" image inspect "$image" >/dev/null 2>&1 && exit 0
printf '[setup] building %s\n' "$image" >&2
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# The archive's "./" entry gives the image's / its mode: mktemp's 0700 would leave / root-only, which
# overlay2 happens to hide (its merged root is the engine's own 0755 folder) but btrfs does not.
chmod 755 "$root"
mkdir -p "$root/bin" "$root/tmp" "$root/etc" "$root/workspace"
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
tar --numeric-owner -C "$root" -c . | "$docker_cli" import \
  --change 'ENV PATH=/bin' --change 'WORKDIR /workspace' - "$image" >/dev/null
