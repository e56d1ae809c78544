#!/usr/bin/env bash
# Baselines for benchmarks/bench_images.py (issue 17): crun and podman; wrk, the load generator
# of bench_service.py and bench_starvation.py; valgrind, the counter of core_instructions.py;
# Debian packages, only when missing and when we may (root). Not needed by the tests.
set -u
need=()
command -v crun >/dev/null 2>&1 || need+=(crun)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v wrk >/dev/null 2>&1 || need+=(wrk)  # bench_service.py, bench_starvation.py: the load
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)  # core_instructions.py: instruction counts
if [ "$(id -u)" != 0 ]; then
  [ ${#need[@]} -eq 0 ] || echo "bench-deps: not root; missing ${need[*]} (the benchmark skips those baselines)" >&2
  exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "bench-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || echo "bench-deps: could not install ${need[*]} (the benchmark skips those baselines)" >&2
fi
# crun refuses a hybrid cgroup layout whose v2 hierarchy still holds a controller ("cgroups in
# hybrid mode not supported, drop all controllers from cgroupv2"): on these VMs that is hugetlb,
# bound to no v1 hierarchy. Give it its own v1 hierarchy, as a legacy systemd layout does (no
# cgroup uses it; the project's own sandboxes need only cpu, memory, pids, freezer).
v2=/sys/fs/cgroup/unified/cgroup.controllers
if [ -f "$v2" ] && [ -n "$(cat "$v2")" ]; then
  for c in $(cat "$v2"); do
    if mkdir -p "/sys/fs/cgroup/$c" && mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"; then
      echo "bench-deps: cgroup v1 hierarchy for $c (crun refuses it on the v2 side)"
    else
      echo "bench-deps: could not bind $c to a v1 hierarchy (crun will refuse this layout)" >&2
    fi
  done
fi
exit 0
