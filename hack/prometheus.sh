#!/usr/bin/env bash
# Find, or install, the Prometheus server the tests run (they start it themselves, scraping a
# DCGM-format exporter of their own).
#
# Lookup order:
#   1. GPUSCHED_PROMETHEUS (a path to the binary)
#   2. prometheus on PATH
#   3. Debian's package, installed with apt-get (as root)
#
# On success prints the binary's path on stdout; everything else goes to stderr.  When none can
# be had, it fails under CI=true (the tests that need it must run there) and elsewhere warns and
# succeeds (those tests then skip).
set -euo pipefail
CI="${CI:-}"

log() { printf 'prometheus: %s\n' "$*" >&2; }

if [[ -n "${GPUSCHED_PROMETHEUS:-}" ]]; then
	[[ -f "$GPUSCHED_PROMETHEUS" && -x "$GPUSCHED_PROMETHEUS" ]] || {
		log "error: GPUSCHED_PROMETHEUS=$GPUSCHED_PROMETHEUS is not an executable file"
		exit 1
	}
	printf '%s\n' "$GPUSCHED_PROMETHEUS"
	exit 0
fi
if command -v prometheus >/dev/null 2>&1; then
	command -v prometheus
	exit 0
fi

missing() {
	if [[ "${CI,,}" == "true" ]]; then
		log "error: $*"
		exit 1
	fi
	log "warning: $*; the tests that read GPU utilisation will skip"
	exit 0
}

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	missing "no prometheus on PATH: install it (sudo apt-get install prometheus) or set GPUSCHED_PROMETHEUS"
fi
log "installing Debian's prometheus package"
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends prometheus >&2; }
if ! install; then
	apt-get update -q >&2 || true
	install || missing "apt-get install prometheus failed"
fi
command -v prometheus >/dev/null 2>&1 || missing "Debian's package installed no prometheus on PATH"
command -v prometheus
