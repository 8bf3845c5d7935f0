#!/usr/bin/env bash
# Builds the real control plane that tests/cluster/ runs on: kube-apiserver, KWOK, helm and
# kustomize from their Go modules (the Go module proxy serves them; no prebuilt binary can be
# downloaded here), and etcd from Debian's packages. Everything goes into a cache folder outside the
# checkout, one folder per tool and version, reused while the version is unchanged.
#
#   scripts/cluster-deps.sh          build what is missing, print the cache folder
#   TIDE_CACHE=DIR                   where (default ~/.cache/tide)
#
# Cost on 2 cores, first time: kube-apiserver about 6 min (module cache 2.4 GB, build cache 5.5 GB),
# KWOK about 2.5 min, helm about 2 min, kustomize about 1 min.
set -euo pipefail

KUBE_VERSION=1.36.3      # kube-apiserver; its 33 staging modules are served at v0.36.3
KWOK_VERSION=0.7.0
HELM_VERSION=4.3.2
KUSTOMIZE_VERSION=5.8.2
CACHE="${TIDE_CACHE:-$HOME/.cache/tide}"
mkdir -p "$CACHE"

say() { printf 'cluster-deps: %s\n' "$*" >&2; }

need_go() {
  command -v go >/dev/null || { say "error: go is not installed (Go >= 1.26 builds the control plane)"; exit 1; }
}

# Runs a build with a progress line every 15 s, so a long first build does not look hung.
with_progress() {
  local what=$1; shift
  local start=$SECONDS log
  log=$(mktemp)
  ( "$@" >"$log" 2>&1 ) &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    kill -0 "$pid" 2>/dev/null && say "building $what ... $((SECONDS - start)) s"
  done
  if ! wait "$pid"; then
    say "error: building $what failed; its last lines:"
    tail -n 30 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  say "built $what in $((SECONDS - start)) s"
}

go_install() {  # NAME VERSION PACKAGE@VERSION
  local name=$1 version=$2 package=$3 dir="$CACHE/$1-$2"
  [ -x "$dir/bin/$name" ] && return 0
  need_go
  say "building $name v$version (first time only)"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/bin"
  with_progress "$name v$version" env GOBIN="$dir.tmp/bin" CGO_ENABLED=0 go install "$package"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
}

kube_apiserver() {
  local dir="$CACHE/kube-apiserver-$KUBE_VERSION"
  [ -x "$dir/bin/kube-apiserver" ] && return 0
  need_go
  say "building kube-apiserver v$KUBE_VERSION (first time only, about 6 min on 2 cores)"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/src" "$dir.tmp/bin"
  local src="$dir.tmp/src"
  # k8s.io/kubernetes replaces its staging modules with local paths, so `go install` refuses it:
  # a wrapper module requires it and points each staging module at its published version.
  (
    cd "$src"
    go mod init tide.local/kube-apiserver >/dev/null 2>&1
    go mod edit -require="k8s.io/kubernetes@v$KUBE_VERSION"
    GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" >/dev/null
    local gomod
    gomod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$KUBE_VERSION.mod
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace="$m=$m@v0.${KUBE_VERSION#1.}"
    done
    printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n\nfunc main() {}\n' >tools.go
  )
  local ldflags="-X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=${KUBE_VERSION%%.*}"
  local minor=${KUBE_VERSION#*.}
  ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
  with_progress "kube-apiserver v$KUBE_VERSION" bash -c "cd '$src' && rm tools.go && \
    GOFLAGS=-mod=mod go get k8s.io/kubernetes/cmd/kube-apiserver@v$KUBE_VERSION >/dev/null 2>&1; \
    GOFLAGS=-mod=mod CGO_ENABLED=0 go build -ldflags '$ldflags' -o '$dir.tmp/bin/kube-apiserver' \
      k8s.io/kubernetes/cmd/kube-apiserver"
  rm -rf "$src"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
}

# The tests run /usr/bin/etcd itself (Debian's 3.4, whose flags they pass), not any etcd on PATH.
ETCD=/usr/bin/etcd
etcd_server() {
  [ -x "$ETCD" ] && return 0
  if ! command -v apt-get >/dev/null; then
    say "error: the cluster tests need $ETCD (Debian's etcd-server package) and install it only with apt-get (Debian/Ubuntu), which this machine lacks: install etcd 3.4 as $ETCD first"
    exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    say "error: the cluster tests need $ETCD; installing Debian's etcd-server package needs root: run 'sudo apt-get install etcd-server' first, or run this as root"
    exit 1
  fi
  say "installing etcd-server from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
  [ -x "$ETCD" ] || { say "error: apt-get installed etcd-server but $ETCD is still missing"; exit 1; }
  # The package starts a system etcd on the default ports; the tests run their own on free ports.
  systemctl disable --now etcd >/dev/null 2>&1 || true
}

etcd_server
kube_apiserver
go_install kwok "$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
go_install helm "$HELM_VERSION" "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
go_install kustomize "$KUSTOMIZE_VERSION" "sigs.k8s.io/kustomize/kustomize/v5@v$KUSTOMIZE_VERSION"
echo "$CACHE"
