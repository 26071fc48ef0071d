#!/usr/bin/env bash
# Brings a fresh Debian machine (as root) to where the demo and the tests can run, reusing what already
# runs: installs redis-server, docker.io, busybox-static, chromium (the dashboard's browser test) and
# docker-compose (the compose file's test), btrfs-progs (the disk quota test's engine) and mmdebstrap
# (the stand-in base images of Harbor tasks), runsc (gVisor) and docker-registry (the registry test) if missing, starts dockerd without its
# default bridge when no engine answers, registers runsc with it as runtime `runsc`, runs `npm ci` when node_modules is stale, compiles dist/
# (incrementally), and builds the local sandbox image rollout-fleet/sandbox:busybox (there is no registry to pull from).
# Redis itself is not started here: the demo and the test suite each start a private redis-server
# when REDIS_URL is not set.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

need_pkgs=()
command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
command -v patchelf >/dev/null 2>&1 || need_pkgs+=(patchelf)
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3)  # the Python client (clients/python) and the example trainer run in the tests
# The Python client's test installs it into a fresh venv (python3-venv) and type-checks it with
# Debian's mypy (python3-mypy, 1.0.1).
/usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || need_pkgs+=(python3-venv)
/usr/bin/python3 -m mypy --version >/dev/null 2>&1 || need_pkgs+=(python3-mypy)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx patch || need_pkgs+=(busybox-static)
[ -x /usr/bin/chromium ] || need_pkgs+=(chromium)
command -v docker-compose >/dev/null 2>&1 || need_pkgs+=(docker-compose)
# The disk quota test's second engine keeps its data on a loop-mounted btrfs (StorageOpt size works
# there; overlay2 over xfs with pquota needs CONFIG_XFS_QUOTA, which these machines' kernel lacks).
command -v mkfs.btrfs >/dev/null 2>&1 || need_pkgs+=(btrfs-progs)
# Harbor tasks' Dockerfiles start FROM ubuntu:24.04, python:3.12-slim...: stand-ins are built from
# Debian's packages (build-base-images.sh), which needs mmdebstrap once (its output is cached).
command -v mmdebstrap >/dev/null 2>&1 || need_pkgs+=(mmdebstrap)
# gVisor's runsc, the optional sandbox runtime (FLEET_SANDBOX_RUNTIME=runsc), registered with the engine below.
[ -x /usr/bin/runsc ] || need_pkgs+=(runsc)
# Debian's docker-registry (the distribution registry) for the registry test (FLEET_REGISTRY): the test
# starts its own process on a free loopback port with a temp storage folder; the package's service
# on :5000 is not used (its start is refused in containers without an init system, harmless elsewhere).
command -v docker-registry >/dev/null 2>&1 || need_pkgs+=(docker-registry)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# The Docker engine: reuse one that answers on DOCKER_HOST or the default socket, else start dockerd.
docker_cli=/usr/bin/docker
[ -x "$docker_cli" ] || docker_cli=docker
if ! "$docker_cli" info >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ]; then
    log "DOCKER_HOST=$DOCKER_HOST is set but no engine answers there"; exit 1
  fi
  if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid   # left behind by a dockerd that died uncleanly
  fi
  log "starting dockerd (no bridge, no iptables: sandboxes use network none)"
  nohup dockerd --host unix:///var/run/docker.sock --bridge=none --iptables=false --ip-forward=false \
    >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 120); do
    "$docker_cli" info >/dev/null 2>&1 && break
    sleep 0.5
  done
  "$docker_cli" info >/dev/null 2>&1 || { log "dockerd did not answer; see /var/log/dockerd.log"; exit 1; }
fi

# runsc as the engine's runtime `runsc`, in /etc/docker/daemon.json (merged into what is there),
# loaded with SIGHUP: dockerd re-reads `runtimes` from that file, so nothing running is restarted.
# --network=none: the sandboxes have no network anyway, and runsc's own network set-up refuses to
# start here ("cannot run with network enabled in root network namespace"); gVisor's netstack then
# gives the sandbox a loopback only. --file-access=shared: the fleet writes into running sandboxes
# through the engine (the workspace, a Harbor task's /tests after the agent), which gVisor's default
# (exclusive) file cache does not see. Cgroups are kept (no --ignore-cgroups): they are what enforces
# the memory, CPU and pids limits on the Sentry.
register_runsc() {
  local conf=/etc/docker/daemon.json want
  want='{"path":"/usr/bin/runsc","runtimeArgs":["--network=none","--file-access=shared"]}'
  if [ "$("$docker_cli" info --format '{{json (index .Runtimes "runsc")}}' 2>/dev/null)" = "$want" ]; then return 0; fi
  if [ -n "${DOCKER_HOST:-}" ]; then log "runsc not registered with the engine at DOCKER_HOST=$DOCKER_HOST (not this host's dockerd)"; return 0; fi
  log "registering runsc with the engine ($conf, SIGHUP)"
  mkdir -p /etc/docker
  python3 - "$conf" "$want" <<'PY'
import json, os, sys
conf, want = sys.argv[1], json.loads(sys.argv[2])
doc = json.load(open(conf)) if os.path.exists(conf) and os.path.getsize(conf) else {}
doc.setdefault('runtimes', {})['runsc'] = want
tmp = conf + '.tmp'
with open(tmp, 'w') as f: json.dump(doc, f, indent=2); f.write('\n')
os.replace(tmp, conf)
PY
  local pid; pid=$(cat /var/run/docker.pid 2>/dev/null || pgrep -xo dockerd || true)
  [ -n "$pid" ] && kill -HUP "$pid"
  for _ in $(seq 1 40); do
    [ "$("$docker_cli" info --format '{{json (index .Runtimes "runsc")}}' 2>/dev/null)" = "$want" ] && return 0
    sleep 0.25
  done
  # Only the gVisor tests need it: everything else goes on (they then fail, naming the runtime).
  log "dockerd did not load runtime runsc from $conf; see /var/log/dockerd.log (the gVisor tests will fail)"
}
register_runsc

# Node dependencies: npm ci when node_modules is missing or older than the lock file (its prepare
# script compiles dist/).
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  log "npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
# The compiled CLI in dist/, which the demo, the workers and the tests run: always brought up to date
# (an incremental tsc, about a second when nothing changed), so edited sources are never run stale.
log "build dist/"
npm run build --silent

# The sandbox image, from busybox-static: no libc, starts in a fraction of a second.
bash .ci/build-sandbox-image.sh
# The fleet's own images for docker-compose, built offline from this host (no registry here).
bash .ci/build-fleet-images.sh
# Stand-in base images for Harbor task Dockerfiles (ubuntu:24.04, python:3.12-slim, ...), from one
# cached Debian root file system: a minute or more the first time, a no-op once tagged.
bash .ci/build-base-images.sh
log "ready: $("$docker_cli" version --format 'docker engine {{.Server.Version}}'), redis $(redis-server --version | grep -o 'v=[0-9.]*' | cut -c3-)"
