#!/usr/bin/env bash
# Builds the images docker-compose.yml runs, on this machine, from local files only (no image
# registry is needed or used):
#
#   svc-compose/debian:bookworm   the base: a debootstrap (minbase) root filesystem, `docker import`ed
#   svc-compose/kafka:4.3.1       + Debian's JRE + the Kafka jars infra/kafka resolves from Maven Central
#   svc-compose/svc:local         + the sandbox packages (infra/sandbox-packages.txt), this machine's
#                                 node binary, the project's production node_modules (chdb included)
#                                 and its sources; the base rootfs is also baked in as the sandbox
#                                 image `debian:bookworm` (the runner's image store)
#
#   infra/compose/build-images.sh [--rebuild]
#
# Idempotent: each image carries a fingerprint of what it is built from (label
# svc.fingerprint) and is rebuilt only when that changes (--rebuild: always); Docker's build
# cache keeps the unchanged layers. The debootstrap root filesystem is made once and cached as
# a tarball in $XDG_CACHE_HOME/svc/compose (~/.cache/svc/compose); build contexts are temporary
# directories (hard links where possible), so nothing is written into the checkout.
#
# Needs: root, Debian's docker.io (a running dockerd) and debootstrap, node, java and mvn
# (infra/kafka resolves the broker's jars), and the project's node_modules (npm ci). Network:
# the Debian mirror (debootstrap, and apt-get inside `docker build --network host` for the JRE
# and the sandbox packages) and Maven Central on the first run; npm is never run in a build.
#
# Settings (environment): DOCKER (default: Debian's /usr/bin/docker, else docker on PATH),
# DEBIAN_MIRROR (default http://deb.debian.org/debian), SVC_COMPOSE_CACHE (the cache dir).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${SVC_COMPOSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/svc/compose}
rebuild=false
for arg in "$@"; do
  case "$arg" in
    --rebuild) rebuild=true ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "build-images.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=$(command -v docker || true); fi
fi
[ -n "$DOCKER" ] || { echo "build-images.sh: docker is missing (apt-get install docker.io)" >&2; exit 1; }
# The classic builder: what Debian's docker.io 20.10 has without the buildx plugin.
export DOCKER_BUILDKIT=0
"$DOCKER" info >/dev/null 2>&1 || { echo "build-images.sh: cannot reach the Docker daemon (start dockerd)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "build-images.sh: needs root (debootstrap, and a root filesystem with its owners)" >&2; exit 1; }

KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$repo/infra/kafka/pom.xml")
BASE=svc-compose/debian:$suite
KAFKA=svc-compose/kafka:$KAFKA_VERSION
SVC=svc-compose/svc:local

say() { echo "build-images.sh: $*" >&2; }
started=$(date +%s)
mkdir -p "$cache"
work=$(mktemp -d "${TMPDIR:-/tmp}/svc-compose-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Hard links when on the same filesystem (instant, no space), a copy otherwise.
link_or_copy() { cp -al "$1" "$2" 2>/dev/null || cp -a "$1" "$2"; }
sha() { sha256sum | cut -c1-64; }
label_of() { "$DOCKER" image inspect -f '{{ index .Config.Labels "svc.fingerprint" }}' "$1" 2>/dev/null || true; }
image_id() { "$DOCKER" image inspect -f '{{ .Id }}' "$1"; }
# up_to_date IMAGE FINGERPRINT: whether IMAGE exists with that fingerprint (and no --rebuild).
up_to_date() { [ "$rebuild" = false ] && [ "$(label_of "$1")" = "$2" ]; }

# --- The base: debootstrap once (cached tarball), then docker import ------------------------
rootfs_tar=$cache/debian-$suite-minbase.tar
if [ ! -s "$rootfs_tar" ]; then
  command -v debootstrap >/dev/null || { echo "build-images.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
  say "debootstrap --variant=minbase $suite from $mirror (once; cached in $rootfs_tar)…"
  root=$work/rootfs
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
  }
  # apt inside the images: the suite, its updates and security (the mirror's layout), no caches.
  security=${mirror%/debian}/debian-security
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
    "$mirror" "$suite" "$mirror" "$suite" "$security" "$suite" >"$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar --numeric-owner -C "$root" -cf "$rootfs_tar.tmp" .
  mv "$rootfs_tar.tmp" "$rootfs_tar"
  rm -rf "$root"
fi
[ -s "$rootfs_tar.sha256" ] && [ "$rootfs_tar.sha256" -nt "$rootfs_tar" ] || sha <"$rootfs_tar" >"$rootfs_tar.sha256"
base_fp=$(cat "$rootfs_tar.sha256")
if up_to_date "$BASE" "$base_fp"; then
  say "$BASE is up to date"
else
  say "importing $BASE from $rootfs_tar…"
  "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL svc.fingerprint=$base_fp" \
    --change 'CMD ["/bin/bash"]' \
    "$rootfs_tar" "$BASE" >/dev/null
fi
base_id=$(image_id "$BASE")

# --- Kafka: Debian's JRE and the jars infra/kafka resolves from Maven Central -----------------
classpath=$(cd "$repo" && node --input-type=module -e "
  const { kafkaClasspath } = await import('./infra/kafka/kafka.mjs');
  console.log(await kafkaClasspath());
")
# The broker's settings, from the one place that has them (the tests' broker uses the same).
server_properties=$(cd "$repo" && node --input-type=module -e "
  const { serverProperties } = await import('./infra/kafka/kafka.mjs');
  process.stdout.write(serverProperties({ dataDir: '/var/lib/kafka/data', brokerPort: 9092, controllerPort: 9093, listenHost: '0.0.0.0', advertised: 'PLAINTEXT://kafka:9092' }));
")
kafka_fp=$( {
  echo "$base_id"
  cat "$here/kafka.Dockerfile" "$here/kafka-start.sh" "$here/kafka-log4j2.xml"
  echo "$server_properties"
  tr ':' '\n' <<<"$classpath" | xargs -n1 basename | sort
} | sha)
if up_to_date "$KAFKA" "$kafka_fp"; then
  say "$KAFKA is up to date"
else
  say "building $KAFKA…"
  ctx=$work/kafka
  mkdir -p "$ctx/libs"
  tr ':' '\n' <<<"$classpath" | while read -r jar; do link_or_copy "$jar" "$ctx/libs/"; done
  cp "$here/kafka-start.sh" "$here/kafka-log4j2.xml" "$ctx/"
  printf '%s\n' "$server_properties" >"$ctx/server.base.properties"
  "$DOCKER" build -q --network host -f "$here/kafka.Dockerfile" --build-arg "BASE=$BASE" \
    --label "svc.fingerprint=$kafka_fp" -t "$KAFKA" "$ctx" >/dev/null
  rm -rf "$ctx"
fi

# --- The service: sandbox packages, node, node_modules, sources, the sandbox base image -------
packages=$(sed 's/#.*//' "$repo/infra/sandbox-packages.txt" | xargs)
node_bin=$(readlink -f "$(command -v node)")
[ -f "$repo/node_modules/.package-lock.json" ] || { echo "build-images.sh: $repo/node_modules is missing or incomplete (npm ci)" >&2; exit 1; }
# The dashboard's static files, built here: the image has no Vite (production dependencies only).
(cd "$repo" && node packages/dashboard/build.mjs)
# What the image holds of the checkout: everything git knows (tracked, or new and not ignored)
# but the tests, docs and CI scripts, and the dashboard's build.
sources() {
  (cd "$repo" && git ls-files -co --exclude-standard -z && find packages/dashboard/dist -type f -print0) | tr '\0' '\n' |
    grep -Ev '^(test|docs|\.ci|infra/compose)/|^node_modules/|^docker-compose\.yml$|^README\.md$' |
    while read -r f; do [ -f "$repo/$f" ] && echo "$f"; done
}
svc_fp=$( {
  echo "$base_id"
  echo "$packages"
  "$node_bin" --version
  sha <"$node_bin"
  cat "$here/svc.Dockerfile" "$repo/node_modules/.package-lock.json"
  sources | (cd "$repo" && xargs -d '\n' sha256sum)
} | sha)
if up_to_date "$SVC" "$svc_fp"; then
  say "$SVC is up to date"
else
  say "building $SVC…"
  ctx=$work/svc
  mkdir -p "$ctx/node_modules" "$ctx/bin"
  cp "$node_bin" "$ctx/bin/node"
  # The production dependencies only (npm ls lists their directories; nothing is installed).
  (cd "$repo" && npm ls --omit=dev --all --parseable 2>/dev/null || true) | tail -n +2 |
    sed "s:^$repo/node_modules/::" | grep -v '/node_modules/' | sort -u | while read -r dir; do
      mkdir -p "$ctx/node_modules/$(dirname "$dir")"
      link_or_copy "$repo/node_modules/$dir" "$ctx/node_modules/$dir"
    done
  link_or_copy "$repo/node_modules/.bin" "$ctx/node_modules/.bin"
  sources | while read -r f; do
    mkdir -p "$ctx/app/$(dirname "$f")"
    link_or_copy "$repo/$f" "$ctx/app/$f"
  done
  # The sandboxes' `base: debian:bookworm`: the same root filesystem, imported once with
  # `svc images import` into an image store kept as a tarball in the cache (ADD keeps owners).
  store_tar=$cache/sandbox-images-$suite.tar
  if [ ! -s "$store_tar" ] || [ "$store_tar" -ot "$rootfs_tar" ]; then
    say "importing the sandbox image debian:$suite (svc images import)…"
    store=$work/store
    mkdir -p "$store"
    (cd "$repo" && node --import tsx --input-type=module -e "
      const { imagesCommand } = await import('./services/sandbox-runner/images/images.ts');
      process.exitCode = await imagesCommand(['import', process.argv[1], process.argv[2]], process.argv[3]);
    " "debian:$suite" "$rootfs_tar" "$store") >&2
    tar --numeric-owner -C "$store" -cf "$store_tar.tmp" images
    mv "$store_tar.tmp" "$store_tar"
    rm -rf "$store"
  fi
  link_or_copy "$store_tar" "$ctx/sandbox-images.tar"
  "$DOCKER" build -q --network host -f "$here/svc.Dockerfile" --build-arg "BASE=$BASE" --build-arg "PACKAGES=$packages" \
    --label "svc.fingerprint=$svc_fp" -t "$SVC" "$ctx" >/dev/null
  rm -rf "$ctx"
fi

# Earlier builds these replaced (untagged now, and only ours: they carry the label).
"$DOCKER" image prune -f --filter label=svc.fingerprint >/dev/null
say "images ready in $(( $(date +%s) - started )) s: $BASE $KAFKA $SVC"
