#!/usr/bin/env bash
# apt-install.sh NAME PACKAGE... installs Debian packages from Debian's own
# archive, for the project's install scripts (NAME prefixes its messages).
#
# It is idempotent: packages already installed are skipped, and nothing is
# fetched when all are present. A slow mirror is not a failure: apt
# retries each download, the whole install is tried again with a growing
# pause, and nothing is timed out. Only an install that fails every
# attempt fails the script, so that what needs the packages is never
# silently skipped. Run it as root (or with sudo available).
set -euo pipefail

name=$1
shift
missing=()
for p in "$@"; do
	if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "$name: already installed: $*"
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "$name: apt-get not found; install ${missing[*]} (Debian package names) by hand" >&2
	exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null; then
		echo "$name: need root (or sudo) to install ${missing[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi
echo "$name: installing ${missing[*]}"
apt_opts=(-o Acquire::Retries=10 -o Acquire::http::Timeout=300 -o DPkg::Lock::Timeout=600)
for attempt in 1 2 3 4 5; do
	if "${sudo[@]}" apt-get "${apt_opts[@]}" update &&
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"; then
		exit 0
	fi
	echo "$name: attempt $attempt failed; trying again in $((attempt * 30))s" >&2
	sleep $((attempt * 30))
done
echo "$name: could not install ${missing[*]}" >&2
exit 1
