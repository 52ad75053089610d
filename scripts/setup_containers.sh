#!/usr/bin/env bash
# Make this machine able to run task containers offline (the container sandbox provider and the
# Harbor server). Run as root: `bash scripts/setup_containers.sh`. Idempotent: a second run only checks.
#
# What it installs (Debian packages, with apt-get):
#   podman      runs the containers (OCI, no daemon). It runs as root here: rootless podman needs
#               subordinate id ranges (/etc/subuid and /etc/subgid are empty on these machines) and,
#               on cgroup v1 as here, cannot put memory, process or CPU limits on a container at all.
#   runc        the OCI runtime podman is told to use (crun, podman's default, refuses this kind of
#               machine's hybrid cgroup layout).
#   mmdebstrap  builds a Debian root filesystem from Debian's packages, without any image registry.
# Root is needed to install packages, to run podman the only way that enforces limits here, and to
# build root filesystems (files owned by other users, device nodes).
#
# What it builds, once, into $ENVSDK_BASE_IMAGE_DIR (default /var/lib/envsdk/base-images), the root
# filesystems of the two base images task Dockerfiles name in FROM; envsdk loads them into its
# container store under the stock names when a build needs them (envsdk.sandbox.images):
#   debian-bookworm-slim.tar        debian:bookworm-slim: Debian 12 minbase, without documentation,
#                                   manual pages and translations (as the stock slim image).
#   python-3.11-slim-bookworm.tar   python:3.11-slim-bookworm: the same plus Debian's python3 (3.11),
#                                   python3-pip and python-is-python3; python, python3, pip and pip3 also
#                                   in /usr/local/bin where the stock image has them; pip installs as
#                                   root without Debian's "externally managed" refusal, as in the stock
#                                   image. pip needs no network for what is on disk (local wheels and
#                                   folders); installing from PyPI needs a task with network.
# Packages come from this machine's own apt sources (its Debian bookworm entries, so an offline mirror
# works); ENVSDK_DEBIAN_MIRROR overrides them (a URL, a "deb ..." line or a sources file, as mmdebstrap
# takes). Each tar is written under a temporary name and renamed when complete.
set -euo pipefail

me="setup_containers.sh"
if [ "$EUID" -ne 0 ]; then
  echo "$me: must run as root (it installs Debian packages and builds root filesystems): e.g. sudo bash scripts/setup_containers.sh" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  echo "$me: apt-get not found: this script installs Debian packages (podman, runc, mmdebstrap) and needs a Debian-based machine" >&2
  exit 1
fi

started=$SECONDS
packages=(podman runc mmdebstrap)
missing=()
for pkg in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  t0=$SECONDS
  wait=(-o DPkg::Lock::Timeout=600)
  if ! { apt-get "${wait[@]}" update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -qq "${missing[@]}" >/dev/null; }; then
    echo "$me: apt-get could not install ${missing[*]} (see its message above)" >&2
    exit 1
  fi
  echo "$me: installed ${missing[*]} ($((SECONDS - t0)) s)"
else
  echo "$me: ${packages[*]} already installed"
fi

dir="${ENVSDK_BASE_IMAGE_DIR:-/var/lib/envsdk/base-images}"
mkdir -p "$dir"
# One run at a time builds; a second waits, then finds the files made.
exec 9>"$dir/.setup.lock"
if ! flock -w 3600 9; then
  echo "$me: another run has held $dir/.setup.lock for an hour; is it stuck?" >&2
  exit 1
fi

# The machine's Debian bookworm package sources as one-line apt entries ("deb URI SUITE COMPONENTS"):
# the entries whose suite or release codename is bookworm (updates and security included), whichever
# host they name. Other vendors' entries (nodesource, cloud SDKs) are left out of the images.
debian_sources() {
  apt-get indextargets --format '$(IDENTIFIER) $(REPO_URI) $(RELEASE) $(CODENAME) $(COMPONENT)' 2>/dev/null \
    | awk '$1 == "Packages" && ($3 ~ /^bookworm(-|$)/ || $4 ~ /^bookworm(-|$)/) {
        key = $2 " " $3
        if (!(key in comps)) { order[n++] = key; comps[key] = "" }
        if (index(comps[key] " ", " " $5 " ") == 0) comps[key] = comps[key] " " $5
      }
      END { for (i = 0; i < n; i++) print "deb " order[i] comps[order[i]] }'
}

# The MIRROR arguments of mmdebstrap, chosen (and said) before the first build.
mirrors=()
mirrors_chosen=""
choose_mirrors() {
  [ -n "$mirrors_chosen" ] && return
  mirrors_chosen=1
  if [ -n "${ENVSDK_DEBIAN_MIRROR:-}" ]; then
    mirrors=("$ENVSDK_DEBIAN_MIRROR")
    echo "$me: packages from ENVSDK_DEBIAN_MIRROR: $ENVSDK_DEBIAN_MIRROR"
    return
  fi
  local line
  while IFS= read -r line; do mirrors+=("$line"); done < <(debian_sources)
  if [ "${#mirrors[@]}" -gt 0 ]; then
    echo "$me: packages from this machine's apt sources:"
    printf '  %s\n' "${mirrors[@]}"
  else
    echo "$me: no Debian bookworm entry in this machine's apt sources; using mmdebstrap's default (deb.debian.org, with updates and security)"
  fi
}

# As the stock slim images: merged /usr made by mmdebstrap's hook (without it, bookworm's minbase pulls
# in the usrmerge package and a full perl), no documentation, manual pages, info pages or translations
# (the dpkg configuration stays in the image, so packages a Dockerfile installs later are slimmed too),
# and no service started by a package install (a policy-rc.d of our own, kept in the image, instead of
# mmdebstrap's temporary one).
slim=(
  --variant=minbase
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/linda/*'
  --dpkgopt='path-exclude=/usr/share/lintian/overrides/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --skip=chroot/policy-rc.d
  --setup-hook='mkdir -p "$1/usr/sbin" && printf "#!/bin/sh\nexit 101\n" > "$1/usr/sbin/policy-rc.d" && chmod 0755 "$1/usr/sbin/policy-rc.d"'
)
merged_usr=/usr/share/mmdebstrap/hooks/merged-usr
if [ -d "$merged_usr" ]; then slim+=(--hook-dir="$merged_usr"); fi
python=(
  --include=python3,python3-pip,python-is-python3
  --customize-hook='chroot "$1" python3 -c "import sys, pip; assert sys.version_info[:2] == (3, 11), sys.version"'
  --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED'
  --customize-hook='for n in python3 python pip3 pip; do ln -sf /usr/bin/$n "$1/usr/local/bin/$n"; done'
)

# build NAME OPTIONS...: NAME.tar in $dir unless it exists.
build() {
  local name=$1 out="$dir/$1.tar" tmp log t0
  shift
  if [ -s "$out" ]; then
    echo "$me: $out exists ($(du -m "$out" | cut -f1) MB), kept"
    return
  fi
  choose_mirrors
  tmp="$dir/.$name.tar.tmp.$$"
  log="$dir/.$name.log"
  trap 'rm -f "$tmp"' EXIT
  t0=$SECONDS
  echo "$me: building $out ..."
  if ! mmdebstrap --quiet --format=tar "$@" bookworm "$tmp" "${mirrors[@]}" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "$me: mmdebstrap failed building $out (last lines above; whole log: $log)" >&2
    exit 1
  fi
  mv -f "$tmp" "$out"
  rm -f "$log"
  trap - EXIT
  echo "$me: built $out ($(du -m "$out" | cut -f1) MB, $((SECONDS - t0)) s)"
}

build debian-bookworm-slim "${slim[@]}"
build python-3.11-slim-bookworm "${slim[@]}" "${python[@]}"
echo "$me: done in $((SECONDS - started)) s; base images in $dir"
