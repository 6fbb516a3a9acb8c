#!/bin/sh
# Builds a Debian root filesystem with debootstrap and imports it into the local image store
# (<data dir>/images), where the `local` sandbox runtime finds it by image reference.
#
#   infra/images/debian-rootfs.sh [--name REF] [--suite SUITE] [--include PKG,PKG] [--mirror URL]
#                                 [--data-dir DIR] [--keep DIR]
#
#   --name      image reference to store it under (default debian:SUITE, or
#               debian:SUITE-python3 when --include python3 is given)
#   --suite     Debian suite (default bookworm)
#   --include   extra packages, comma-separated (e.g. python3 or python3,git,curl)
#   --mirror    Debian mirror (default http://deb.debian.org/debian)
#   --data-dir  the service's data dir (default $SVC_DATA_DIR, else ./data)
#   --keep DIR  build into DIR and keep it (default: a temporary dir, removed afterwards)
#
# Needs root and Debian's `debootstrap` package. About 45 s and 206 MB for bookworm minbase.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
suite=bookworm
include=
name=
mirror=http://deb.debian.org/debian
data_dir=${SVC_DATA_DIR:-./data}
keep=

while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --include) include=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "debian-rootfs.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -z "$name" ]; then
  name="debian:$suite"
  [ -n "$include" ] && name="debian:$suite-$(echo "$include" | tr ',' '-')"
fi
command -v debootstrap >/dev/null || { echo "debian-rootfs.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "debian-rootfs.sh: debootstrap needs root" >&2; exit 1; }

if [ -n "$keep" ]; then
  target=$keep
  mkdir -p "$target"
else
  target=$(mktemp -d "${TMPDIR:-/tmp}/debian-rootfs.XXXXXX")
  trap 'rm -rf "$target"' EXIT
fi

echo "debian-rootfs.sh: debootstrap --variant=minbase $suite into $target${include:+ (with $include)}" >&2
debootstrap --variant=minbase ${include:+--include="$include"} "$suite" "$target" "$mirror" >&2
# no package caches or lists in the image
rm -rf "$target"/var/cache/apt/archives/*.deb "$target"/var/lib/apt/lists/*

cd "$repo"
node --import tsx --input-type=module -e "
const { imagesCommand } = await import('./services/sandbox-runner/images/images.ts');
process.exitCode = await imagesCommand(['import', process.argv[1], process.argv[2]], process.argv[3]);
" "$name" "$target" "$data_dir"
