#!/usr/bin/env bash
# Baselines for benchmarks/bench_images.py (issue 17): crun and podman, Debian packages, only
# when missing and when we may (root). Not needed by the tests.
set -u
need=()
command -v crun >/dev/null 2>&1 || need+=(crun)
command -v podman >/dev/null 2>&1 || need+=(podman)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "bench-deps: not root; missing ${need[*]} (the benchmark skips those baselines)" >&2
  exit 0
fi
echo "bench-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
  || echo "bench-deps: could not install ${need[*]} (the benchmark skips those baselines)" >&2
exit 0
