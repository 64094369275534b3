#!/usr/bin/env bash
# Installs Debian's chromium, which the admin package's browser test drives
# headless (TestBrowser). Idempotent: does nothing when chromium is already on
# PATH. Needs root (or sudo) and Debian's package archive.
#
#	bash admin/install-chromium.sh
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
	echo "chromium already installed: $(command -v chromium)"
	exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg run (up to 10 minutes) rather than fail on its lock.
APT=(apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)

# Update the package lists when they are missing or older than a day, or when
# apt does not know chromium yet.
lists=/var/lib/apt/lists
if [ -z "$(find "$lists" -maxdepth 1 -name '*_Packages*' -mtime -1 2>/dev/null | head -n1)" ] ||
	! apt-cache show chromium >/dev/null 2>&1; then
	$SUDO "${APT[@]}" update
fi
$SUDO "${APT[@]}" install -y --no-install-recommends chromium
echo "chromium installed: $(command -v chromium) ($(chromium --version 2>/dev/null || echo 'version unknown'))"
