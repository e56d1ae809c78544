#!/usr/bin/env bash
# Installs the Debian packages the test-suite needs, when missing and when we may (root).
set -u
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v wrk >/dev/null 2>&1 || need+=(wrk)  # load generator of benchmarks/bench_service.py
command -v rustc >/dev/null 2>&1 || need+=(rustc)  # CPU sandbox language tests (skipped without)
# environment images (issue 17): the SWE example image is built from Debian's packages
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
# and their writable layers are ext4 file systems on the node's disk (managers/cpu/images/layers.py)
PATH="$PATH:/usr/sbin:/sbin" command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
# the sandboxes' syscall filter is built with libseccomp (through ctypes: no Python binding)
/sbin/ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 ' || need+=(libseccomp2)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: not root; missing ${need[*]} (tests that need them are skipped)" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
  || echo "system-deps: could not install ${need[*]} (tests that need them are skipped)" >&2
exit 0
