#!/usr/bin/env bash
# Installs the Debian rabbitmq-server package, for the tests of this module,
# without starting the system broker. Idempotent: does nothing when the broker's
# binaries are already there. Needs root (or sudo) and apt.
#
# The package's install step would start a broker on 0.0.0.0:5672 (and epmd on
# 0.0.0.0:4369). A /usr/sbin/policy-rc.d that exits 101, present during the
# install, prevents that; the tests start their own node on 127.0.0.1 only.
set -euo pipefail

if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ -x /usr/lib/rabbitmq/bin/rabbitmqctl ]; then
	echo "rabbitmq-server is already installed: $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo unknown version)"
	exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	SUDO="sudo"
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
	if [ "$created_policy" -eq 1 ]; then
		$SUDO rm -f "$policy"
	fi
}
trap cleanup EXIT

if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\n# Temporary: keeps apt from starting services (amqp/install-rabbitmq.sh).\nexit 101\n' |
		$SUDO tee "$policy" >/dev/null
	$SUDO chmod 0755 "$policy"
	created_policy=1
elif ! grep -q 'exit 101' "$policy"; then
	echo "install-rabbitmq.sh: $policy exists and does not exit 101; refusing to install (the broker would start on 0.0.0.0)" >&2
	exit 1
fi

$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server

# Should a broker or epmd have started anyway, say so rather than kill what
# this script cannot be sure it started.
if command -v ss >/dev/null && ss -ltn | grep -qE '0\.0\.0\.0:(5672|4369)|\[::\]:(5672|4369)'; then
	echo "install-rabbitmq.sh: warning: something listens on 5672/4369 on all interfaces; stop the system broker" >&2
fi
echo "rabbitmq-server installed: $(dpkg-query -W -f='${Version}' rabbitmq-server)"
