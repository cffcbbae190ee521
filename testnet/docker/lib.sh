# shellcheck shell=bash
# Shared by testnet/{up,down,status,chaos,e2e}.sh: names, paths, image
# building and container lookup for the container testnet. Sourcing it only
# defines TN_* variables and tn_* functions.
#
# Images (all built here, nothing pulled; a registry is never contacted):
#   holopeer-testnet/base:bookworm-<hash>  Debian minbase from debootstrap,
#                                          brought in with `docker import`;
#                                          kept between runs (the cache)
#   holopeer-testnet/node:run              FROM scratch + static holopeer
#   holopeer-testnet/lan:run               base + holopeer + lan-node.sh
#   holopeer-testnet/router:run            base + router.sh
# down.sh removes the three :run images and keeps the base.

TN_PROJECT=holopeer-testnet
TN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TN_DIR=$TN_ROOT/testnet/docker
TN_CACHE=$TN_ROOT/testnet/.cache
TN_RUN=$TN_CACHE/run
TN_BUILD=$TN_CACHE/build
TN_COMPOSE_FILE=$TN_DIR/compose.yaml
TN_ENV_FILE=$TN_RUN/compose.env
TN_LABEL=org.holopeer.testnet
TN_SWARM=${TN_SWARM:-testnet}

# The base rootfs. Change TN_BASE_PACKAGES (or bump TN_BASE_REV when the way
# the rootfs is trimmed changes) and the cache tag changes with it.
TN_SUITE=bookworm
TN_MIRROR=${TN_MIRROR:-http://deb.debian.org/debian}
TN_BASE_PACKAGES=iproute2,nftables,iptables,procps,iputils-ping
TN_BASE_REV=1

TN_NODE_IMAGE=$TN_PROJECT/node:run
TN_LAN_IMAGE=$TN_PROJECT/lan:run
TN_ROUTER_IMAGE=$TN_PROJECT/router:run

# The scaled services and where they sit.
TN_SCALED_SERVICES="pub stage-a stage-b stage-c"

# Legacy builder: it needs nothing but the engine (no buildx plugin) and
# leaves no build cache behind once the images are removed.
export DOCKER_BUILDKIT=0

# tn_usage SCRIPT: print the comment block at the top of SCRIPT.
tn_usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$1"; }

tn_log() { printf '[testnet %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
tn_die() {
	tn_log "error: $*"
	exit 1
}

# tn_docker_ok: true when a Docker engine answers.
tn_docker_ok() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

# tn_compose ARGS...: docker compose (v2 plugin) or docker-compose (v1), on
# our project and file.
tn_compose() {
	[ -f "$TN_ENV_FILE" ] || { mkdir -p "$TN_RUN" && : >"$TN_ENV_FILE"; }
	if [ -z "${TN_COMPOSE_CMD:-}" ]; then
		if docker compose version >/dev/null 2>&1; then
			TN_COMPOSE_CMD="docker compose"
		elif command -v docker-compose >/dev/null 2>&1; then
			TN_COMPOSE_CMD="docker-compose"
		else
			tn_die "neither 'docker compose' nor 'docker-compose' is installed"
		fi
	fi
	# shellcheck disable=SC2086 # TN_COMPOSE_CMD is one or two words
	$TN_COMPOSE_CMD -p "$TN_PROJECT" -f "$TN_COMPOSE_FILE" --env-file "$TN_ENV_FILE" "$@"
}

# tn_env_set KEY VALUE: record a compose variable for this run.
tn_env_set() {
	mkdir -p "$TN_RUN"
	touch "$TN_ENV_FILE"
	grep -v "^$1=" "$TN_ENV_FILE" >"$TN_ENV_FILE.tmp" || true
	printf '%s=%s\n' "$1" "$2" >>"$TN_ENV_FILE.tmp"
	mv "$TN_ENV_FILE.tmp" "$TN_ENV_FILE"
}

tn_env_get() { sed -n "s/^$1=//p" "$TN_ENV_FILE" 2>/dev/null | tail -n1; }

# ---------------------------------------------------------------- images

# tn_build_binary: the static holopeer for the engine's architecture, in
# $TN_BUILD/holopeer. HOLOPEER_BIN=/path uses a binary built elsewhere.
tn_build_binary() {
	mkdir -p "$TN_BUILD"
	local out=$TN_BUILD/holopeer arch
	if [ -n "${HOLOPEER_BIN:-}" ]; then
		[ -x "$HOLOPEER_BIN" ] || tn_die "HOLOPEER_BIN=$HOLOPEER_BIN is not an executable"
		cp "$HOLOPEER_BIN" "$out"
		tn_log "using HOLOPEER_BIN=$HOLOPEER_BIN"
	else
		command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || tn_die "Go is needed to build holopeer (or set HOLOPEER_BIN to a static linux binary)"
		command -v go >/dev/null || PATH=/usr/local/go/bin:$PATH
		arch=$(docker version --format '{{.Server.Arch}}' 2>/dev/null || echo amd64)
		tn_log "building holopeer (CGO_ENABLED=0 GOOS=linux GOARCH=$arch)"
		(cd "$TN_ROOT" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w" -o "$out" ./cmd/holopeer) ||
			tn_die "go build ./cmd/holopeer failed (set HOLOPEER_BIN to use a binary built elsewhere)"
	fi
	if command -v readelf >/dev/null && readelf -l "$out" 2>/dev/null | grep -q 'program interpreter'; then
		tn_die "$out is dynamically linked; a FROM scratch image needs a static binary (CGO_ENABLED=0)"
	fi
}

tn_base_tag() {
	local h
	h=$(printf '%s\n' "$TN_SUITE" minbase "$TN_BASE_PACKAGES" "$TN_BASE_REV" | sha256sum | cut -c1-12)
	echo "$TN_PROJECT/base:$TN_SUITE-$h"
}

# tn_umount_under DIR: unmount whatever debootstrap left mounted below DIR
# (an interrupted run leaves proc and sys there), deepest first.
tn_umount_under() {
	local d=$1 m
	[ -d "$d" ] || return 0
	d=$(cd "$d" && pwd -P)
	awk -v d="$d/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done
}

# tn_base_image: make sure the cached Debian base image exists; print its tag.
tn_base_image() {
	local tag rootfs sudo=""
	tag=$(tn_base_tag)
	if docker image inspect "$tag" >/dev/null 2>&1; then
		tn_log "base image $tag is cached"
		echo "$tag"
		return 0
	fi
	if [ "$(id -u)" != 0 ]; then
		sudo -n true 2>/dev/null || tn_die "building the base image runs debootstrap, which needs root (or password-less sudo)"
		sudo="sudo -n"
	fi
	if ! command -v debootstrap >/dev/null; then
		if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
			tn_log "installing debootstrap"
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
				{ apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
				tn_die "could not install debootstrap"
		else
			tn_die "debootstrap is not installed (apt-get install debootstrap)"
		fi
	fi
	rootfs=$TN_CACHE/rootfs.tmp
	tn_umount_under "$rootfs"
	$sudo rm -rf "$rootfs"
	mkdir -p "$TN_CACHE"
	tn_log "building base image $tag: debootstrap $TN_SUITE from $TN_MIRROR (log: $TN_CACHE/debootstrap.log)"
	if ! $sudo debootstrap --variant=minbase --include="$TN_BASE_PACKAGES" "$TN_SUITE" "$rootfs" "$TN_MIRROR" >"$TN_CACHE/debootstrap.log" 2>&1; then
		tail -n 20 "$TN_CACHE/debootstrap.log" >&2
		tn_umount_under "$rootfs"
		$sudo rm -rf "$rootfs"
		tn_die "debootstrap failed (is $TN_MIRROR reachable?)"
	fi
	tn_umount_under "$rootfs"
	# Trim what a router never reads: downloaded packages, indexes, docs.
	$sudo rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
		"$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
	$sudo tar -C "$rootfs" -c . | docker import \
		--change "LABEL $TN_LABEL.image=base" \
		--change 'CMD ["/bin/bash"]' \
		--message "holopeer testnet base: debootstrap $TN_SUITE minbase + $TN_BASE_PACKAGES" \
		- "$tag" >/dev/null || { $sudo rm -rf "$rootfs"; tn_die "docker import failed"; }
	$sudo rm -rf "$rootfs"
	tn_log "base image $tag imported"
	echo "$tag"
}

# tn_build_image TAG CONTEXT [BUILD-ARGS...]: build with the legacy builder;
# drop the image TAG named before, so no untagged layers pile up.
tn_build_image() {
	local tag=$1 ctx=$2 old new
	shift 2
	old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
	if ! docker build -q --label "$TN_LABEL=1" -t "$tag" "$@" "$ctx" >"$TN_CACHE/build.log" 2>&1; then
		cat "$TN_CACHE/build.log" >&2
		tn_die "docker build $tag failed"
	fi
	new=$(docker image inspect --format '{{.Id}}' "$tag")
	if [ -n "$old" ] && [ "$old" != "$new" ]; then
		docker rmi "$old" >/dev/null 2>&1 || true
	fi
}

# tn_build_images: binary, base and the three :run images.
tn_build_images() {
	local base ctx
	if [ "${TN_NO_BUILD:-0}" = 1 ] && [ -x "$TN_BUILD/holopeer" ]; then
		tn_log "TN_NO_BUILD=1: reusing $TN_BUILD/holopeer"
	else
		tn_build_binary
	fi
	base=$(tn_base_image)

	ctx=$TN_BUILD/ctx-node
	rm -rf "$ctx" && mkdir -p "$ctx/rootfs/data" "$ctx/rootfs/tmp"
	chmod 1777 "$ctx/rootfs/tmp"
	cp "$TN_BUILD/holopeer" "$ctx/rootfs/holopeer"
	cp "$TN_DIR/node/Dockerfile" "$ctx/"
	tn_build_image "$TN_NODE_IMAGE" "$ctx"

	ctx=$TN_BUILD/ctx-lan
	rm -rf "$ctx" && mkdir -p "$ctx"
	cp "$TN_BUILD/holopeer" "$TN_DIR/lan/Dockerfile" "$TN_DIR/lan/lan-node.sh" "$ctx/"
	chmod 755 "$ctx/lan-node.sh"
	tn_build_image "$TN_LAN_IMAGE" "$ctx" --build-arg "BASE=$base"

	ctx=$TN_BUILD/ctx-router
	rm -rf "$ctx" && mkdir -p "$ctx"
	cp "$TN_DIR/router/Dockerfile" "$TN_DIR/router/router.sh" "$ctx/"
	chmod 755 "$ctx/router.sh"
	tn_build_image "$TN_ROUTER_IMAGE" "$ctx" --build-arg "BASE=$base"
	rm -rf "$TN_BUILD"/ctx-*
	tn_log "images ready: $TN_NODE_IMAGE $TN_LAN_IMAGE $TN_ROUTER_IMAGE (base $base)"
}

# ---------------------------------------------------- what the binary can do

# tn_detect_features: record which flags and commands this holopeer has, so
# the testnet switches on NAT traversal, elections and jobs as they land.
# Written to $TN_RUN/features as "COMMAND FLAG TYPE" lines (TYPE "bool" for
# flags without a value) and "COMMAND -" for each command that exists.
tn_detect_features() {
	local cmd out
	: >"$TN_RUN/features"
	for cmd in up run status; do
		if out=$(docker run --rm --network none "$TN_NODE_IMAGE" "$cmd" --help 2>&1) &&
			grep -q "holopeer $cmd" <<<"$out"; then
			echo "$cmd -" >>"$TN_RUN/features"
			awk -v c="$cmd" '
				/^Flags:/ { on = 1; next }
				/^Global Flags:/ { on = 1; next }
				/^[A-Z]/ { on = 0 }
				on && match($0, /--[a-z0-9-]+/) {
					name = substr($0, RSTART + 2, RLENGTH - 2)
					rest = substr($0, RSTART + RLENGTH)
					type = "bool"
					if (rest ~ /^ [a-zA-Z]/) { split(substr(rest, 2), w, " "); type = w[1] }
					print c, name, type
				}' <<<"$out" >>"$TN_RUN/features"
		fi
	done
}

# tn_has COMMAND [FLAG]: does the binary have this command (and flag)?
tn_has() {
	if [ $# -eq 1 ]; then
		grep -q "^$1 -$" "$TN_RUN/features" 2>/dev/null
	else
		grep -q "^$1 $2 " "$TN_RUN/features" 2>/dev/null
	fi
}

tn_flag_type() { awk -v c="$1" -v f="$2" '$1 == c && $2 == f { print $3; exit }' "$TN_RUN/features" 2>/dev/null; }

# tn_flags_for_features RELAYS: the flags each kind of node gets, from what
# the binary supports. This is the one place to adjust when a colleague's
# flag lands with a different meaning than expected.
#   TN_BOOT_FLAGS       bootstrap nodes: public by fiat (they are the
#                       testnet's infrastructure) and relays for NATed peers
#   TN_CANDIDATE_FLAGS  nodes that may become coordinator (sim TEE, testnets only)
#   TN_VOTER_FLAGS      the researcher's node: never stands, but accepts a
#                       sim-attested coordinator like everyone else
#   TN_HOME_FLAGS       nodes behind a home router: reserve slots on the
#                       bootstraps' relays (RELAYS), find out the rest alone
#   TN_EXTRA_FLAGS      every node (TN_EXTRA_FLAGS from the caller's environment)
tn_flags_for_features() {
	local boot="" cand="" voter="" home="" relays=$1
	if tn_has up reachability; then
		boot="--reachability public"
	fi
	if tn_has up relay; then
		case $(tn_flag_type up relay) in
		bool) boot="$boot --relay" ;;
		*) boot="$boot --relay=service" ;;
		esac
	fi
	if tn_has up tee && tn_has up allow-sim; then
		cand="--tee sim --allow-sim"
		voter="--allow-sim"
	fi
	if tn_has up relay-addr && [ -n "$relays" ]; then
		home="--relay-addr $relays"
	fi
	tn_env_set TN_BOOT_FLAGS "${boot# }"
	tn_env_set TN_CANDIDATE_FLAGS "$cand"
	tn_env_set TN_VOTER_FLAGS "$voter"
	tn_env_set TN_HOME_FLAGS "$home"
	tn_env_set TN_EXTRA_FLAGS "${TN_EXTRA_FLAGS:-}"
}

# ------------------------------------------------------------- containers

# tn_containers [ALL]: one line per testnet container, "NAME ID SERVICE
# ROLE SITE NAT STATE". NAME is the service name for single services and
# SERVICE-N for scaled ones (pub-1, stage-a-1, ...).
tn_containers() {
	local all=()
	[ "${1:-}" = all ] && all=(-a)
	docker ps "${all[@]}" --filter "label=com.docker.compose.project=$TN_PROJECT" --format \
		'{{.ID}}|{{.Label "com.docker.compose.service"}}|{{.Label "com.docker.compose.container-number"}}|{{.Label "org.holopeer.testnet.role"}}|{{.Label "org.holopeer.testnet.site"}}|{{.Label "org.holopeer.testnet.nat"}}|{{.State}}' |
		while IFS='|' read -r id svc num role site nat state; do
			local name=$svc
			case " $TN_SCALED_SERVICES " in *" $svc "*) name=$svc-$num ;; esac
			[ -n "$nat" ] || nat=none
			[ -n "$role" ] || role=unknown
			[ -n "$site" ] || site=unknown
			[ -n "$state" ] || state=unknown
			echo "$name $id $svc $role $site $nat $state"
		done | sort
}

# tn_cid NAME: the container id of a testnet node or router by name.
tn_cid() {
	local id
	id=$(tn_containers all | awk -v n="$1" '$1 == n { print $2; exit }')
	[ -n "$id" ] || return 1
	echo "$id"
}

# tn_node_names: names of holopeer nodes (not routers), running or not.
tn_node_names() { tn_containers all | awk '$4 != "router" { print $1 }'; }

# tn_status_json NAME: `holopeer status --json` as NAME sees it.
tn_status_json() {
	local id
	id=$(tn_cid "$1") || return 1
	timeout 15 docker exec "$id" /holopeer status --json 2>/dev/null
}

# tn_peer_id NAME: NAME's peer id (remembered in $TN_RUN/peers once seen, so
# names resolve while a node is down).
tn_peer_id() {
	local id
	id=$(awk -v n="$1" '$1 == n { print $2; exit }' "$TN_RUN/peers" 2>/dev/null)
	if [ -z "$id" ]; then
		id=$(tn_status_json "$1" | sed -n 's/^  "peer_id": "\(.*\)",$/\1/p' | head -n1)
		[ -n "$id" ] || return 1
		echo "$1 $id" >>"$TN_RUN/peers"
	fi
	echo "$id"
}

# tn_wait_healthy NAME SECONDS
tn_wait_healthy() {
	local name=$1 deadline=$((SECONDS + $2)) id st
	id=$(tn_cid "$name") || tn_die "no container $name"
	while :; do
		st=$(docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id" 2>/dev/null || echo gone)
		case $st in
		healthy | running) return 0 ;;
		exited | dead | gone)
			docker logs --tail 30 "$id" >&2 2>&1 || true
			tn_die "$name stopped ($st) while starting"
			;;
		esac
		[ $SECONDS -lt $deadline ] || { docker logs --tail 30 "$id" >&2 2>&1 || true; tn_die "$name not healthy after $2 s ($st)"; }
		sleep 1
	done
}

# tn_leftovers: print every container, network and non-base image of the
# testnet that still exists (nothing when the machine is clean).
tn_leftovers() {
	docker ps -a --filter "label=com.docker.compose.project=$TN_PROJECT" --format 'container {{.Names}}'
	docker ps -a --filter "label=$TN_LABEL" --format 'container {{.Names}}'
	docker network ls --filter "label=com.docker.compose.project=$TN_PROJECT" --format 'network {{.Name}}'
	docker network ls --filter "label=$TN_LABEL" --format 'network {{.Name}}'
	local base_ids
	base_ids=$(docker images -q --no-trunc --filter "reference=$TN_PROJECT/base" | sort -u)
	{
		docker images -a -q --no-trunc --filter "label=$TN_LABEL.image"
		docker images -a -q --no-trunc --filter "label=$TN_LABEL"
		docker images -q --no-trunc --filter "reference=$TN_PROJECT/*"
	} | sort -u | while read -r id; do
		grep -qx "$id" <<<"$base_ids" && continue
		echo "image $(docker image inspect --format '{{join .RepoTags ","}}' "$id" 2>/dev/null) $id"
	done
}
