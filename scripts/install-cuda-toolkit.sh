#!/usr/bin/env bash
# install-cuda-toolkit.sh installs, from Debian's own archive, what the
# CUDA build (make check-cuda, build-cuda, generate-cuda) needs:
#
#   nvidia-cuda-dev      cuda.h and the CUDA libraries' headers (non-free)
#   nvidia-cuda-toolkit  nvcc, to compile the kernels to PTX (non-free)
#   clang-14             the host compiler nvcc 11.8 accepts (Debian's gcc 12 is too new)
#   libcuda1             libcuda.so, which gorgonia.org/cu links (non-free)
#
# The packages live in Debian's contrib and non-free sections, which a
# system may not enable. This script never edits the system's apt
# sources: it copies the Debian entries of this release into a temporary
# directory with contrib and non-free added, and points apt-get at that
# directory (and at temporary package lists) for the one install.
#
# It is idempotent: when nvcc, cuda.h, libcuda.so and clang-14 are all
# present, it exits at once without touching apt. It needs root (or
# sudo), about 1.6 GB of downloads and 5.4 GB of disk.
set -euo pipefail

name=install-cuda-toolkit
packages=(nvidia-cuda-dev nvidia-cuda-toolkit clang-14 libcuda1)

have_toolkit() {
	command -v nvcc >/dev/null &&
		command -v clang-14 >/dev/null &&
		[ -e /usr/include/cuda.h ] &&
		{ ldconfig -p 2>/dev/null | grep 'libcuda\.so ' >/dev/null; }
}

if have_toolkit; then
	echo "$name: already installed: nvcc, cuda.h, libcuda.so, clang-14"
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "$name: apt-get not found; install ${packages[*]} (Debian package names) by hand" >&2
	exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null; then
		echo "$name: need root (or sudo) to install ${packages[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi

# shellcheck disable=SC1091
. /etc/os-release
codename=${VERSION_CODENAME:-}
if [ -z "$codename" ]; then
	echo "$name: no VERSION_CODENAME in /etc/os-release: not a Debian release this script knows" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap '${sudo[@]+"${sudo[@]}"} rm -rf "$tmp"' EXIT
mkdir -p "$tmp/sources" "$tmp/lists/partial"
# apt downloads as the _apt user where it exists.
chmod 0755 "$tmp" "$tmp/lists"
if id _apt >/dev/null 2>&1; then ${sudo[@]+"${sudo[@]}"} chown _apt "$tmp/lists/partial"; fi

# Debian's own entries are those whose suites are this release's
# (codename, -updates, -security, -backports); other vendors' (a
# cloud SDK, Node.js) have suites of their own and are left out.
suites_re="^(${codename}|${codename}-updates|${codename}-security|${codename}-backports)$"

# deb822 files (*.sources): keep the Debian stanzas, enabled, with
# contrib and non-free added to their components.
for f in /etc/apt/sources.list.d/*.sources; do
	[ -e "$f" ] || continue
	awk -v re="$suites_re" '
		function flush() {
			if (n > 0 && debian && enabled) {
				for (i = 1; i <= n; i++) print lines[i]
				print ""
			}
			n = 0; debian = 0; enabled = 1
		}
		BEGIN { n = 0; debian = 0; enabled = 1 }
		/^[[:space:]]*$/ { flush(); next }
		{
			line = $0
			if (line ~ /^Suites:/) {
				split(substr(line, 8), s, /[[:space:]]+/)
				debian = 1
				for (i in s) if (s[i] != "" && s[i] !~ re) debian = 0
			}
			if (line ~ /^Enabled:[[:space:]]*no/) enabled = 0
			if (line ~ /^Components:/) {
				if (line !~ /[[:space:]]contrib([[:space:]]|$)/) line = line " contrib"
				if (line !~ /[[:space:]]non-free([[:space:]]|$)/) line = line " non-free"
			}
			lines[++n] = line
		}
		END { flush() }
	' "$f" >"$tmp/sources/$(basename "$f")"
done

# One-line files (sources.list and *.list): keep the Debian lines, with
# contrib and non-free added.
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
	[ -e "$f" ] || continue
	awk -v re="$suites_re" '
		/^[[:space:]]*deb[[:space:]]/ {
			i = 2
			if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
			suite = $(i + 1)
			if (suite !~ re) next
			line = $0
			if (line !~ /[[:space:]]contrib([[:space:]]|$)/) line = line " contrib"
			if (line !~ /[[:space:]]non-free([[:space:]]|$)/) line = line " non-free"
			print line
		}
	' "$f" >"$tmp/sources/$(basename "$f" .list)-oneline.list"
done

if ! grep -qs . "$tmp"/sources/*; then
	echo "$name: found no Debian ${codename} entries in the apt sources" >&2
	exit 1
fi

echo "$name: installing ${packages[*]} (with contrib and non-free from a temporary sources directory)"
apt_opts=(
	-o Dir::Etc::SourceList=/dev/null
	-o Dir::Etc::SourceParts="$tmp/sources"
	-o Dir::State::Lists="$tmp/lists"
	-o Acquire::Retries=10
	-o Acquire::http::Timeout=300
	-o DPkg::Lock::Timeout=600
)
for attempt in 1 2 3 4 5; do
	if ${sudo[@]+"${sudo[@]}"} apt-get "${apt_opts[@]}" update &&
		${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "${packages[@]}"; then
		if have_toolkit; then
			echo "$name: installed"
			exit 0
		fi
		echo "$name: apt-get succeeded but nvcc, cuda.h, libcuda.so or clang-14 is still missing" >&2
		exit 1
	fi
	echo "$name: attempt $attempt failed; trying again in $((attempt * 30))s" >&2
	sleep $((attempt * 30))
done
echo "$name: could not install ${packages[*]}" >&2
exit 1
