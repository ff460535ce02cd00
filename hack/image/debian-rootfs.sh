# Sourced by hack/image/base.sh and hack/kind/node-image.sh: one way to make a
# Debian minbase root filesystem tarball with mmdebstrap, from the mirrors this
# machine's apt uses (hack/image/apt-sources.py).
#
#   debian_rootfs SUITE PACKAGES TARBALL LOG MIRROR...
#
# PACKAGES is mmdebstrap's comma-separated --include list. No docs, man pages
# or locales (dpkg path excludes, kept for later installs), merged /usr, no
# recommends, apt lists and caches removed. The tarball appears only when
# complete (TARBALL.tmp first); on failure the log's tail goes to stderr and
# the function returns 1.
debian_rootfs() {
	local suite="$1" packages="$2" tarball="$3" log="$4"
	shift 4
	mmdebstrap --mode=root --variant=minbase --format=tar --quiet \
		--include="$packages" \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--aptopt='Acquire::Languages "none"' \
		--aptopt='APT::Install-Recommends "false"' \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-include=/usr/share/locale/locale.alias' \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log' \
		"$suite" "$tarball.tmp" "$@" >"$log" 2>&1 ||
		{
			tail -30 "$log" >&2
			rm -f "$tarball.tmp"
			return 1
		}
	mv -f "$tarball.tmp" "$tarball"
}
