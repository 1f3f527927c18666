#!/usr/bin/env bash
# Obtain real Kubernetes control-plane binaries for tests:
# kube-apiserver, etcd, kubectl and kube-scheduler.
#
# Lookup order, per binary:
#   1. TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD / TEST_ASSET_KUBECTL / TEST_ASSET_KUBE_SCHEDULER
#   2. $KUBEBUILDER_ASSETS/<name>
#   3. the build cache: ${GPUSCHED_TESTBIN_CACHE:-$HOME/.cache/gpusched/testbin}/k8s-<ver>-etcd-<ver>/
#   4. build from the Go module proxy into that cache directory
#
# On success prints one line on stdout: a directory holding all four binaries, suitable
# for `export KUBEBUILDER_ASSETS=...`. Everything else goes to stderr.
#
# Environment:
#   GPUSCHED_K8S_VERSION    Kubernetes version (default v1.34.4)
#   GPUSCHED_ETCD_VERSION   etcd version (default v3.6.16)
#   GPUSCHED_TESTBIN_CACHE  cache root (default $HOME/.cache/gpusched/testbin)
#   GO                      go command to use (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

K8S_VERSION="${GPUSCHED_K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${GPUSCHED_ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${GPUSCHED_TESTBIN_CACHE:-${HOME}/.cache/gpusched/testbin}"
CACHE_DIR="${CACHE_ROOT}/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"

NAMES=(kube-apiserver etcd kubectl kube-scheduler)
K8S_NAMES=(kube-apiserver kubectl kube-scheduler)

log() { printf 'testbin: %s\n' "$*" >&2; }
die() {
	printf 'testbin: error: %s\n' "$*" >&2
	exit 1
}

# env var name for a binary: kube-apiserver -> TEST_ASSET_KUBE_APISERVER
env_var_for() {
	local n="${1^^}"
	printf 'TEST_ASSET_%s' "${n//-/_}"
}

declare -A FOUND=()

# Resolve every binary that can be found without building. Sets FOUND[name]=path.
resolve() {
	local name var val
	for name in "${NAMES[@]}"; do
		[[ -n "${FOUND[$name]:-}" ]] && continue
		var="$(env_var_for "$name")"
		val="${!var:-}"
		if [[ -n "$val" ]]; then
			[[ -f "$val" && -x "$val" ]] || die "${var}=${val} is not an executable file"
			FOUND[$name]="$val"
			continue
		fi
		if [[ -n "${KUBEBUILDER_ASSETS:-}" && -f "${KUBEBUILDER_ASSETS}/${name}" && -x "${KUBEBUILDER_ASSETS}/${name}" ]]; then
			FOUND[$name]="${KUBEBUILDER_ASSETS}/${name}"
			continue
		fi
		if [[ -f "${CACHE_DIR}/${name}" && -x "${CACHE_DIR}/${name}" ]]; then
			FOUND[$name]="${CACHE_DIR}/${name}"
		fi
	done
}

missing() {
	local name
	for name in "$@"; do
		[[ -n "${FOUND[$name]:-}" ]] || return 0
	done
	return 1
}

find_go() {
	if [[ -n "${GO:-}" ]]; then
		command -v "$GO" >/dev/null 2>&1 || die "GO=${GO} not found"
		return
	fi
	if command -v go >/dev/null 2>&1; then
		GO=go
	elif [[ -x /usr/local/go/bin/go ]]; then
		GO=/usr/local/go/bin/go
	else
		die "no Go toolchain found (set GO=/path/to/go)"
	fi
}

# gorun DIR ARGS...: run go in DIR at the lowest CPU priority. It runs as a background
# job that the script waits on, so an INT/TERM trap fires at once and can stop it.
CHILD=""
gorun() {
	local dir="$1" rc=0
	shift
	nice -n 19 "$GO" -C "$dir" "$@" &
	CHILD=$!
	wait "$CHILD" || rc=$?
	CHILD=""
	return "$rc"
}

# Move freshly built binaries from $1 into the cache dir, one atomic rename each.
install_into_cache() {
	local src="$1" name
	shift
	mkdir -p "$CACHE_DIR"
	for name in "$@"; do
		# Same filesystem (the scratch dir lives under CACHE_ROOT), so mv is a rename.
		mv -f "${src}/${name}" "${CACHE_DIR}/${name}"
		FOUND[$name]="${CACHE_DIR}/${name}"
	done
}

build_k8s() {
	local mod="${1}/k8s" out="${1}/k8s-out"
	local staging_version="v0.${K8S_VERSION#v1.}"
	local minor="${K8S_VERSION#v1.}"
	minor="${minor%%.*}"
	[[ "$K8S_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "GPUSCHED_K8S_VERSION=${K8S_VERSION}: expected v1.<minor>.<patch>"

	log "building kube-apiserver, kubectl, kube-scheduler ${K8S_VERSION} (staging modules ${staging_version})"
	mkdir -p "$mod" "$out"

	local upstream_mod
	gorun "$mod" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" >"${1}/k8s-download.json" ||
		die "cannot download k8s.io/kubernetes@${K8S_VERSION} from the module proxy: $(cat "${1}/k8s-download.json")"
	upstream_mod="$(sed -n 's/^[[:space:]]*"GoMod":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p' "${1}/k8s-download.json")"
	[[ -n "$upstream_mod" && -f "$upstream_mod" ]] || die "no go.mod for k8s.io/kubernetes@${K8S_VERSION}"

	local go_line staging
	go_line="$(awk '$1 == "go" { print $2; exit }' "$upstream_mod")"
	staging="$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$upstream_mod")"
	[[ -n "$go_line" ]] || die "no go directive in ${upstream_mod}"
	[[ -n "$staging" ]] || die "no staging replace directives in ${upstream_mod}"
	log "$(wc -l <<<"$staging" | tr -d ' ') staging modules, go ${go_line}"

	{
		printf 'module gpusched.local/testbin/k8s\n\ngo %s\n\n' "$go_line"
		# Keep upstream's GODEBUG defaults (they apply from the main module only).
		grep -E '^godebug[[:space:]]' "$upstream_mod" || true
		printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$K8S_VERSION"
		local m
		while IFS= read -r m; do
			printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"
		done <<<"$staging"
		printf ')\n'
	} >"${mod}/go.mod"
	cat >"${mod}/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF

	log "go mod tidy (k8s)"
	gorun "$mod" mod tidy || die "go mod tidy failed for the Kubernetes scratch module"

	local ldflags="-s -w" pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
		ldflags+=" -X ${pkg}.gitMajor=1"
		ldflags+=" -X ${pkg}.gitMinor=${minor}"
		ldflags+=" -X ${pkg}.gitTreeState=clean"
	done

	log "go build (k8s); this takes a while on a cold cache"
	CGO_ENABLED=0 gorun "$mod" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "${out}/" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl || die "go build failed for Kubernetes ${K8S_VERSION}"

	local v
	v="$("${out}/kube-apiserver" --version 2>&1)" || die "built kube-apiserver does not run: ${v}"
	[[ "$v" == *"${K8S_VERSION}"* ]] || die "built kube-apiserver reports '${v}', expected ${K8S_VERSION}"
	v="$("${out}/kube-scheduler" --version 2>&1)" || die "built kube-scheduler does not run: ${v}"
	[[ "$v" == *"${K8S_VERSION}"* ]] || die "built kube-scheduler reports '${v}', expected ${K8S_VERSION}"
	v="$("${out}/kubectl" version --client 2>&1)" || die "built kubectl does not run: ${v}"
	[[ "$v" == *"${K8S_VERSION}"* ]] || die "built kubectl reports '${v}', expected ${K8S_VERSION}"

	install_into_cache "$out" "${K8S_NAMES[@]}"
	log "installed kube-apiserver, kubectl, kube-scheduler into ${CACHE_DIR}"
}

build_etcd() {
	local mod="${1}/etcd" out="${1}/etcd-out"
	log "building etcd ${ETCD_VERSION}"
	mkdir -p "$mod" "$out"
	# A module of its own, so etcd's gRPC/otel versions do not fight Kubernetes'.
	printf 'module gpusched.local/testbin/etcd\n\ngo 1.24\n' >"${mod}/go.mod"
	cat >"${mod}/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
EOF
	gorun "$mod" get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" ||
		die "go get go.etcd.io/etcd/server/v3@${ETCD_VERSION} failed"
	gorun "$mod" mod tidy || die "go mod tidy failed for the etcd scratch module"
	CGO_ENABLED=0 gorun "$mod" build -trimpath -buildvcs=false -ldflags "-s -w" -o "${out}/etcd" \
		go.etcd.io/etcd/server/v3 || die "go build failed for etcd ${ETCD_VERSION}"

	local v
	v="$("${out}/etcd" --version 2>&1)" || die "built etcd does not run: ${v}"
	[[ "$v" == *"etcd Version: ${ETCD_VERSION#v}"* ]] || die "built etcd reports '${v}', expected ${ETCD_VERSION}"

	install_into_cache "$out" etcd
	log "installed etcd into ${CACHE_DIR}"
}

SCRATCH=""
cleanup() {
	if [[ -n "$SCRATCH" && -d "$SCRATCH" ]]; then
		chmod -R u+w "$SCRATCH" 2>/dev/null || true
		rm -rf "$SCRATCH"
	fi
}

on_signal() {
	if [[ -n "$CHILD" ]]; then
		kill -TERM "$CHILD" 2>/dev/null || true
		wait "$CHILD" 2>/dev/null || true
	fi
	log "interrupted; nothing was installed from the unfinished step"
	exit "$1"
}

build_missing() {
	mkdir -p "$CACHE_ROOT"
	# One build at a time per cache root; a second caller waits, then finds the binaries.
	local lock="${CACHE_ROOT}/.build.lock"
	exec 9>"$lock"
	if ! flock -n 9; then
		log "another build is running (lock ${lock}); waiting"
		flock 9
	fi
	resolve
	missing "${NAMES[@]}" || return 0

	find_go
	log "using $("$GO" version)"
	# Holding the lock: any scratch dir left here belongs to an interrupted build.
	local stale
	for stale in "${CACHE_ROOT}"/.build.*/; do
		[[ -d "$stale" ]] || continue
		log "removing stale scratch dir ${stale}"
		chmod -R u+w "$stale" 2>/dev/null || true
		rm -rf "$stale"
	done
	SCRATCH="$(mktemp -d "${CACHE_ROOT}/.build.XXXXXX")"
	trap cleanup EXIT
	trap 'on_signal 130' INT
	trap 'on_signal 143' TERM

	local start=$SECONDS
	if missing "${K8S_NAMES[@]}"; then
		build_k8s "$SCRATCH"
	fi
	if missing etcd; then
		build_etcd "$SCRATCH"
	fi
	log "build finished in $((SECONDS - start))s"
	cleanup
	SCRATCH=""
}

# Print a single directory holding all four binaries.
emit_dir() {
	local name dir="" same=1
	for name in "${NAMES[@]}"; do
		local p="${FOUND[$name]}"
		if [[ "${p##*/}" != "$name" ]]; then
			same=0
			break
		fi
		if [[ -z "$dir" ]]; then
			dir="${p%/*}"
		elif [[ "${p%/*}" != "$dir" ]]; then
			same=0
			break
		fi
	done
	if ((same)); then
		printf '%s\n' "$dir"
		return
	fi

	# Mixed sources: a directory of symlinks keyed by the exact set of targets.
	local abs=() key links
	for name in "${NAMES[@]}"; do
		abs+=("$(realpath -s "${FOUND[$name]}")")
	done
	key="$(printf '%s\n' "${abs[@]}" | sha256sum | cut -c1-16)"
	links="${CACHE_ROOT}/assets-${key}"
	if [[ ! -d "$links" ]]; then
		mkdir -p "$CACHE_ROOT"
		local tmp i
		tmp="$(mktemp -d "${CACHE_ROOT}/.assets.XXXXXX")"
		chmod 0755 "$tmp"
		for i in "${!NAMES[@]}"; do
			ln -s "${abs[$i]}" "${tmp}/${NAMES[$i]}"
		done
		# Atomic publish; if another caller won the race, keep theirs.
		if ! mv -T "$tmp" "$links" 2>/dev/null; then
			rm -rf "$tmp"
		fi
	fi
	printf '%s\n' "$links"
}

main() {
	resolve
	if missing "${NAMES[@]}"; then
		build_missing
		resolve
		missing "${NAMES[@]}" && die "binaries still missing after build"
	fi
	emit_dir
}

main "$@"
